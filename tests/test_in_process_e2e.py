"""trainer.workers=in_process end to end: a resumed in-process run continues exactly as the uninterrupted one.

In-process, the workers and the controller share the process's RNGs (rlkit.core.cluster.local_group);
a checkpoint saves that one state and a resume restores it. The reference run trains N steps with a
checkpoint after every step, the settings of tests/test_resume_e2e.py (validation with samples, KL to
the reference, an entropy bonus, a cosine schedule); a copy of it, cut back to step K's checkpoint,
is resumed in the same process and must log the reference's numbers and validation responses. (These
runs draw their samples from per-request seeds, not from the process's RNGs: what this test tells apart
is the restored weights, optimizer, schedule, data position and validation, not the RNG state.)
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_resume_e2e import assert_same_metrics, metrics, training_overrides

from rlkit.core.controller.loop import train_run
from rlkit.core.controller.resume import resume_run
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic
from rlkit.core.state.checkpoint import list_checkpoints
from rlkit.recipes.loader import load_config

pytestmark = pytest.mark.slow
N, K = 4, 2


def test_resumed_in_process_run_gives_the_uninterrupted_runs_numbers(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    splits = build_synthetic(task="echo", n_train=12, n_test=5, seed=3)
    data = write_parquet(splits["train"], tmp_path / "echo12.parquet")
    val_data = write_parquet(splits["test"], tmp_path / "echo-val5.parquet")
    runs = tmp_path / "runs"
    overrides = [*training_overrides(data, runs, val_data), f"trainer.total_steps={N}", f"trainer.keep_last={N}",
                 "trainer.workers=in_process", "trainer.device=cpu"]
    reference = train_run(load_config("grpo-demo", overrides), run_id="reference")
    assert [r["step"] for r in metrics(reference)] == list(range(N + 1))  # step 0: the validation before training

    shutil.copytree(reference, runs / "resumed")
    for ckpt in list_checkpoints(runs / "resumed"):
        if ckpt.step > K:
            shutil.rmtree(ckpt.path)
    assert max(ckpt.step for ckpt in list_checkpoints(runs / "resumed")) == K
    resume_run("resumed", [], runs_dir=runs)
    assert_same_metrics(runs / "resumed", metrics(reference), reference)
    assert json.loads((runs / "resumed" / "status.json").read_text())["status"] == "finished"
