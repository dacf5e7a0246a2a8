"""`rlkit train dpo` through the CLI on the tiny model and GSM8K pairs: held-out accuracy of chosen
over rejected rises, kill + resume gives the uninterrupted run's metrics bit for bit, two workers give
one worker's numbers, and with LoRA the reference is the policy with its adapters off (bad pairs at
preflight: tests/test_dpo_config.py).

The workers are objects in the CLI's process (trainer.workers=in_process: no Ray, no worker processes), so the
runs go through the CLI in the test's process (conftest.run_cli_in_process); the run to kill is a child
process (forked warm: tests/warm_cli.py), which the SIGKILL needs, and the two-worker run has Ray workers on the tests' shared head.

The data: `rlkit prep-data gsm8k-pairs` rows from the real GSM8K files, made to fit the tiny model's
character vocabulary (lowercase letters, digits, a few signs) and short: the question's last 24
characters, each response's last 24 (which hold the final calculation and '#### N'). What a model
this small can learn from them is the answers' look: right answers end in 0 (36% of GSM8K) far more
often than the seeded wrong ones (7%), which makes held-out pairs (the test split) separable.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterator

import pytest
from conftest import GSM8K, run_cli_in_process
from test_resume_e2e import assert_same_metrics, killed_after_checkpoint, metrics, run_cli

from rlkit.core.data.builders import write_parquet
from rlkit.core.tiny import CHARACTERS

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not GSM8K.is_dir(), reason="the real GSM8K files are not here")]

N, K = 8, 4
KEEP = 24
IN_PROCESS = ["trainer.workers=in_process", "trainer.device=cpu"]


def tiny_text(text: str) -> str:
    """Lowercased, without characters the tiny vocabulary lacks, the last KEEP characters."""
    kept = "".join(c for c in text.lower().replace("\n", " ") if c in CHARACTERS)
    return re.sub(" +", " ", kept).strip()[-KEEP:]


def tiny_pairs(rows: list[dict]) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": tiny_text(row["extra_info"]["question"])}],
             "chosen": tiny_text(row["chosen"]), "rejected": tiny_text(row["rejected"])} for row in rows]


def overrides(data: Path, val: Path, runs: Path) -> list[str]:
    return [f"data.train_files=[{data}]", f"data.val_files=[{val}]", "data.train_batch_size=64",
            "actor.mini_batch_size=32",  # two optimizer steps a step
            "data.max_prompt_length=32", "data.max_response_length=32",
            "actor.micro_batch_tokens=512",  # several micro-batches of whole pairs
            "actor.lr=1e-3", "actor.warmup_steps=0", "dpo.beta=0.1",
            f"trainer.total_steps={N}", "trainer.val_freq=4", "trainer.save_freq=2", "trainer.keep_last=2",
            "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]", f"trainer.runs_dir={runs}",
            "model.path=rlkit:tiny-qwen2", *IN_PROCESS]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    from rlkit.core.data.gsm8k_pairs import build_gsm8k_pairs

    with pytest.MonkeyPatch.context() as patch:  # the subprocesses build the tiny model in the test cache too
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        root = tmp_path_factory.mktemp("dpo")
        splits = build_gsm8k_pairs(str(GSM8K))
        data = write_parquet(tiny_pairs(splits["train"][:512]), root / "train.parquet")
        val = write_parquet(tiny_pairs(splits["test"][:128]), root / "held-out.parquet")
        runs = root / "runs"
        args = overrides(data, val, runs)
        run_cli_in_process("train", "dpo", *args, "--run-id", "reference")
        odd = write_parquet(tiny_pairs(splits["test"][:127]), root / "held-out-127.parquet")
        yield {"root": root, "runs": runs, "args": args, "odd_val": odd, "reference": metrics(runs / "reference")}


def test_dpo_raises_held_out_accuracy_of_chosen_over_rejected(world) -> None:
    reference = world["reference"]
    assert [r["step"] for r in reference] == list(range(N + 1))  # step 0: validation before training
    assert [r["step"] for r in reference if "val/loss" in r] == [0, 4, 8]
    before, after = reference[0], reference[-1]
    # Before training the policy is the reference: every implicit reward is 0 and the loss ln 2.
    assert before["val/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert before["val/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert before["val/rewards/accuracies"] == 0.0  # a tie is not a win
    assert after["val/rewards/accuracies"] >= 0.6
    assert after["val/rewards/margins"] > 0.1 and after["val/loss"] < math.log(2) - 0.05
    for record in reference[1:]:  # the training metrics of every step, TRL's names
        assert record["rewards/margins"] == pytest.approx(record["rewards/chosen"] - record["rewards/rejected"])
        assert 0.0 <= record["rewards/accuracies"] <= 1.0 and record["actor/grad_norm"] > 0


def test_sigkill_after_a_checkpoint_then_resume_is_exact(world) -> None:
    root, runs = world["root"], world["runs"]
    killed_after_checkpoint(["train", "dpo", *world["args"]], runs, "killed", K, root / "killed.log")
    output = " ".join(run_cli_in_process("resume", "killed", "--runs-dir", str(runs)).output.split())
    assert re.search(r"from checkpoint step_0*[46]\b", output)
    assert_same_metrics(runs / "killed", world["reference"])
    assert json.loads((runs / "killed" / "status.json").read_text())["status"] == "finished"


def test_lora_dpo_takes_the_adapters_off_model_as_its_reference(world) -> None:
    # LoRA's B starts at 0, so before the first update the policy is the base: every reward is 0. Were the
    # reference the adapted policy itself, the rewards would stay 0; with the adapters switched off for it
    # (no second copy of the model), they move once the adapters train.
    runs = world["runs"]
    args = [a for a in world["args"] if not a.startswith(("trainer.total_steps", "trainer.val_freq", "actor.lr",
                                                          "actor.mini_batch_size"))]
    run_cli_in_process("train", "dpo", *args, "trainer.total_steps=3", "trainer.val_freq=3", "actor.lr=1e-2",
                       "actor.mini_batch_size=64", "model.lora.rank=8", "model.lora.alpha=16", "--run-id", "lora")
    records = metrics(runs / "lora")
    assert records[0]["val/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert records[1]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # one optimizer step: measured before it
    assert records[-1]["val/rewards/margins"] > 0.01 and records[-1]["val/rewards/accuracies"] > 0.5


@pytest.mark.shared_ray
def test_two_workers_give_the_one_worker_numbers(world) -> None:
    # Each worker holds whole pairs of every mini-batch; loss and rewards are means over the mini-batch's
    # pairs whichever rank holds them. 127 held-out pairs on 2 workers: one filler pair (loss mask 0)
    # evens out the ranks and must count for nothing.
    root, runs = world["root"], world["runs"]
    args = [a for a in world["args"] if not a.startswith(("trainer.total_steps", "trainer.val_freq", "data.val_files",
                                                          "trainer.n_gpus_per_node"))]
    args += ["trainer.total_steps=2", "trainer.val_freq=2", f"data.val_files=[{world['odd_val']}]"]
    run_cli_in_process("train", "dpo", *args, "trainer.n_gpus_per_node=1", "--run-id", "workers1")
    on_ray = [a for a in args if a not in IN_PROCESS]
    run_cli(["train", "dpo", *on_ray, "trainer.n_gpus_per_node=2", "--run-id", "workers2"], root / "workers2.log")
    one, two = metrics(runs / "workers1"), metrics(runs / "workers2")
    assert [r["step"] for r in two] == [0, 1, 2]
    for a, b in zip(one, two):
        keys = [k for k in a if k.startswith(("actor/loss", "rewards/", "val/"))]
        assert len(keys) >= 5
        assert {k: b[k] for k in keys} == pytest.approx({k: a[k] for k in keys}, abs=1e-5)
