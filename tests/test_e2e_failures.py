"""Failures end to end through `rlkit train`, injected with RLKIT_FAULT (rlkit.core.faults)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

# The transformers rollout engine starts in seconds; these tests are about the controller.
TINY = ["trainer.logger=[jsonl]", "rollout.name=hf", "data.train_batch_size=4", "actor.mini_batch_size=4",
        "rollout.n=2"]


def rlkit(*args: str, fault: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RLKIT_FAULT", None)
    if fault:
        env["RLKIT_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "rlkit.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_killed_worker_stops_the_run_with_a_named_error(tmp_path):
    proc = rlkit("train", "grpo-demo", *TINY, "trainer.total_steps=3", f"trainer.runs_dir={tmp_path}",
                 "--run-id", "killed", fault="kill:worker0.update_actor:2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = error_line(proc)
    assert "worker rank 0 (node 0, host " in line and "died during 'update_actor'" in line
    assert "killed by a signal (SIGKILL" in line
    assert "Traceback" not in proc.stderr


def test_hung_phase_stops_at_its_deadline_naming_the_late_worker(tmp_path):
    started = time.monotonic()
    proc = rlkit("train", "grpo-demo", *TINY, "trainer.total_steps=3", "trainer.phase_timeout_s=3",
                 f"trainer.runs_dir={tmp_path}", "--run-id", "hung", fault="sleep=600:worker0.generate:2")
    assert time.monotonic() - started < 300  # not the 600 s the worker sleeps
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = error_line(proc)
    assert "'generate' did not finish within 3 s (trainer.phase_timeout_s)" in line
    assert "worker rank 0 (node 0, host " in line and "still in 'generate' after 3 s" in line


def test_exception_in_a_worker_is_named_with_its_traceback(tmp_path):
    proc = rlkit("train", "grpo-demo", *TINY, "trainer.total_steps=2", f"trainer.runs_dir={tmp_path}",
                 "--run-id", "raised", fault="raise:worker0.sync_weights:1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = error_line(proc)
    assert "worker rank 0 (node 0, host " in line
    assert "raised InjectedFault during 'sync_weights': rlkit fault injection: raise at worker0.sync_weights #1" in line
    assert 'in sync_weights\n    self.phase = "sync_weights"' in proc.stderr  # the worker's own traceback
