"""LoRA-GRPO through the CLI: a killed and resumed run logs the uninterrupted run's metrics bit
for bit, and a weight sync broken on purpose (RLKIT_FAULT=noop:engine-load:N) stops the run
with the weight-sync check's message instead of training on a stale engine's samples. The two ranks are Ray
workers on the tests' shared head; every other run's worker is an object in the CLI's process
(trainer.workers=in_process: no Ray, no worker processes): the uninterrupted run and the resume go through the CLI
in the test's process (conftest.run_cli_in_process), the run to kill and the broken syncs are child processes
forked warm (tests/warm_cli.py): a fault's arrival counts start at 0 in each."""

from __future__ import annotations

import json
import re
from typing import Iterator

import pytest
import warm_cli
from conftest import run_cli_in_process
from test_resume_e2e import (
    START_TIMEOUT_S,
    assert_same_metrics,
    killed_after_checkpoint,
    metrics,
    run_cli,
    training_overrides,
)

from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic

pytestmark = [pytest.mark.slow]

STEPS, KILL_AFTER = 4, 2
# Dropout on the adapters draws from the torch RNG in every update: resume must restore it too.
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.1", "actor.lr=1e-2"]
IN_PROCESS = ["trainer.workers=in_process", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("lora")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        splits = build_synthetic(task="echo", n_train=12, n_test=5, seed=3)
        data = write_parquet(splits["train"], root / "echo12.parquet")
        val_data = write_parquet(splits["test"], root / "echo-val5.parquet")  # validation runs on the engine too
        runs = root / "runs"
        lora = LORA + [f"trainer.total_steps={STEPS}"]
        yield {"root": root, "runs": runs, "overrides": training_overrides(data, runs) + lora,
               "with_validation": training_overrides(data, runs, val_data) + lora}


def test_lora_grpo_killed_and_resumed_is_exact(world) -> None:
    root, runs = world["root"], world["runs"]
    overrides = [*world["with_validation"], *IN_PROCESS]
    run_cli_in_process("train", "grpo-demo", *overrides, "--run-id", "reference")
    reference = metrics(runs / "reference")
    assert [r["step"] for r in reference] == list(range(STEPS + 1))  # step 0: validation before training
    assert reference[-1]["actor/kl_loss"] > 0  # the adapters moved the policy

    killed_after_checkpoint(["train", "grpo-demo", *overrides], runs, "killed", KILL_AFTER, root / "killed.log")
    output = " ".join(run_cli_in_process("resume", "killed", "--runs-dir", str(runs)).output.split())
    assert int(re.search(r"from checkpoint step_(\d+)", output).group(1)) in (KILL_AFTER, KILL_AFTER + 1)
    assert_same_metrics(runs / "killed", reference, runs / "reference")


@pytest.mark.shared_ray
def test_lora_on_two_ranks_gives_the_engine_the_trainers_policy(world) -> None:
    """Adapters sharded over two ranks, merged from gathered full tensors: the engine's log-probs
    match the trainer's at float precision after every sync (the run's own check holds them to 1e-5)."""
    runs = world["runs"]
    run_cli(["train", "grpo-demo", *world["overrides"], "trainer.n_gpus_per_node=2", "trainer.total_steps=3",
             "rollout.log_prob_tolerance=1e-5", "--run-id", "two-ranks"], world["root"] / "two-ranks.log")
    records = metrics(runs / "two-ranks")
    assert len(records) == 3 and all(r["rollout/log_prob_diff"] < 1e-5 for r in records)
    assert records[-1]["actor/kl_loss"] > 0


@pytest.mark.parametrize("fault, extra, failed_step, reason", [
    # No sync reaches the engine: caught at the first one that changed the weights after a rollout.
    ("noop:engine-load:1,noop:engine-load:2", [], 2, "not receiving the trained weights"),
    # A later sync is dropped: the next check step sees the engine's log-probs off the trainer's.
    ("noop:engine-load:3", ["rollout.log_prob_tolerance=1e-4"], 4, "differ from the trainer's by"),
])
def test_a_broken_weight_sync_stops_the_run_with_the_reason(world, fault, extra, failed_step, reason,
                                                           monkeypatch) -> None:
    runs = world["runs"]
    run_id = f"broken-{failed_step}"
    monkeypatch.setenv("RLKIT_FAULT", fault)
    code, output = warm_cli.run(["train", "grpo-demo", *world["overrides"], *extra, *IN_PROCESS, "--run-id", run_id],
                                runs.parent / f"{run_id}.log", timeout=START_TIMEOUT_S)
    output = " ".join(output.split())
    assert code == 1, output[-3000:]
    assert f"weight-sync check failed at step {failed_step}: " in output and reason in output, output[-3000:]
    assert "Traceback" not in output
    status = json.loads((runs / run_id / "status.json").read_text())
    assert status["status"] == "failed" and "WeightSyncError" in status["error"]
