"""bench/vllm_rollout.py end to end on a CPU (--tiny) with --sleep-mode: the engine alone as a colocated trainer
runs it, woken with its weights loaded again before each generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def test_the_engine_alone_in_sleep_mode_reloads_its_weights_before_every_timed_generate(tmp_path) -> None:
    """Two ways, each timed twice: four generates, each after a weight load (vLLM logs every in-place reload; on a
    CPU there is no sleep mode, so only the load shows). (~20 s.)"""
    out = tmp_path / "rollout.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "vllm_rollout.py"), "--tiny", "--sleep-mode",
                           "--workdir", str(tmp_path / "work"), "--out", str(out),
                           "--ways", "with_log_probs,without_log_probs"],
                          capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["args"]["sleep_mode"] is True
    assert set(result["runs"]) == {"with_log_probs", "without_log_probs"}
    assert all(len(run["seconds"]) == 2 and run["tokens_per_s"] > 0 for run in result["runs"].values())
    assert (proc.stdout + proc.stderr).count("Reloading and processing weights") == 4
