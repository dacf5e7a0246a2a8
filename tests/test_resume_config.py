"""`rlkit resume` overrides: only those that cannot change the math are accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.core.controller.resume import resume_config, resume_run
from rlkit.core.state.run_dir import RunDir
from rlkit.core.state.checkpoint import latest_checkpoint, write_checkpoint
from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml, load_config


def make_run(tmp_path: Path, *overrides: str, step: int = 3):
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}", "trainer.total_steps=6", *overrides])
    run = RunDir.create(config, "r")
    write_checkpoint(run.path, step, reason="periodic", write_shards=lambda folder: None, trainer_state={},
                     controller_rng={}, config_yaml=config_to_yaml(config), keep_last=2)
    return run, latest_checkpoint(run.path)


def test_safe_overrides_are_applied_and_the_recipe_name_kept(tmp_path) -> None:
    run, ckpt = make_run(tmp_path)
    config = resume_config(run, ckpt, ["trainer.total_steps=10", "trainer.save_freq=2", "trainer.logger=[jsonl]"])
    assert (config.trainer.total_steps, config.trainer.save_freq, config.trainer.logger) == (10, 2, ["jsonl"])
    assert config.recipe == "grpo-demo"
    assert config.actor.lr == 1e-3  # the rest is the checkpoint's


def test_verl_spellings_of_safe_keys_are_accepted(tmp_path) -> None:
    run, ckpt = make_run(tmp_path)
    assert resume_config(run, ckpt, ["trainer.total_training_steps=9"]).trainer.total_steps == 9


def test_overrides_that_change_the_math_are_refused_with_old_and_new_values(tmp_path) -> None:
    run, ckpt = make_run(tmp_path)
    with pytest.raises(UserError) as err:
        resume_config(run, ckpt, ["actor.lr=0.5", "trainer.seed=7", "trainer.save_freq=2"])
    refused, allowed = str(err.value).split(". Keys a resume may change: ")
    assert "actor.lr: 0.001 -> 0.5" in refused and "trainer.seed: 0 -> 7" in refused
    assert "save_freq" not in refused
    assert allowed.startswith("trainer.total_steps, trainer.save_freq")


def test_more_workers_are_refused(tmp_path) -> None:
    run, ckpt = make_run(tmp_path)
    with pytest.raises(UserError, match="trainer.n_gpus_per_node: 1 -> 2"):
        resume_config(run, ckpt, ["trainer.n_gpus_per_node=2"])


def test_total_steps_cannot_change_under_a_cosine_schedule(tmp_path) -> None:
    run, ckpt = make_run(tmp_path, "actor.lr_schedule=cosine")
    with pytest.raises(UserError, match="actor.lr_schedule=cosine: the schedule decays over the original 6 steps"):
        resume_config(run, ckpt, ["trainer.total_steps=12"])


def test_a_finished_run_needs_more_total_steps(tmp_path) -> None:
    run, ckpt = make_run(tmp_path, step=6)
    with pytest.raises(UserError, match=r"already trained 6 of trainer.total_steps=6 .* N > 6"):
        resume_config(run, ckpt, [])


def test_a_run_that_is_still_running_is_not_resumed(tmp_path) -> None:
    run, _ = make_run(tmp_path)
    run.write_status("running", step=3)  # this test process: alive
    with pytest.raises(UserError, match="is still running"):
        resume_run("r", [], tmp_path)


def test_an_unknown_run_names_the_runs_there(tmp_path) -> None:
    make_run(tmp_path)
    with pytest.raises(UserError, match=r"no run 'nope' in .* \(runs there: r\)"):
        resume_run("nope", [], tmp_path)


def test_refusal_hints_name_the_runs_dir_of_a_run_outside_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RLKIT_RUNS_DIR", raising=False)
    monkeypatch.chdir(tmp_path.parent)  # ./runs is not where the run is
    run, ckpt = make_run(tmp_path, step=6)
    with pytest.raises(UserError) as finished:
        resume_config(run, ckpt, [])
    assert str(finished.value).endswith(f"to train on: `rlkit resume r --runs-dir {tmp_path} trainer.total_steps=12`")
    with pytest.raises(UserError) as refused:
        resume_config(run, ckpt, ["actor.lr=0.5", "trainer.total_steps=12"])
    assert f"(`rlkit export r --runs-dir {tmp_path} --out DIR`, then `rlkit train ... --model DIR`)" in str(refused.value)
    run.write_status("running", step=6)  # this test process: alive
    with pytest.raises(UserError) as running:
        resume_run(str(run.path), [], "runs")
    assert str(running.value).endswith(f"and run `rlkit resume r --runs-dir {tmp_path}` again")
