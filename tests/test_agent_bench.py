"""bench/agent_grpo.py end to end on a CPU (--tiny) with --host-profile: the multi-turn lane profiles one step's
processes with py-spy (a stand-in here, which writes down how it was called) and keeps each step's GPU-busy slot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.bench]

# Writes its arguments where py-spy would write its stacks (after --output), then exits.
FAKE_PY_SPY = """#!/bin/sh
while [ "$#" -gt 0 ]; do
  case "$1" in --output) out="$2"; shift ;; esac
  all="$all $1"; shift
done
echo "$all" > "$out"
"""


def test_the_agent_lane_profiles_the_asked_step_with_every_process(tmp_path) -> None:
    """Three steps, py-spy around step 2 only, sampling the bench's process and its children. (~35 s.)"""
    spy = tmp_path / "bin" / "py-spy"
    spy.parent.mkdir()
    spy.write_text(FAKE_PY_SPY)
    spy.chmod(0o755)
    env = {**os.environ, "PATH": f"{spy.parent}{os.pathsep}{os.environ['PATH']}"}
    out, profile = tmp_path / "agent.json", tmp_path / "profile"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "agent_grpo.py"), "--tiny", "--steps", "3",
                           "--workdir", str(tmp_path / "work"), "--out", str(out), "--host-profile", str(profile),
                           "--py-spy-step", "2", "--py-spy-seconds", "2"],
                          capture_output=True, text=True, timeout=400, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "done" and [s["agent/turns_mean"] for s in result["steps"]] == [3.0, 3.0, 3.0]
    # one entry a step; empty without nvidia-smi
    assert list(result["rollout_nvml_busy_by_step"]) == ["1", "2", "3"]
    called = (profile / "py-spy-step.txt").read_text().split()
    assert called[:2] == ["record", "--pid"] and called[2].isdigit() and int(called[2]) != os.getpid()
    assert "--subprocesses" in called
    assert called[called.index("--duration") + 1] == "3"  # the seconds asked, rounded up past the block's start
