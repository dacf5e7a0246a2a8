"""The tool-use pipeline through the CLI on a CPU: a model built from scratch is taught the calculator's call format
by SFT, then GRPO in rlkit's tool loop lifts its validation above the SFT start and above the same model taught the
answers without the tool (bench/learning_tools.py is the GPU version, docs/learning.md).

prep-data tool-arithmetic (SFT chats that call `calculator`, the same problems answered directly, RL rows) ->
scripts/build_scratch_model.py (a BPE trained on the chats, a Qwen2 from scratch; its chat template renders tools,
calls and results) -> `rlkit train sft` on each -> `rlkit export` -> `rlkit eval` of the no-tool model (single
turn) -> `rlkit train grpo` with rollout.agent.loop=tool from the tool model. Every command runs in the test's
process, the trainings' workers too (trainer.workers=in_process, the transformers engine).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli_in_process as rlkit
from test_warm_start_e2e import IN_PROCESS, build_scratch_model, validations

pytestmark = pytest.mark.slow

TASK = ["-o", "min_digits=1", "-o", "max_digits=2", "-o", "n_train=4000", "-o", "n_test=64"]
SHAPES = ["data.max_prompt_length=192", "data.max_response_length=80", "actor.micro_batch_tokens=8192"]
TOOL_LOOP = ["rollout.agent.loop=tool", "rollout.agent.tools=[calculator]", "rollout.agent.max_turns=3",
             "rollout.agent.max_tokens_per_turn=32"]
SFT_STEPS = 600


def sft(runs: Path, base: Path, data: Path, run_id: str) -> None:
    rlkit("train", "sft", "--model", str(base), f"data.train_files=[{data / 'train.parquet'}]",
          f"data.val_files=[{data / 'test.parquet'}]", "data.train_batch_size=32", "actor.mini_batch_size=32",
          "actor.lr=3e-3", "actor.lr_schedule=constant", "actor.warmup_steps=0", f"trainer.total_steps={SFT_STEPS}",
          "trainer.val_freq=0", "trainer.save_freq=0", *SHAPES, *IN_PROCESS, "trainer.logger=[jsonl]",
          f"trainer.runs_dir={runs}", "--run-id", run_id)
    rlkit("export", run_id, "--runs-dir", str(runs), "--out", str(runs.parent / f"{run_id}-model"))


def test_sft_with_tool_calls_then_grpo_in_the_tool_loop(tmp_path: Path, monkeypatch) -> None:
    data, runs = tmp_path / "data", tmp_path / "runs"
    rlkit("prep-data", "tool-arithmetic", "--out", str(data / "sft"), *TASK, "--format", "sft")
    rlkit("prep-data", "tool-arithmetic", "--out", str(data / "sft-none"), *TASK, "--format", "sft", "-o", "tool=none")
    rlkit("prep-data", "tool-arithmetic", "--out", str(data / "rl"), *TASK)
    build_scratch_model(monkeypatch, "--data", str(data / "sft" / "train.parquet"), "--out", str(tmp_path / "base"),
                        "--size", "tiny")
    sft(runs, tmp_path / "base", data / "sft", "sft-tool")
    sft(runs, tmp_path / "base", data / "sft-none", "sft-none")

    printed = rlkit("eval", str(runs.parent / "sft-none-model"), "--data", str(data / "rl" / "test.parquet"), "--json",
                    *SHAPES).stdout
    no_tool = json.loads(printed[printed.index("{"):])["metrics"]["val/reward/mean@1"]

    rlkit("train", "grpo", "--model", str(runs.parent / "sft-tool-model"),
          f"data.train_files=[{data / 'rl' / 'train.parquet'}]",
          f"data.val_files=[{data / 'rl' / 'test.parquet'}]", "data.train_batch_size=16", "rollout.n=8",
          "actor.mini_batch_size=16", "actor.lr=3e-4", "actor.use_kl_loss=false", "trainer.total_steps=40",
          "trainer.val_freq=20", "trainer.val_n=4", *SHAPES, *TOOL_LOOP, *IN_PROCESS, "rollout.name=hf",
          "reward.num_workers=1", "trainer.logger=[jsonl]", f"trainer.runs_dir={runs}", "--run-id", "grpo")
    grpo = validations(runs / "grpo")
    assert sorted(grpo) == [0, 20, 40]
    start, end = grpo[0], grpo[40]
    # The SFT model calls the calculator in (nearly) every greedy episode from the start.
    assert start["val/agent/tool_calls"] >= 0.9, start
    assert end["val/reward/mean@1"] > max(start["val/reward/mean@1"], no_tool), (no_tool, start, end)
