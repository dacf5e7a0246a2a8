"""Failures end to end through the CLI: a killed worker, a hung phase, Ctrl-C, an unwritable run dir.

Faults are injected with RLKIT_FAULT (rlkit.core.cluster.faults); every run is a tiny one, and every
wait has a deadline well short of what a hang would cost. The signal and permission tests start their
own local Ray cluster, as a user's run does: a Ctrl-C to the process group reaches its Ray processes
too, and the dropped capability reaches its workers only as the run's own children.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli_in_process
from rlkit.core.state.checkpoint import latest_checkpoint, validate

pytestmark = pytest.mark.slow

# The transformers rollout engine starts in seconds; these tests are about the controller.
TINY = ["trainer.logger=[jsonl]", "rollout.name=hf", "data.train_batch_size=4", "actor.mini_batch_size=4",
        "rollout.n=2", "trainer.val_freq=0"]  # no validation: metrics.jsonl holds the trained steps only
RUN_TIMEOUT_S = 300  # a tiny run takes well under a minute on 2 busy cores


def env_with(fault: str | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RLKIT_FAULT", None)
    if fault:
        env["RLKIT_FAULT"] = fault
    return env


def rlkit(*args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlkit.cli.main", *args], capture_output=True, text=True,
                          env=env_with(fault), timeout=RUN_TIMEOUT_S)


def start(*args: str, fault: str | None = None, preexec_fn=None) -> subprocess.Popen:
    """The CLI in its own session, so a test can signal its process group as a terminal's Ctrl-C does."""
    return subprocess.Popen([sys.executable, "-m", "rlkit.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_with(fault), start_new_session=True,
                            preexec_fn=preexec_fn)


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n{proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.05)


def steps_logged(run: Path) -> list[int]:
    metrics = run / "metrics.jsonl"
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.exists() else []


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def status(run: Path) -> str:
    return json.loads((run / "status.json").read_text())["status"]


@pytest.mark.shared_ray
def test_killed_worker_is_named_and_the_run_resumes_from_its_last_checkpoint(tmp_path):
    run = tmp_path / "killed"
    proc = rlkit("train", "grpo-demo", *TINY, "trainer.total_steps=3", "trainer.save_freq=1",
                 f"trainer.runs_dir={tmp_path}", "--run-id", "killed", fault="kill:worker0.update_actor:2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = error_line(proc.stderr)
    assert "worker rank 0 (node 0, host " in line and "died during 'update_actor'" in line
    assert "killed by a signal (SIGKILL" in line
    assert "Traceback" not in proc.stderr
    assert f"The last complete checkpoint is step 1 ({run}/checkpoints/step_00000001). Continue with: " \
           f"rlkit resume killed --runs-dir {tmp_path}" in proc.stderr
    assert status(run) == "failed"

    # The command it gives, in this process (the CLI's own code; a subprocess would add only its imports)
    run_cli_in_process("resume", "killed", "--runs-dir", str(tmp_path))
    assert steps_logged(run) == [1, 2, 3] and latest_checkpoint(run).step == 3 and status(run) == "finished"


@pytest.mark.shared_ray
def test_hung_phase_stops_at_its_deadline_naming_the_late_worker(tmp_path):
    proc = rlkit("train", "grpo-demo", *TINY, "trainer.total_steps=3", "trainer.phase_timeout_s=3",
                 f"trainer.runs_dir={tmp_path}", "--run-id", "hung", fault="sleep=600:worker0.generate:2")
    assert proc.returncode == 1, proc.stderr[-3000:]  # and subprocess.run's timeout did not fire
    line = error_line(proc.stderr)
    assert "'generate' did not finish within 3 s (trainer.phase_timeout_s)" in line
    assert "worker rank 0 (node 0, host " in line and "still in 'generate' after 3 s" in line
    assert status(tmp_path / "hung") == "failed"

    # No checkpoint yet (the first is at the end): the message gives the command that starts the run
    # again under its id, which reuses its directory.
    restart = re.search(r"Start the run again under the same id with: rlkit (train .*)$", proc.stderr, re.M)
    assert restart, proc.stderr[-3000:]
    again = run_cli_in_process(*restart.group(1).split())  # in this process, as above
    assert "held no checkpoint (its run stopped before the first one): starting run hung there again" in \
        " ".join(again.output.split())
    assert steps_logged(tmp_path / "hung") == [1, 2, 3] and status(tmp_path / "hung") == "finished"


def test_sigterm_then_ctrl_c_each_finish_the_step_checkpoint_it_and_resume_continues(tmp_path):
    """A container stop (docker stop, Kubernetes) is a SIGTERM to the main process only; the resumed run is then
    stopped by a terminal's Ctrl-C, a SIGINT to its whole process group (its Ray processes too)."""
    run = tmp_path / "stopped"
    proc = start("train", "grpo-demo", *TINY, "trainer.total_steps=100", f"trainer.runs_dir={tmp_path}",
                 "--run-id", "stopped")
    wait_until(lambda: steps_logged(run), proc, "a first step")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    step = steps_logged(run)[-1]
    assert "SIGTERM: finishing the current step, then saving a checkpoint and stopping" in stderr
    assert f"stopped by SIGTERM after step {step}. The last complete checkpoint is step {step}" in stderr
    assert f"Continue with: rlkit resume stopped --runs-dir {tmp_path}" in stderr
    assert "Traceback" not in stderr
    assert latest_checkpoint(run).step == step and status(run) == "interrupted"

    proc = start("resume", "stopped", "--runs-dir", str(tmp_path))
    wait_until(lambda: len(steps_logged(run)) > step, proc, "a step of the resumed run")
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    last = steps_logged(run)[-1]
    assert steps_logged(run) == list(range(1, last + 1)) and last > step  # continued where it stopped
    assert "SIGINT: finishing the current step, then saving a checkpoint and stopping" in stderr
    assert f"stopped by SIGINT after step {last}. The last complete checkpoint is step {last}" in stderr
    assert "Traceback" not in stderr
    assert latest_checkpoint(run).step == last and status(run) == "interrupted"


def test_second_ctrl_c_stops_at_once(tmp_path):
    run = tmp_path / "twice"
    proc = start("train", "grpo-demo", *TINY, "trainer.total_steps=3", "trainer.save_freq=1",
                 f"trainer.runs_dir={tmp_path}", "--run-id", "twice", fault="sleep=600:worker0.generate:2")
    wait_until((run / "checkpoints" / "step_00000001" / "COMPLETE").exists, proc, "step 1's checkpoint")
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)  # step 2 hangs in generate, so only a second Ctrl-C ends it
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr[-3000:]
    assert "stopped at once by SIGINT after step 1. The last complete checkpoint is step 1" in stderr
    assert status(run) == "interrupted"


def _drop_root_override() -> None:
    """Make root obey file permissions in the child (and its Ray workers): drop CAP_DAC_OVERRIDE."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unwritable_run_dir_during_a_save_names_the_path_and_keeps_the_last_checkpoint(tmp_path):
    run = tmp_path / "readonly"
    writing = run / "checkpoints" / ".tmp-step_00000002"
    proc = start("train", "grpo-demo", *TINY, "trainer.total_steps=3", "trainer.save_freq=1",
                 f"trainer.runs_dir={tmp_path}", "--run-id", "readonly", fault="sleep=5:worker0.save_checkpoint:2",
                 preexec_fn=_drop_root_override if os.geteuid() == 0 else None)
    wait_until(writing.exists, proc, "the write of checkpoint 2")
    for folder in (run, run / "checkpoints", writing):  # while the worker is about to write its shards
        folder.chmod(0o555)
    try:
        _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        for folder in (run, run / "checkpoints", writing):
            folder.chmod(0o755)
    assert proc.returncode == 1, stderr[-3000:]
    line = error_line(stderr)
    assert f"could not write the checkpoint of step 2 to {writing}: [Errno 13] Permission denied: '{writing}/" in line
    assert "The last complete checkpoint is step 1" in stderr
    assert validate(run / "checkpoints" / "step_00000001") is None  # intact, marker and all
    assert latest_checkpoint(run).step == 1
