"""`rlkit eval` on a model directory (no Ray, the HF engine in this process), how it finds its
settings, and validation in `runs show` and `rlkit plot`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import invoke

from rlkit.cli import eval_cmds, run_cmds
from rlkit.core.controller.offline_eval import resolve_target
from rlkit.core.state.run_dir import RunDir
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic
from rlkit.core.rewards.metrics import pass_at_k
from rlkit.core.train.export import EXPORT_CONFIG, EXPORT_INFO
from rlkit.errors import ConfigError, UserError
from rlkit.recipes.loader import config_to_yaml, load_config


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    from rlkit.core.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("eval") / "model", hidden_size=64, num_layers=1, num_heads=1,
                            intermediate_size=64)


def test_eval_of_a_model_directory_scores_greedy_and_samples(small_model: Path, tmp_path: Path) -> None:
    data = write_parquet(build_synthetic(task="echo", n_test=5, seed=1)["test"], tmp_path / "echo.parquet")
    out = tmp_path / "responses.jsonl"
    result = invoke(eval_cmds.register, str(small_model), "--data", str(data), "--out", str(out), "--json",
                    "rollout.name=hf", "data.max_response_length=2", "trainer.val_n=3")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["rows"], report["step"], report["generations"]) == (5, 0, str(out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["greedy"] * 5 + ["sample"] * 15
    metrics = report["metrics"]
    greedy = [r["score"] for r in lines[:5]]
    solved = [sum(r["score"] for r in lines[5 + 3 * p:8 + 3 * p]) for p in range(5)]
    # The metrics are those of the responses written: recomputed here from the file.
    assert metrics["val/reward/mean@1"] == pytest.approx(sum(greedy) / 5)
    assert metrics["val/reward/mean@3"] == pytest.approx(sum(solved) / 15)
    assert metrics["val/reward/pass@2"] == pytest.approx(sum(pass_at_k(3, int(c), 2) for c in solved) / 5)
    assert {"val/reward/maj@3", "val/synthetic/echo/reward/mean@1", "val/response/length_mean"} <= metrics.keys()
    assert all(r["length"] <= 2 for r in lines)

    again = invoke(eval_cmds.register, str(small_model), "--data", str(data), "--json",
                   "rollout.name=hf", "data.max_response_length=2", "trainer.val_n=3")
    assert json.loads(again.stdout)["metrics"] == metrics  # seeded: the same samples again


def test_targets_find_their_settings(small_model: Path, tmp_path: Path) -> None:
    plain = resolve_target(str(small_model), step=None, overrides=["trainer.val_n=4"], runs_dir=tmp_path)
    assert (plain.step, plain.model_path, plain.config.recipe) == (0, str(small_model), "grpo")
    assert plain.config.trainer.val_n == 4 and plain.checkpoint is None

    exported = tmp_path / "exported"
    exported.mkdir()
    for name in ("config.json", "model.safetensors"):
        (exported / name).symlink_to(small_model / name)
    run_config = load_config("grpo-demo", ["data.max_response_length=3"])
    (exported / EXPORT_CONFIG).write_text(config_to_yaml(run_config))
    (exported / EXPORT_INFO).write_text(json.dumps({"run": "r", "step": 40}))
    target = resolve_target(str(exported), step=None, overrides=[], runs_dir=tmp_path)
    assert target.step == 40 and target.config.data.max_response_length == 3
    assert target.config.trainer.val_n == 4 and target.config.model.path == str(exported)
    assert resolve_target(str(exported), step=7, overrides=[], runs_dir=tmp_path).step == 7

    with pytest.raises(UserError, match="neither a run .* nor a model directory"):
        resolve_target("nowhere", step=None, overrides=[], runs_dir=tmp_path)


def test_an_sft_models_eval_may_sample(small_model: Path, tmp_path: Path) -> None:
    """An SFT export's config says objective sft, whose training refuses validation's sampling keys (it generates
    nothing); evaluating the model generates, so `rlkit eval` takes them, and scores 2 samples a prompt."""
    exported = tmp_path / "sft-export"
    exported.mkdir()
    for file in small_model.iterdir():  # the model and its tokenizer
        (exported / file.name).symlink_to(file)
    sft = load_config("sft", ["data.max_response_length=2"], require_inputs=False)
    (exported / EXPORT_CONFIG).write_text(config_to_yaml(sft))
    with pytest.raises(ConfigError, match="trainer.val_n .*objective sft generates nothing"):
        load_config(str(exported / EXPORT_CONFIG), ["trainer.val_n=2"], require_inputs=False)
    data = write_parquet(build_synthetic(task="echo", n_test=3, seed=1)["test"], tmp_path / "echo.parquet")
    result = invoke(eval_cmds.register, str(exported), "--data", str(data), "--json", "rollout.name=hf",
                    "trainer.val_n=2", "rollout.temperature=0.7")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"]["val_n"] == 2 and report["settings"]["temperature"] == 0.7
    assert "val/reward/mean@2" in report["metrics"]


def test_eval_of_a_run_without_that_checkpoint_names_the_steps(tmp_path: Path) -> None:
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}"])
    RunDir.create(config, "alpha")
    result = invoke(eval_cmds.register, "alpha", "--runs-dir", str(tmp_path), "--step", "3")
    assert result.exit_code == 2 and "has no checkpoint of step 3 (checkpoints: none)" in result.output


def val_run(runs: Path) -> RunDir:
    """Steps 1-4 trained, validated at 0, 2 and 4."""
    run = RunDir.create(load_config("grpo-demo", [f"trainer.runs_dir={runs}", "trainer.total_steps=4"]), "valrun")
    records = [{"step": 0, "val/reward/mean@1": 0.1, "val/reward/mean@4": 0.2, "val/reward/pass@4": 0.5,
                "timing/val": 0.3}]
    for step in range(1, 5):
        record = {"step": step, "reward/mean": step / 10, "timing/gen": 0.5, "timing/step": 1.0}
        if step % 2 == 0:
            record.update({"val/reward/mean@1": step / 5, "val/reward/mean@4": step / 5, "val/reward/pass@4": 0.9,
                           "timing/val": 0.3})
        records.append(record)
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run.write_status("finished", step=4, total_steps=4)
    return run


def test_runs_show_prints_the_first_and_last_validation(tmp_path: Path) -> None:
    val_run(tmp_path)
    result = invoke(run_cmds.register, "runs", "show", "valrun", "--runs-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "validation (3 times;" in result.output
    line = next(line for line in result.output.splitlines() if "val/reward/mean@1" in line)
    assert line.replace("│", " ").split() == ["val/reward/mean@1", "0.1", "0.8"]  # steps 0 and 4
    assert "step 4" in result.output and "reward/mean" in result.output


def test_plot_draws_the_validation_panel(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from rlkit.core.controller.plot import plot_run, validation_keys
    from rlkit.core.controller.tracking import read_metrics

    run = val_run(tmp_path)
    records = read_metrics(run.path / "metrics.jsonl")
    assert validation_keys(records) == ["val/reward/mean@1", "val/reward/mean@4", "val/reward/pass@4"]
    out = plot_run(run.path, tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
