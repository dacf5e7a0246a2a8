"""Validation through the CLI with vLLM, and `rlkit eval` giving the run's own numbers.

One 3-step `grpo-demo` run validates the echo task's test split (greedy + 4 samples) before
training, at step 2 (trainer.val_freq=2) and at the end. `rlkit eval` of its checkpoints, of the
base model (--step 0) and of an export then gives exactly the metrics and responses the run logged
for those steps: the same code, the same seeds, one engine in each. The run's worker is an object in
the CLI's process (trainer.workers=in_process: no Ray, no worker processes), so every command runs in the
test's process (conftest.run_cli_in_process).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import torch
from conftest import run_cli_in_process as rlkit

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Path]:
    runs = tmp_path_factory.mktemp("validation") / "runs"
    with pytest.MonkeyPatch.context() as patch:  # the CLI builds the tiny model in the test cache too
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        rlkit("train", "grpo-demo", "trainer.total_steps=3", "trainer.val_freq=2", "trainer.save_freq=1",
              "trainer.keep_last=3", "trainer.workers=in_process", "trainer.device=cpu",
              "trainer.logger=[jsonl,tensorboard]", f"trainer.runs_dir={runs}",
              "--run-id", "val")
        yield runs / "val"


def val_metrics(run: Path) -> dict[int, dict[str, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("val/")} for r in records
            if "val/reward/mean@1" in r}


def evaluate(target: str, *args: str) -> dict:
    return json.loads(rlkit("eval", target, *args, "--json").stdout)


def test_validation_before_training_every_val_freq_steps_and_at_the_end(run: Path) -> None:
    logged = val_metrics(run)
    assert sorted(logged) == [0, 2, 3]
    for metrics in logged.values():
        assert {"val/reward/mean@1", "val/reward/mean@4", "val/reward/pass@1", "val/reward/pass@2",
                "val/reward/pass@4", "val/reward/maj@4", "val/response/length_mean",
                "val/synthetic/echo/reward/mean@1", "val/synthetic/echo/reward/maj@4"} <= metrics.keys()
    step_0 = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/mean" not in step_0 and step_0["timing/val"] > 0  # the pass before training, alone
    for step in (0, 2, 3):
        lines = [json.loads(line) for line in (run / "validation" / f"step_{step:08d}.jsonl").read_text().splitlines()]
        assert len(lines) == 128 * 5 and {line["step"] for line in lines} == {step}
        greedy = [line["score"] for line in lines if line["kind"] == "greedy"]
        assert sum(greedy) / len(greedy) == pytest.approx(logged[step]["val/reward/mean@1"])
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tensorboard").iterdir())

    shown = rlkit("runs", "show", "val", "--runs-dir", str(run.parent)).stdout
    assert "validation (3 times;" in shown and "val/reward/maj@4" in shown
    rlkit("plot", "val", "--runs-dir", str(run.parent))
    assert (run / "plot.png").stat().st_size > 10_000


def test_eval_of_a_checkpoint_gives_the_runs_numbers(run: Path) -> None:
    report = evaluate("val", "--runs-dir", str(run.parent), "--step", "2")
    assert report["step"] == 2 and report["metrics"] == val_metrics(run)[2]
    written = run / "validation" / "eval_step_00000002.jsonl"
    assert report["generations"] == str(written)
    assert written.read_text() == (run / "validation" / "step_00000002.jsonl").read_text()

    base = evaluate(str(run), "--step", "0")  # the run's directory as the target; 0: before training
    assert base["metrics"] == val_metrics(run)[0]
    # Eval freed its engine and the torch.distributed world vLLM set up: another run can start in this process.
    assert not torch.distributed.is_initialized()


def test_eval_of_an_export_gives_the_runs_numbers(run: Path) -> None:
    out = run.parent / "exported"
    rlkit("export", "val", "--runs-dir", str(run.parent), "--step", "3", "--out", str(out))
    report = evaluate(str(out), "--out", str(run.parent / "export.jsonl"))
    assert report["step"] == 3 and report["metrics"] == val_metrics(run)[3]
    assert (run.parent / "export.jsonl").read_text() == (run / "validation" / "step_00000003.jsonl").read_text()
