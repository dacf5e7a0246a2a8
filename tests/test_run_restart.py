"""A run that stopped before its first checkpoint is not a dead end: `rlkit resume` says how to start
it again under its id, and `rlkit train --run-id ID` reuses its directory (after saying so)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from rlkit.cli.main import app
from rlkit.core.state.run_dir import RunDir
from rlkit.core.state.checkpoint import write_checkpoint
from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml, load_config


def failed_run(tmp_path, run_id: str = "early"):
    """What a run that died before its first checkpoint leaves: config, status, logs, a torn write."""
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}", "trainer.total_steps=6", "actor.lr=0.01"])
    run = RunDir.create(config, run_id)
    run.write_status("failed", step=1, error="WorkerFailure: worker rank 0 died")
    (run.path / "metrics.jsonl").write_text('{"step": 1}\n')
    (run.path / "console.log").write_text("...\n")
    (run.path / "checkpoints" / ".tmp-step_00000002").mkdir(parents=True)
    return config, run


def test_train_reuses_the_directory_of_a_run_without_checkpoints(tmp_path):
    config, run = failed_run(tmp_path)
    again = RunDir.create(config, "early")
    assert again.restarted and again.path == run.path
    assert sorted(p.name for p in run.path.iterdir()) == ["config.yaml"]  # the failed attempt's files are gone
    assert not RunDir.create(config, "fresh").restarted


def test_a_run_with_a_checkpoint_is_continued_not_restarted(tmp_path):
    config, run = failed_run(tmp_path)
    write_checkpoint(run.path, 2, reason="periodic", write_shards=lambda folder: None, trainer_state={},
                     controller_rng={}, config_yaml=config_to_yaml(config), keep_last=2)
    with pytest.raises(UserError, match=rf"run directory {run.path} already exists and holds checkpoints \(the "
                                        rf"last of step 2\); continue it with `rlkit resume early --runs-dir "
                                        rf"{tmp_path}`, or pick another --run-id"):
        RunDir.create(config, "early")


def test_a_running_run_and_a_foreign_directory_are_not_reused(tmp_path):
    config, run = failed_run(tmp_path)
    run.write_status("running")  # this process: alive
    with pytest.raises(UserError, match=rf"its run is still running \(pid {os.getpid()} on "):
        RunDir.create(config, "early")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(UserError, match="is not a run directory"):
        RunDir.create(config, "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


def test_resume_without_a_checkpoint_gives_the_command_that_restarts_the_run(tmp_path, monkeypatch):
    config, run = failed_run(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    result = CliRunner().invoke(app, ["resume", "early", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "ignoring .tmp-step_00000002: a checkpoint write that never finished" in text
    assert text[text.index("error: "):] == (f"error: run {run.path} has no checkpoint (checkpoints are written every trainer.save_freq "
                    "steps and at the end): it stopped before its first one, so there is nothing to resume. "
                    f"Start it again under the same id with: rlkit train {run.path}/config.yaml --run-id early "
                    f"trainer.runs_dir={tmp_path}")
    # that command trains exactly the run's config, recipe name included
    assert load_config(str(run.path / "config.yaml"), [f"trainer.runs_dir={tmp_path}"]) == config
    assert json.loads((run.path / "status.json").read_text())["status"] == "failed"
