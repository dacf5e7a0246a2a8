"""An agent run validates its episodes through the CLI, and `rlkit eval` of its checkpoint gives the
run's own numbers and conversations (validation's seeds, one engine in each).

Two steps of `grpo-agent-demo` with an environment that always takes two turns, validating 6
held-out rows (greedy + 2 samples each) before training and after each step. The run's worker is an
object in the CLI's process (trainer.workers=in_process: no Ray, no worker processes), so both commands
run in the test's process (conftest.run_cli_in_process).
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli_in_process as rlkit

from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic

pytestmark = pytest.mark.slow

ENV = '''
class TwoTurns:
    """The first turn is answered "next"; the second scores 1 when it is a digit."""

    def reset(self, row):
        self.turns = 0

    def step(self, action):
        self.turns += 1
        if self.turns == 1:
            return "next", None, False
        return None, float(action.strip().isdigit()), True
'''


def test_agent_validation_runs_episodes_and_eval_reproduces_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "rlkit-cache"))  # the tiny model, built once for both commands
    (tmp_path / "env.py").write_text(ENV)
    val = write_parquet(build_synthetic(task="lookup", n_train=1, n_test=6, seed=5)["test"], tmp_path / "val.parquet")
    runs = tmp_path / "runs"
    rlkit("train", "grpo-agent-demo", "rollout.agent.loop=env", f"rollout.agent.env={tmp_path}/env.py:TwoTurns",
          "rollout.agent.tools=[]", "data.max_response_length=16", "trainer.total_steps=2", "trainer.val_freq=1",
          "trainer.val_n=2", f"data.val_files=[{val}]", "trainer.workers=in_process", "trainer.device=cpu",
          "trainer.logger=[jsonl]", f"trainer.runs_dir={runs}", "--run-id", "agent")
    run = runs / "agent"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: {k: v for k, v in r.items() if k.startswith("val/")} for r in records}
    assert sorted(logged) == [0, 1, 2] and all("val/reward/mean@2" in m for m in logged.values())
    for step, metrics in logged.items():
        # Every episode: the policy's turn, "next", the policy's second turn, scored by the environment.
        assert metrics["val/agent/turns_mean"] == 2.0 and metrics["val/agent/env_errors"] == 0.0
        lines = [json.loads(line) for line in (run / "validation" / f"step_{step:08d}.jsonl").read_text().splitlines()]
        assert [(r["kind"], r["row"]) for r in lines] == [("greedy", p) for p in range(6)] + [
            ("sample", p) for p in range(6) for _ in range(2)]
        assert all([c["from"] for c in r["conversation"]] == ["policy", "environment", "policy"]
                   and "next" in r["conversation"][1]["text"] and r["turns"] == 2 for r in lines)
        greedy = [r["score"] for r in lines if r["kind"] == "greedy"]
        assert sum(greedy) / 6 == pytest.approx(metrics["val/reward/mean@1"])

    report = json.loads(rlkit("eval", "agent", "--runs-dir", str(runs), "--step", "2", "--json").stdout)
    assert report["metrics"] == logged[2]
    assert (run / "validation" / "eval_step_00000002.jsonl").read_text() == \
        (run / "validation" / "step_00000002.jsonl").read_text()
