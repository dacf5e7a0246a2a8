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


def test_a_cuda_device_where_triton_does_not_build_keeps_torchs_kernels(monkeypatch, caplog) -> None:
    """The probe fails (here: no CUDA on this machine; on a GPU, no C compiler for Triton's launcher): a warning
    once, torch's kernels, and no second probe. Where it runs, the Triton kernels, whole logits one chunk."""
    probes = []
    probe = logprobs._probe_triton
    monkeypatch.setattr(logprobs, "_probe_triton", lambda device: probes.append(device) or probe(device))
    monkeypatch.setattr(logprobs, "_triton_ok", {})
    cuda = torch.device("cuda", 0)
    with caplog.at_level("WARNING", logger=logprobs.__name__):
        assert logprobs._kernels_on(cuda) == (logprobs._kernels, True)
        assert logprobs._kernels_on(cuda) == (logprobs._kernels, True)
    assert probes == [cuda]
    assert [r.message.split(" (")[0] for r in caplog.records] == ["Triton log-prob kernels unavailable on cuda:0"]

    pytest.importorskip("triton")
    from rlkit.core.train import logprob_triton

    monkeypatch.setattr(logprobs, "_probe_triton", lambda device: None)
    monkeypatch.setattr(logprobs, "_triton_ok", {})
    assert logprobs._kernels_on(cuda) == (logprob_triton.KERNELS, False)


def test_the_kernels_under_tritons_interpreter() -> None:
    """tests/triton_interpreted_checks.py in a child pytest with TRITON_INTERPRET=1 (set before triton's import)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(CHECKS.parents[1])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", str(CHECKS)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=CHECKS.parents[1])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "9 passed" in run.stdout, run.stdout[-2000:]  # none skipped
