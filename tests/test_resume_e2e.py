"""Exact resume, proven by killing runs: every resumed run logs the uninterrupted run's metrics.

One uninterrupted CPU run of N steps is the reference. Then (1) a run is SIGKILLed after
step K's checkpoint and resumed; (2) a run is SIGKILLed halfway through writing step K+1's
checkpoint and resumed; (3) the reference's newest checkpoint is truncated and the run is
resumed from the one before. Each time, metrics.jsonl holds every step once and all
non-timing metrics equal the reference's bit for bit (the HF engine on CPU is deterministic,
see docs/resume.md). K is the end of an epoch (12 prompts, 4 per step), so resuming at an
epoch boundary is covered, and the KL loss pins that the reference policy stays the base model.
Validation is on (before training, every 2 steps, greedy and 2 samples): its metrics and
responses match too, and a run without it trains exactly the same steps.

Every run has in-process workers (trainer.workers=in_process): the CLI runs in the test's process, and a run to
SIGKILL is one child process forked warm (tests/warm_cli.py). SIGKILL, then resume, on Ray: tests/test_chaos_resume.py
(whose uninterrupted run has in-process workers, so it also pins that both kinds give the same numbers) and
tests/test_async_e2e.py. The helpers here (a killed run, its resume, the comparison) serve those tests too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
import warm_cli
from conftest import run_cli_in_process
from ray_head import descendants, is_zombie, wait_until_idle

from rlkit.core.cluster.faults import HANG_MESSAGE
from rlkit.core.controller.tracking import is_timing_key
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic
from rlkit.core.state.checkpoint import MARKER, step_dir_name
from rlkit.core.state.records import read_record, recorded_steps

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
N, K = 6, 3
START_TIMEOUT_S = 240
IN_PROCESS = ["trainer.workers=in_process", "trainer.device=cpu"]


def training_overrides(data: Path, runs: Path, val_data: Path | None = None) -> list[str]:
    """A small run that exercises every piece of state a resume must restore (validation with `val_data`)."""
    validation = [f"data.val_files=[{val_data}]", "trainer.val_freq=2", "trainer.val_n=2"] if val_data else []
    return [
        f"data.train_files=[{data}]", "data.train_batch_size=4", "data.max_response_length=2", *validation,
        "rollout.name=hf", "rollout.n=4", "actor.mini_batch_size=2",  # two optimizer steps per RL step
        # The entropy bonus moves the policy even in steps where every reward is 0, so the
        # KL to the reference, the optimizer's moments and the schedule all matter.
        "actor.entropy_coeff=0.01", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1",
        "actor.lr_schedule=cosine", "actor.warmup_steps=2",
        f"trainer.total_steps={N}", "trainer.save_freq=1", "trainer.keep_last=2",
        "trainer.logger=[jsonl]", f"trainer.runs_dir={runs}",
    ]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **extra}


def start(args: list[str], log: Path, **extra_env: str) -> subprocess.Popen:
    """The CLI in its own session, so the whole tree (Ray's processes too) can be killed as one group."""
    return subprocess.Popen([sys.executable, "-m", "rlkit.cli.main", *args], cwd=REPO, env=env(**extra_env),
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def run_cli(args: list[str], log: Path) -> str:
    proc = start(args, log)
    try:
        rc = proc.wait(timeout=START_TIMEOUT_S)
    finally:
        kill_tree(proc)
    output = log.read_text()
    assert rc == 0, output[-4000:]
    return output


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group, then make sure none of its processes (Ray's included) survive; on
    the tests' shared Ray head (tests/ray_head.py), that the run's workers are gone too."""
    tree = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 30
    alive = tree
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists() and not is_zombie(pid)}
        time.sleep(0.2)
    for pid in alive:  # clean up before failing, so a failing test leaks nothing either
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"processes outlived the killed run: {sorted(alive)}"
    wait_until_idle()


def wait_for(condition, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tree(proc)
            pytest.fail(f"never saw {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)


def killed_after_checkpoint(args: list[str], runs: Path, run_id: str, step: int, log: Path) -> Path:
    """`rlkit ARGS --run-id RUN_ID`, SIGKILLed (its whole process tree) as soon as step `step`'s
    checkpoint is complete; returns that checkpoint's directory. A run with in-process workers is one
    process, forked warm (tests/warm_cli.py); a Ray run is a fresh CLI process with its cluster."""
    marker = runs / run_id / "checkpoints" / step_dir_name(step) / MARKER
    if "trainer.workers=in_process" in args:
        warm_killed_when([*args, "--run-id", run_id], log, marker.exists, f"step {step}'s checkpoint")
        return marker.parent
    proc = start([*args, "--run-id", run_id], log)
    wait_for(marker.exists, proc, log, f"step {step}'s checkpoint")
    kill_tree(proc)
    return marker.parent


def warm_killed_when(args: list[str], log: Path, condition, what: str, **extra_env: str) -> None:
    """`rlkit ARGS` (in-process workers: one process) in a child forked warm (tests/warm_cli.py) with `extra_env`,
    SIGKILLed as soon as `condition()` holds."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env(**extra_env).items():
            patch.setenv(key, value)
        child = warm_cli.start(args, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition() and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)  # gone already if it ended: then the check below fails
    child.join()
    assert condition(), f"never saw {what}:\n{log.read_text()[-4000:]}"


def resumed(runs: Path, run_id: str, log: Path) -> str:
    """`rlkit resume RUN_ID`'s output, whitespace collapsed (rich wraps long lines)."""
    return " ".join(run_cli(["resume", run_id, "--runs-dir", str(runs)], log).split())


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(run: Path, reference: list[dict], reference_run: Path | None = None) -> None:
    """Each step logged exactly once, with the reference's values; and the same validation responses."""
    records = metrics(run)
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    for got, want in zip(records, reference):
        # ... and the same metrics, but that a run's first step carries its own start-up's (docs/startup.md)
        assert {k for k in got if not k.startswith("startup/")} == {k for k in want if not k.startswith("startup/")}
        mismatched = {k: (got[k], want[k]) for k in got if not is_timing_key(k) and got[k] != want[k]}
        assert not mismatched, f"step {got['step']}: {mismatched}"
    if reference_run is not None:
        files = sorted(p.name for p in (reference_run / "validation").glob("step_*.jsonl"))
        assert sorted(p.name for p in (run / "validation").glob("step_*.jsonl")) == files
        for name in files:
            assert (run / "validation" / name).read_text() == (reference_run / "validation" / name).read_text()


def assert_same_records(run: Path, reference_run: Path) -> None:
    """Recording is on by default, keeping the last 3 steps: a killed and resumed run keeps the same batches."""
    assert recorded_steps(reference_run) == recorded_steps(run) == [N - 2, N - 1, N]
    assert not list((run / "rollouts").glob(".*.tmp"))  # a write the kill cut short was cleaned on resume
    for step in recorded_steps(run):
        got, want = read_record(run, step).batch, read_record(reference_run, step).batch
        assert set(got.tensors) == set(want.tensors) and got.meta == want.meta
        assert all(torch.equal(got[key], want[key]) for key in want.tensors), step


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as patch:  # the subprocesses build the tiny model in the test cache too
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        yield reference_run(tmp_path_factory.mktemp("resume"))


def reference_run(root: Path) -> dict:
    splits = build_synthetic(task="echo", n_train=12, n_test=5, seed=3)
    data = write_parquet(splits["train"], root / "echo12.parquet")
    val_data = write_parquet(splits["test"], root / "echo-val5.parquet")
    runs = root / "runs"
    overrides = training_overrides(data, runs, val_data)
    run_cli_in_process("train", "grpo-demo", *overrides, *IN_PROCESS, "--run-id", "reference")
    reference = metrics(runs / "reference")
    assert [r["step"] for r in reference] == list(range(N + 1))  # step 0: the validation before training
    assert all(r["actor/kl_loss"] > 0 for r in reference[2:])
    assert [r["step"] for r in reference if "val/reward/mean@2" in r] == [0, 2, 4, 6]
    return {"root": root, "runs": runs, "data": data, "overrides": overrides, "reference": reference}


def test_sigkill_after_a_checkpoint_then_resume_is_exact(world) -> None:
    root, runs = world["root"], world["runs"]
    killed_after_checkpoint(["train", "grpo-demo", *world["overrides"], *IN_PROCESS], runs, "killed", K,
                            root / "killed.log")
    status = json.loads((runs / "killed" / "status.json").read_text())
    # What a SIGKILL leaves behind; status.json is rewritten just after the marker, so the kill may beat it.
    assert status["status"] == "running" and status["step"] >= K - 1

    output = " ".join(run_cli_in_process("resume", "killed", "--runs-dir", str(runs)).output.split())
    resumed_from = int(re.search(r"from checkpoint step_(\d+)", output).group(1))
    assert resumed_from in (K, K + 1)  # the kill lands within one poll of the marker appearing
    assert_same_metrics(runs / "killed", world["reference"], runs / "reference")
    assert_same_records(runs / "killed", runs / "reference")
    assert json.loads((runs / "killed" / "status.json").read_text())["status"] == "finished"


def test_sigkill_while_writing_a_checkpoint_then_resume_is_exact(world) -> None:
    root, runs = world["root"], world["runs"]
    log = root / "torn.log"
    warm_killed_when(["train", "grpo-demo", *world["overrides"], *IN_PROCESS, "--run-id", "torn"], log,
                     lambda: log.exists() and HANG_MESSAGE in log.read_text(), "the hang inside the checkpoint write",
                     RLKIT_FAULT=f"hang:checkpoint-before-marker:{K + 1}")
    checkpoints = runs / "torn" / "checkpoints"
    assert (checkpoints / f".tmp-{step_dir_name(K + 1)}").is_dir()
    assert not (checkpoints / step_dir_name(K + 1)).exists()

    output = " ".join(run_cli_in_process("resume", "torn", "--runs-dir", str(runs)).output.split())
    assert f"ignoring .tmp-{step_dir_name(K + 1)}" in output
    assert f"from checkpoint {step_dir_name(K)}" in output
    assert_same_metrics(runs / "torn", world["reference"], runs / "reference")
    assert_same_records(runs / "torn", runs / "reference")


def test_truncated_newest_checkpoint_resumes_from_the_previous_one(world) -> None:
    runs = world["runs"]
    shutil.copytree(runs / "reference", runs / "truncated")
    newest = runs / "truncated" / "checkpoints" / step_dir_name(N)
    shard = newest / "policy" / "shards" / "__0_0.distcp"
    size = shard.stat().st_size
    with shard.open("r+b") as handle:
        handle.truncate(size // 2)

    output = " ".join(run_cli_in_process("resume", "truncated", "--runs-dir", str(runs)).output.split())
    assert (f"skipping checkpoint {step_dir_name(N)}: policy/shards/__0_0.distcp has {size // 2} bytes, "
            f"the manifest says {size}") in output
    assert f"from checkpoint {step_dir_name(N - 1)}" in output
    assert_same_metrics(runs / "truncated", world["reference"], runs / "reference")


def test_validation_leaves_training_untouched(world) -> None:
    """The same run without validation trains the same steps: validating draws nothing from the
    training RNG, the data order or the engines' state."""
    runs = world["runs"]
    run_cli_in_process("train", "grpo-demo", *world["overrides"], *IN_PROCESS, "data.val_files=[]",
                       "--run-id", "no-val")
    trained = [{k: v for k, v in r.items() if not k.startswith("val/") and k != "timing/val"}
               for r in world["reference"][1:]]
    assert_same_metrics(runs / "no-val", trained)
    assert not (runs / "no-val" / "validation").exists()
