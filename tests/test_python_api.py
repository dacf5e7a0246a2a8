"""The Python API (rlkit.api): overrides as a dict, user code as objects, Run reading a run directory, errors
raised (not exits), and `import rlkit` staying cheap. No training here: tests/test_python_api_example.py runs
examples/train_from_python.py end to end."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle
import pytest
import yaml
from conftest import REPO, run_cli_in_process
from test_run_cmds import fake_run

import rlkit
from rlkit import Run
from rlkit.core.agents.client_loop import agent_function
from rlkit.core.agents.envs import load_env_class
from rlkit.core.agents.tool_env import load_tools
from rlkit.core.controller.resume import resume_config
from rlkit.core.rewards.custom import resolve, user_function
from rlkit.core.rewards.scoring import RewardScorer, check_reward_functions
from rlkit.core.rewards.worker_pool import RewardError
from rlkit.core.state.checkpoint import latest_checkpoint
from rlkit.errors import ConfigError, UserError
from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.loader import config_to_yaml, load_config, overrides_text
from rlkit.recipes.reward_schema import RewardConfig
from rlkit.recipes.user_code import reference


def exact_match(data_source, response, ground_truth, extra_info):
    return float(response.strip() == ground_truth)


class CountingEnv:
    def reset(self, row):
        return None

    def step(self, action):
        return None, 1.0, True


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    return key


async def rollout(client, row):
    return 1.0


# -- overrides --------------------------------------------------------------------------------------------------
def test_a_dict_of_overrides_is_the_command_lines_key_value_with_python_values() -> None:
    from_cli = load_config("grpo-demo",
                           ["rollout.n=4", "trainer.logger=[jsonl]", "actor_rollout_ref.actor.ppo_epochs=2"])
    from_dict = load_config("grpo-demo", {"rollout.n": 4, "trainer.logger": ["jsonl"],
                                          "actor_rollout_ref.actor.ppo_epochs": 2})  # verl's spelling works too
    assert from_dict == from_cli
    assert (from_dict.rollout.n, from_dict.trainer.logger, from_dict.actor.ppo_epochs) == (4, ["jsonl"], 2)


def test_a_bad_override_in_the_dict_is_named_with_where_it_was_written() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'rollout.nn' \(overrides\); did you mean 'rollout.n'"):
        load_config("grpo-demo", {"rollout.nn": 4})
    with pytest.raises(ConfigError, match=r"rollout.n=0 \(overrides\)"):
        load_config("grpo-demo", {"rollout.n": 0})
    with pytest.raises(ConfigError, match="pass a dict"):
        load_config("grpo-demo", "rollout.n=4")  # one string, not a list of them


def test_overrides_are_logged_as_written() -> None:
    assert overrides_text(["rollout.n=4", "trainer.logger=[jsonl]"]) == "rollout.n=4 trainer.logger=[jsonl]"
    assert overrides_text({"trainer.total_steps": 3, "reward.function": exact_match}) == (
        "trainer.total_steps=3 reward.function=python:test_python_api:exact_match")


# -- user code as objects ---------------------------------------------------------------------------------------
def test_config_yaml_records_an_object_by_its_module_and_name() -> None:
    config = load_config("grpo-demo", {"reward.function": exact_match, "rollout.agent.loop": "env",
                                       "rollout.agent.env": CountingEnv}, require_inputs=False)
    assert config.reward.function is exact_match  # the run's processes get the object itself
    saved = yaml.safe_load(config_to_yaml(config))
    assert saved["reward"]["function"] == "python:test_python_api:exact_match"
    assert saved["rollout"]["agent"]["env"] == "python:test_python_api:CountingEnv"
    tools = load_config("grpo-demo", {"rollout.agent.loop": "tool", "rollout.agent.tools": ["calculator", lookup]})
    assert yaml.safe_load(config_to_yaml(tools))["rollout"]["agent"]["tools"] == [
        "calculator", "python:test_python_api:lookup"]

    def nested(data_source, response, ground_truth, extra_info):
        return 0.0

    assert reference(nested) == "python:test_python_api:test_config_yaml_records_an_object_by_its_module_and_name" \
                                ".<locals>.nested"
    assert reference(lambda *args: 0.0).endswith(":test_config_yaml_records_an_object_by_its_module_and_name"
                                                 ".<locals>.<lambda>")


def test_a_config_holding_a_closure_crosses_to_another_process_as_ray_sends_it() -> None:
    """Ray hands the config to its workers through cloudpickle: a function defined in a function (as in a notebook)
    travels by value."""
    offset = 0.5

    def shifted(data_source, response, ground_truth, extra_info):
        return float(response == ground_truth) + offset

    config = load_config("grpo-demo", {"reward.function": shifted}, require_inputs=False)
    code = "import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); print(c.reward.function('s', '1', '1', {}))"
    proc = subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(config), capture_output=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().strip() == "1.5"


def test_the_string_form_resolves_to_the_same_object() -> None:
    assert resolve("python:test_python_api:exact_match", "reward.function") is exact_match
    assert resolve(exact_match, "reward.function") is exact_match
    assert load_env_class("python:test_python_api:CountingEnv") is CountingEnv
    assert load_env_class(CountingEnv) is CountingEnv


def test_a_scripts_object_in_config_yaml_asks_for_the_object_again() -> None:
    for text in ("python:__main__:exact_match", "python:test_python_api:f.<locals>.g", "python:no_such_module:fn"):
        with pytest.raises(UserError, match=r"pass the object again \(rlkit.resume\(RUN, overrides="
                                            r"\{'reward.function': obj\}\)\)"):
            resolve(text, "reward.function")


def test_an_object_reward_scores_in_the_worker_processes() -> None:
    """A closure (pickled by value, as a notebook's function is) scores in the pool, guarded as a file's is."""
    target = "7"

    def closure(data_source, response, ground_truth, extra_info):
        if response == "boom":
            raise ValueError("no")
        return {"score": float(response == target), "length": len(response)}

    with RewardScorer(RewardConfig(function=closure, num_workers=1, on_error="zero")) as scorer:
        scored = scorer.score(["7", "8", "boom"], ["synthetic/echo"] * 3, ["x"] * 3, [{}] * 3)
    assert scored.scores == [1.0, 0.0, 0.0]
    assert scored.metrics["reward/length"] == (1 + 1) / 2  # the failed row logs no details
    assert scored.metrics["reward/errors"] == 1.0
    assert "ValueError: no" in scored.errors[0] and ".<locals>.closure" in scored.errors[0]
    with RewardScorer(RewardConfig(function=closure, num_workers=1)) as scorer:
        with pytest.raises(RewardError, match="row 1 .*ValueError: no"):
            scorer.score(["7", "boom"], ["synthetic/echo"] * 2, ["x"] * 2, [{}] * 2)


def test_a_large_reward_object_crosses_to_the_workers_as_a_small_handle() -> None:
    """A closure over a ~1 MB table is pickled once, to a file; each call sends the file's path, not the table."""
    table = {str(i): "x" * 100 for i in range(10_000)}

    def in_table(data_source, response, ground_truth, extra_info):
        return float(response in table)

    handle = user_function(in_table, "reward.function")
    assert len(pickle.dumps(handle)) < 1000 < Path(handle.path).stat().st_size
    assert Path(handle.path).stat().st_mode & 0o777 == 0o600
    with RewardScorer(RewardConfig(function=in_table, num_workers=1)) as scorer:
        assert scorer.score(["5", "x"], ["synthetic/echo"] * 2, ["", ""], [{}, {}]).scores == [1.0, 0.0]


def test_an_object_that_does_not_pickle_is_refused_saying_why() -> None:
    class Locked:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __call__(self, data_source, response, ground_truth, extra_info):
            return 1.0

    with pytest.raises(UserError, match=r"reward.function=python:test_python_api:.*Locked\(\): this object cannot "
                                        r"be pickled \(TypeError: cannot pickle '_thread.lock' object\)"):
        check_reward_functions(RewardConfig(function=Locked()), ["synthetic/echo"], "train.parquet")
    with pytest.raises(UserError, match="rollout.agent.env=.*cannot be pickled"):
        load_env_class(type("Env", (CountingEnv,), {"lock": threading.Lock()}))


def test_a_module_attribute_that_is_not_code_or_a_module_that_fails_is_refused(tmp_path, monkeypatch) -> None:
    with pytest.raises(UserError, match=r"reward.function='python:math:pi' is float, not a function or a class"):
        user_function("python:math:pi", "reward.function")
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"reward.function='python:broken_rewards:score': importing broken_rewards "
                                        r"failed: RuntimeError: no GPU here"):
        user_function("python:broken_rewards:score", "reward.function")


