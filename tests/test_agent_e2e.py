"""Multi-turn runs through the CLI (controller, FSDP2 worker, vLLM rollout): the tool demo learns,
an openai-client agent trains, and a failing environment costs episodes, not the run. The worker is an
object in the CLI's process (trainer.workers=in_process: no Ray, no worker processes), so the CLI runs in
the test's process too (conftest.run_cli_in_process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import Result
from conftest import run_cli_in_process

pytestmark = pytest.mark.slow


def _train(tmp_path, run_id: str, *overrides: str, exit_code: int = 0) -> Result:
    return run_cli_in_process("train", "grpo-agent-demo", *overrides, "trainer.workers=in_process",
                              "trainer.device=cpu", f"trainer.runs_dir={tmp_path}", "trainer.logger=[jsonl]",
                              "--run-id", run_id, exit_code=exit_code)


def _metrics(tmp_path, run_id: str) -> list[dict]:
    """The training steps' rows."""
    rows = [json.loads(line) for line in (tmp_path / run_id / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward/mean" in row]


def test_agent_demo_learns_to_call_the_tool_in_its_first_30_steps(tmp_path):
    """The demo's first phase, which `make test` runs: the policy learns to call the tool (reward 0.2 for a call
    and a wrong digit); reading the digit comes ~130 steps later (the whole run: the bench-marked test below).

    30 of the recipe's 400 steps (constant LR: the same trajectory), its seed 1. Measured on 2 CPU cores
    (2026-12-06): reward 0.002, 0.0, 0.003, 0.002, 0.008 in the first 5 steps, 0.197, 0.208, 0.172, 0.188, 0.234
    in the last 5; turns per episode 1.02 -> 1.91; greedy validation on the held-out split called the tool in
    0.8% of episodes before training and 95% at step 30 (mean@1 0.0 -> 0.306)."""
    _train(tmp_path, "calls", "trainer.total_steps=30", "trainer.val_freq=30")
    rows = _metrics(tmp_path, "calls")
    rewards = [row["reward/mean"] for row in rows]
    assert len(rows) == 30 and sum(rewards[:5]) / 5 < 0.01 and sum(rewards[-5:]) / 5 > 0.15, rewards
    assert rows[0]["agent/turns_mean"] < 1.1 and rows[-1]["agent/turns_mean"] > 1.8
    assert all(row["agent/env_errors"] == 0 for row in rows)
    validated = [json.loads(line) for line in (tmp_path / "calls" / "metrics.jsonl").read_text().splitlines()]
    validated = {row["step"]: row for row in validated if "val/reward/mean@1" in row}
    assert sorted(validated) == [0, 30]
    assert validated[0]["val/agent/tool_calls"] < 0.05 and validated[30]["val/agent/tool_calls"] > 0.8
    assert validated[30]["val/reward/mean@1"] > 0.2
    # The engine's log-probs of the policy's tokens, over both turns, match the trainer's.
    assert max(row["rollout/log_prob_diff"] for row in rows) < 1e-4


@pytest.mark.bench
def test_agent_demo_learns_to_call_the_tool(tmp_path):
    """From ~0 (the call is 1 of 64 tokens, then the right digit 1 of 64) to >= 0.8. In `make test-bench`: 180
    steps take 1.5-2.5 minutes on 2 cores, which `make test`'s 15 minutes do not have room for.

    180 of the recipe's 400 steps (constant LR: the same trajectory), its seed 1. Measured on 2 CPU cores
    (2026-12-05), mean reward per 10 steps: 0.27-0.29 over steps 41-120, then 0.33, 0.41, 0.61, 0.74, 0.86
    (161-170), 0.93 (171-180): the last 10 clear 0.8 with the jump 10 steps later than measured. The jump's
    step depends on the seed (recipes/grpo-agent-demo.yaml)."""
    _train(tmp_path, "demo", "trainer.total_steps=180")
    rows = _metrics(tmp_path, "demo")
    rewards = [row["reward/mean"] for row in rows]
    assert sum(rewards[:5]) / 5 < 0.1 and sum(rewards[-10:]) / 10 >= 0.8, rewards
    last = rows[-1]
    assert last["agent/turns_mean"] > 1.9 and last["agent/env_errors"] == 0
    # Validation's greedy episodes on the held-out split: before training, at step 100, 200 and the last.
    validated = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]
    validated = {row["step"]: row for row in validated if "val/reward/mean@1" in row}
    assert sorted(validated) == [0, 100, 180] and validated[0]["val/reward/mean@1"] < 0.1
    assert validated[180]["val/reward/mean@1"] >= 0.8 and validated[180]["val/agent/turns_mean"] > 1.9
    # The engine's log-probs of the policy's tokens, over both turns, match the trainer's.
    assert max(row["rollout/log_prob_diff"] for row in rows) < 1e-4


AGENT = '''
async def rollout(client, row):
    messages = [{"role": "user", "content": "secret?"}]
    reply = await client.chat.completions.create(model="policy", messages=messages)
    message = reply.choices[0].message
    if not message.tool_calls:
        return 0.0
    messages += [message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": row["ground_truth"]}]
    reply = await client.chat.completions.create(model="policy", messages=messages)
    return 1.0 if reply.choices[0].message.content == row["ground_truth"] else 0.2
'''


def test_an_openai_client_agent_trains_end_to_end(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    _train(tmp_path, "client", f"rollout.agent.loop={tmp_path}/agent.py:rollout", "rollout.agent.tools=[]",
           "trainer.total_steps=3")
    rows = _metrics(tmp_path, "client")
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(0.0 <= row["reward/mean"] <= 1.0 and row["agent/env_errors"] == 0 for row in rows)
    assert max(row["rollout/log_prob_diff"] for row in rows) < 1e-4  # trained on exactly what was served


FLAKY_ENV = '''
import time


class Flaky:
    def reset(self, row):
        self.secret = row["ground_truth"]

    def step(self, action):
        if self.secret == "3":
            raise ValueError("cannot handle three")
        if self.secret == "4":
            time.sleep(60)
        return None, float(action.strip() == self.secret), True
'''


def test_a_failing_environment_costs_episodes_then_stops_the_run_above_the_rate(tmp_path):
    (tmp_path / "env.py").write_text(FLAKY_ENV)
    env = ["rollout.agent.loop=env", f"rollout.agent.env={tmp_path}/env.py:Flaky", "rollout.agent.tools=[]",
           "rollout.agent.call_timeout_s=2", "rollout.agent.max_turns=1"]
    _train(tmp_path, "flaky", *env, "rollout.agent.max_error_rate=0.9", "trainer.total_steps=2")
    rows = _metrics(tmp_path, "flaky")
    assert len(rows) == 2 and all(row["agent/env_errors"] > 0 for row in rows)
    log = (tmp_path / "flaky" / "console.log").read_text()
    assert "ValueError: cannot handle three" in log and "TimeoutError: did not return within 2 s" in log
    assert "the environment failed on row" in log

    strict = _train(tmp_path, "strict", *env, "rollout.agent.max_error_rate=0", exit_code=2)
    assert "more than rollout.agent.max_error_rate=0 allows" in strict.stderr


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie runs nothing
    except FileNotFoundError:
        return True


def test_the_demo_trains_with_its_tool_served_by_an_mcp_server(tmp_path, monkeypatch):
    """The demo's `lookup` from tests/mcp_server_demo.py over stdio: its schema in the prompts, the policy's
    calls answered by the server (with the row it reads from the call's _meta), one server for the
    controller's schemas and the in-process worker's calls, stopped when the run ends."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("RLKIT_MCP_DEMO_LOG", str(log))  # the server writes its pid and each call there
    server = f"mcp:stdio:{sys.executable} {Path(__file__).with_name('mcp_server_demo.py')}"
    # 32 prompts x 8 samples a step: the untrained policy calls (1 token of 64) in ~4 episodes of each step.
    _train(tmp_path, "mcp", f"rollout.agent.tools=[{server}]", "data.train_batch_size=32", "trainer.total_steps=2",
           "trainer.val_before_train=false")
    rows = _metrics(tmp_path, "mcp")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["agent/env_errors"] == 0 for row in rows) and max(row["agent/turns_mean"] for row in rows) > 1
    calls = log.read_text().splitlines()
    assert sum(" lookup row " in line for line in calls) >= 2
    [pid] = {int(line.split()[0]) for line in calls}
    assert _gone(pid)


def test_a_verifiers_environment_trains_through_the_cli(tmp_path):
    """prep-data writes vf_arith's tasks; the tiny model plays the multi-turn guessing env (tests/vf_guess.py)
    for two steps; its rubric's rewards are the metrics, validation runs its episodes, inspect shows a step."""
    pytest.importorskip("verifiers.v1")
    run_cli_in_process("prep-data", "verifiers", "-o", "env=vf_arith", "-o", "test_size=1", "--out", f"{tmp_path}/d")
    guess = f"{Path(__file__).parent}/vf_guess.py:guess_env"
    _train(tmp_path, "vf", f"rollout.agent.loop=verifiers:{guess}", "rollout.agent.tools=[]",
           "data.synthetic_task=null",           f"data.train_files=[{tmp_path}/d/train.parquet]", f"data.val_files=[{tmp_path}/d/test.parquet]",
           "data.train_batch_size=2", "actor.mini_batch_size=2", "rollout.n=4", "data.max_response_length=16",
           "trainer.total_steps=2", "trainer.val_freq=2", "trainer.val_n=0", "trainer.record_rollouts=true")
    rows = _metrics(tmp_path, "vf")
    assert [row["step"] for row in rows] == [1, 2] and all(row["agent/env_errors"] == 0 for row in rows)
    for row in rows:  # the rubric's weighted sum: correct x 2.0 + brief x 0.5, each reported on its own
        rubric = 2.0 * row["verifiers/reward/correct"] + 0.5 * row["verifiers/reward/brief"]
        assert row["reward/mean"] == pytest.approx(rubric) and 1.0 <= row["verifiers/metric/guesses"] <= 2.0
    assert max(row["rollout/log_prob_diff"] for row in rows) < 1e-4
    validated = [json.loads(line) for line in (tmp_path / "vf" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in validated if "val/reward/mean@1" in row] == [0, 2]
    shown = run_cli_in_process("inspect", "vf", "--step", "1", f"--runs-dir={tmp_path}")
    assert f"step 1 of vf: samples 8, groups 2, reward_mean {rows[0]['reward/mean']:.4g}," in shown.stdout


def test_an_openenv_environment_trains_validates_and_is_inspected(tmp_path):
    """rollout.agent.loop=openenv:<env>: tests/openenv_envs.py's SayDigit in the worker's process (its server
    twin gives the same episodes: tests/test_agent_openenv.py), two GRPO steps with validation before and after,
    and the recorded step shown by `rlkit inspect`. The HF engine: the agent loop drives any engine alike, and
    this takes 24 s on 2 cores against vLLM's 61 s."""
    envs = Path(__file__).parent / "openenv_envs.py"
    _train(tmp_path, "openenv", f"rollout.agent.loop=openenv:{envs}:SayDigit", "rollout.agent.tools=[]",
           "trainer.total_steps=2", "trainer.record_rollouts=true", "rollout.name=hf")
    rows = _metrics(tmp_path, "openenv")
    assert [row["step"] for row in rows] == [1, 2]
    # Every episode gets 0.25 for its first turn, and 1 more where its second turn says the named digit.
    assert all(0.25 <= row["reward/mean"] <= 1.25 and row["agent/env_errors"] == 0 for row in rows)
    assert all(row["agent/turns_mean"] == 2 for row in rows)
    assert max(row["rollout/log_prob_diff"] for row in rows) < 1e-4
    validated = [json.loads(line) for line in (tmp_path / "openenv" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in validated if "val/reward/mean@1" in row] == [0, 2]
    shown = run_cli_in_process("inspect", "openenv", "--runs-dir", str(tmp_path)).stdout
    assert "step 2 of openenv" in shown and "digit?" in shown
