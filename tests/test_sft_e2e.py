"""`rlkit train sft` through the CLI on the tiny model: the loss goes down, validation loss runs on
the RL schedule, the export holds the trained weights and starts an RL run, and kill + resume
gives the uninterrupted run's metrics bit for bit (CPU; as tests/test_resume_e2e.py checks RL).

The data: the `add` task's prompts with their answers as responses. 24 rows, 8 a step: an epoch
is 3 steps, so the kill after step 3 resumes at an epoch boundary (the sampler's new order).

The worker is an object in the CLI's process (trainer.workers=in_process: no Ray, no worker processes), so the
commands run in the test's process (conftest.run_cli_in_process); the run to kill is a child process (forked
warm: tests/warm_cli.py), which the SIGKILL needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import torch
from conftest import run_cli_in_process
from test_resume_e2e import assert_same_metrics, killed_after_checkpoint, metrics

from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic

pytestmark = pytest.mark.slow

N, K = 6, 3


def sft_rows(rows: list[dict]) -> list[dict]:
    return [{**row, "response": row["reward_model"]["ground_truth"]} for row in rows]


def overrides(data: Path, val: Path, runs: Path) -> list[str]:
    return [f"data.train_files=[{data}]", f"data.val_files=[{val}]", "data.train_batch_size=8",
            "actor.mini_batch_size=4",  # two optimizer steps a step
            "data.max_prompt_length=16", "data.max_response_length=4", "actor.micro_batch_tokens=24",  # micro-batches
            "actor.lr=3e-3", "actor.warmup_steps=2", "actor.lr_schedule=cosine",
            f"trainer.total_steps={N}", "trainer.val_freq=2", "trainer.save_freq=1", "trainer.keep_last=2",
            "trainer.logger=[jsonl]", f"trainer.runs_dir={runs}", "model.path=rlkit:tiny-qwen2",
            "trainer.workers=in_process", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as patch:  # the subprocesses build the tiny model in the test cache too
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        root = tmp_path_factory.mktemp("sft")
        splits = build_synthetic(task="add", n_train=24, n_test=8, seed=5)
        data = write_parquet(sft_rows(splits["train"]), root / "train.parquet")
        val = write_parquet(sft_rows(splits["test"]), root / "val.parquet")
        runs = root / "runs"
        args = overrides(data, val, runs)
        run_cli_in_process("train", "sft", *args, "--run-id", "reference")
        yield {"root": root, "runs": runs, "args": args, "val": val, "reference": metrics(runs / "reference")}


def test_sft_loss_goes_down_and_validates_on_schedule(world) -> None:
    reference = world["reference"]
    assert [r["step"] for r in reference] == list(range(N + 1))  # step 0: validation before training
    assert [r["step"] for r in reference if "val/loss" in r] == [0, 2, 4, 6]
    trained = reference[1:]
    assert all(r["perf/loss_tokens"] == 16.0 for r in trained)  # 8 rows x (answer digit + EOS)
    assert trained[-1]["actor/loss"] < 0.7 * trained[0]["actor/loss"]
    assert reference[-1]["val/loss"] < 0.7 * reference[0]["val/loss"]
    assert trained[0]["actor/lr"] == pytest.approx(3e-3 * 2 / 2) and trained[-1]["actor/lr"] == pytest.approx(0.0)
    assert all(r["actor/grad_norm"] > 0 and 0 <= r["actor/token_accuracy"] <= 1 for r in trained)


def test_the_export_holds_the_trained_weights_and_starts_an_rl_run(world) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.core.controller.preflight import check_inputs
    from rlkit.core.data.sft import read_sft_file, sft_batch, tokenize_sft_rows
    from rlkit.recipes.loader import load_config

    root, runs = world["root"], world["runs"]
    out = root / "export"
    run_cli_in_process("export", "reference", "--runs-dir", str(runs), "--out", str(out))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    examples = tokenize_sft_rows([("val", read_sft_file(str(world["val"]), "val"))], tokenizer, max_length=20)
    total, count = 0.0, 0
    for example in examples:  # transformers' own loss on the validation rows: the run's last val/loss
        ids = torch.tensor([example.prompt_ids + example.response_ids])
        labels = torch.tensor([[-100] * len(example.prompt_ids) + example.response_ids])
        with torch.no_grad():
            total += float(model(input_ids=ids, labels=labels).loss) * len(example.response_ids)
        count += len(example.response_ids)
    assert total / count == pytest.approx(world["reference"][-1]["val/loss"], rel=1e-4)
    assert sft_batch(examples, 0)["response_mask"].sum() == count
    # The warm start: an RL recipe takes the export as its model (the checks load it and its tokenizer).
    config = load_config("grpo-demo", [f"trainer.runs_dir={runs}"], model=str(out))
    assert check_inputs(config).model_path == str(out)
    info = json.loads((out / "rlkit_export.json").read_text())
    assert info["step"] == N and info["base_model"] == "rlkit:tiny-qwen2"


def test_sigkill_after_a_checkpoint_then_resume_is_exact(world) -> None:
    root, runs = world["root"], world["runs"]
    killed_after_checkpoint(["train", "sft", *world["args"]], runs, "killed", K, root / "killed.log")
    output = run_cli_in_process("resume", "killed", "--runs-dir", str(runs)).output
    assert "from checkpoint step_" in output
    assert_same_metrics(runs / "killed", world["reference"])
    assert json.loads((runs / "killed" / "status.json").read_text())["status"] == "finished"