def test_tools_and_agent_functions_may_be_objects() -> None:
    tools = load_tools(AgentConfig(loop="tool", tools=["calculator", lookup]))
    assert [tool.name for tool in tools] == ["calculator", "lookup"]
    assert agent_function(rollout) is rollout
    with pytest.raises(UserError, match=r"rollout.agent.loop='python:test_python_api:exact_match': exact_match must "
                                        "be `async def"):
        agent_function(exact_match)


def test_a_resume_takes_the_object_again_and_refuses_another(tmp_path: Path) -> None:
    """config.yaml holds the reference; the same object given again is no change, another one is refused."""
    run = fake_run(tmp_path, "alpha", 2)
    ckpt = latest_checkpoint(run.path)
    config = load_config("grpo-demo", {"reward.function": exact_match, "trainer.total_steps": 2,
                                       "actor.lr_schedule": "constant"})
    (ckpt.path / "config.yaml").write_text(config_to_yaml(config))
    resumed = resume_config(run, ckpt, {"reward.function": exact_match, "trainer.total_steps": 4})
    assert resumed.reward.function is exact_match and resumed.trainer.total_steps == 4

    def other(data_source, response, ground_truth, extra_info):
        return 0.0

    with pytest.raises(UserError, match=r"reward.function: 'python:test_python_api:exact_match' -> "
                                        r"'python:test_python_api:.*<locals>.other'"):
        resume_config(run, ckpt, {"reward.function": other, "trainer.total_steps": 4})


