"""A reasoning-gym task learned through the CLI and scored by the task's own scorer: prep-data reasoning-gym (SFT
rows and RL rows) -> scripts/build_scratch_model.py -> `rlkit train sft` (a short warm start) -> `rlkit export`
-> `rlkit train grpo --model EXPORT`, whose sampled validation score rises above the SFT model's. Workers run
in the test's process, as in tests/test_warm_start_e2e.py (the same pipeline on GSM8K-format problems).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli_in_process as rlkit
from test_warm_start_e2e import build_scratch_model

pytestmark = pytest.mark.slow

# basic_arithmetic at its easiest: 'Calculate 57.', one number from 0 to 100; the answer is <answer>57</answer>.
TASK = ["--task", "basic_arithmetic", "-o", "min_terms=1", "-o", "max_terms=1", "-o", "min_digits=2",
        "-o", "max_digits=2", "-o", "allow_parentheses=false", "--size", "2000", "--test-size", "64"]
SHAPES = ["data.max_prompt_length=48", "data.max_response_length=10", "actor.micro_batch_tokens=8192"]
IN_PROCESS = ["trainer.workers=in_process", "trainer.device=cpu", "trainer.logger=[jsonl]"]


def validations(run_dir: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if "val/reward/mean@4" in r}


def test_grpo_lifts_a_warm_started_model_on_a_reasoning_gym_task(tmp_path: Path, monkeypatch) -> None:
    data, runs = tmp_path / "data", tmp_path / "runs"
    rlkit("prep-data", "reasoning-gym", *TASK, "--format", "sft", "--out", str(data / "sft"))
    rlkit("prep-data", "reasoning-gym", *TASK, "--out", str(data / "rl"))
    build_scratch_model(monkeypatch, "--data", str(data / "sft" / "train.parquet"), "--out", str(tmp_path / "base"),
                        "--size", "tiny")
    rlkit("train", "sft", "--model", str(tmp_path / "base"), f"data.train_files=[{data / 'sft' / 'train.parquet'}]",
          "data.train_batch_size=32", "actor.mini_batch_size=32", "actor.lr=1e-3", "actor.lr_schedule=constant",
          "actor.warmup_steps=0", "trainer.total_steps=60", "trainer.val_freq=0", "trainer.save_freq=0", *SHAPES,
          *IN_PROCESS, f"trainer.runs_dir={runs}", "--run-id", "sft")
    rlkit("export", "sft", "--runs-dir", str(runs), "--out", str(tmp_path / "sft-model"))
    # reward.timeout_s: the reward worker's first call imports reasoning-gym, seconds on a loaded machine.
    rlkit("train", "grpo", "--model", str(tmp_path / "sft-model"),
          f"data.train_files=[{data / 'rl' / 'train.parquet'}]", f"data.val_files=[{data / 'rl' / 'test.parquet'}]",
          "data.train_batch_size=16", "rollout.n=8", "actor.mini_batch_size=16", "actor.lr=3e-4",
          "actor.use_kl_loss=false", "trainer.total_steps=20", "trainer.val_freq=20", "trainer.val_n=4", *SHAPES,
          *IN_PROCESS, "reward.num_workers=1", "reward.timeout_s=60", f"trainer.runs_dir={runs}", "--run-id", "grpo")
    grpo = validations(runs / "grpo")
    start, end = grpo[0], grpo[20]
    # Step 0 is the SFT model: it writes <answer>N</answer> and copies some numbers right.
    assert 0.2 <= start["val/reward/mean@4"] <= 0.95, start
    # Measured 2026-12-04 on 2 CPU cores: mean@4 0.364 -> 0.438 (greedy 0.898 at both ends).
    assert end["val/reward/mean@4"] >= start["val/reward/mean@4"] + 0.03, (start, end)
