"""The Triton log-prob kernels: which tensors take them, and their values under Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.core.train import logprobs

CHECKS = Path(__file__).resolve().parent / "triton_interpreted_checks.py"


def test_cpu_tensors_take_torchs_chunk_kernels() -> None:
    assert logprobs._kernels_on(torch.device("cpu")) == (logprobs._kernels, True)


def test_the_kernels_under_tritons_interpreter() -> None:
    """tests/triton_interpreted_checks.py in a child pytest with TRITON_INTERPRET=1 (set before triton's import)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(CHECKS.parents[1])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", str(CHECKS)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=CHECKS.parents[1])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "9 passed" in run.stdout, run.stdout[-2000:]  # none skipped