# -- Run --------------------------------------------------------------------------------------------------------
def test_run_reads_a_run_directory(tmp_path: Path) -> None:
    made = fake_run(tmp_path, "alpha", 4)  # metrics of steps 1-4 (reward/mean step/10), checkpoints 3 and 4 kept
    with (made.path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 5, "reward/me')  # a half-written last line (a run killed mid-write) is skipped
    run = Run.load("alpha", runs_dir=tmp_path)
    assert run == Run(made.path) == Run.load(made.path)
    assert (run.id, run.path) == ("alpha", made.path)
    assert run.status["status"] == "finished" and run.status["step"] == 4
    assert run.config["trainer"]["total_steps"] == 4
    assert [record["step"] for record in run.metrics] == [1, 2, 3, 4]
    assert run.history("reward/mean") == {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}
    assert run.history("no/such") == {}
    assert [c.step for c in run.checkpoints] == [3, 4]  # keep_last=2
    (run.path / "checkpoints" / "step_00000004" / "policy" / "rank_0.pt").write_bytes(b"w")  # damaged
    assert [c.step for c in run.checkpoints] == [3]
    assert "Run('alpha', status=finished, step=4/4" in repr(run)


def test_run_reads_runs_dir_from_the_environment_as_the_command_line_does(tmp_path: Path, monkeypatch) -> None:
    fake_run(tmp_path, "alpha", 1)
    monkeypatch.setenv("RLKIT_RUNS_DIR", str(tmp_path))
    assert Run.load("alpha").path == tmp_path / "alpha"


def test_a_run_without_metrics_jsonl_says_which_logger_writes_it(tmp_path: Path) -> None:
    run = Run(fake_run(tmp_path, "alpha", 1).path)
    (run.path / "metrics.jsonl").unlink()
    config = yaml.safe_load((run.path / "config.yaml").read_text())
    config["trainer"]["logger"] = ["console"]
    (run.path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=r"run alpha writes no metrics.jsonl \(trainer.logger=\['console'\]\)"):
        run.metrics


# -- errors are exceptions --------------------------------------------------------------------------------------
def test_user_errors_raise_instead_of_exiting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no recipe named 'grpo-dmeo'.*did you mean 'grpo-demo'"):
        rlkit.train("grpo-dmeo")
    with pytest.raises(UserError, match=r"no run 'gamma' in .*runs there: alpha"):
        fake_run(tmp_path, "alpha", 1) and Run.load("gamma", runs_dir=tmp_path)
    fake_run(tmp_path, "beta", 1, status="running")  # by this process, which is alive
    with pytest.raises(UserError, match="run beta is still running"):
        rlkit.resume("beta", runs_dir=tmp_path)
    with pytest.raises(UserError, match="is not empty; pick a new directory"):
        Run.load("alpha", runs_dir=tmp_path).export(tmp_path / "alpha")


def test_bad_code_objects_stop_train_before_anything_starts(tmp_path: Path) -> None:
    """rlkit.train's preflight checks an object as it checks a file's code: a UserError, no run directory, no Ray."""
    import ray

    class NoReset:
        def step(self, action):
            return None, 1.0, True

    runs = tmp_path / "runs"
    cases = [({"rollout.agent.loop": "env", "rollout.agent.env": NoReset}, "class NoReset has no method reset(row)"),
             ({"rollout.agent.loop": exact_match}, "exact_match must be `async def rollout(client, row)")]
    for overrides, message in cases:
        with pytest.raises(UserError, match=re.escape(message)):
            rlkit.train("grpo-demo", overrides={"trainer.runs_dir": str(runs), **overrides})
    assert not ray.is_initialized() and not runs.exists()


def test_dry_run_calls_an_object_reward_as_the_run_will() -> None:
    """(Functions defined here, as a notebook's are: one of this module would be imported in the reward worker,
    and with it this test module's own imports.)"""

    def exact(data_source, response, ground_truth, extra_info):
        return float(response.strip() == ground_truth)

    lines = rlkit.dry_run("grpo-demo", overrides={"reward.function": exact})
    assert ("ok: reward python:test_python_api:test_dry_run_calls_an_object_reward_as_the_run_will.<locals>.exact "
            "called on training row(s) 0, 1 within reward.timeout_s=10: response the row's ground truth scores 1, 1; "
            "response an empty string scores 0, 0") in lines
    assert any(line.startswith("skipped: loading the weights") for line in lines)

    def inverse_length(data_source, response, ground_truth, extra_info):
        return 1.0 / len(response)

    with pytest.raises(UserError, match=r"inverse_length failed on training row 0 .*response: an empty string\): "
                                        "ZeroDivisionError"):
        rlkit.dry_run("grpo-demo", overrides={"reward.function": inverse_length})


def test_the_command_line_still_exits_2_on_the_same_errors() -> None:
    result = run_cli_in_process("train", "grpo-dmeo", exit_code=2)
    assert "did you mean 'grpo-demo'" in result.stderr and "Traceback" not in result.output
    result = run_cli_in_process("resume", "alpha", "--runs-dir", "/nonexistent", exit_code=2)
    assert "no run 'alpha'" in result.stderr


def test_import_rlkit_imports_nothing_heavy() -> None:
    heavy = ("torch", "ray", "vllm", "transformers", "pydantic", "yaml", "typer", "rich", "numpy")
    code = ("import sys, rlkit; from rlkit import Run, dry_run, resume, train; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.replace("'", '"')) == []
