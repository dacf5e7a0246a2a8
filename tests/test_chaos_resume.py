"""A PPO run (critic, adaptive KL in the reward, multi-token responses) killed three times at fixed
points, continued each time as its messages say, logs exactly the uninterrupted run's metrics.

A small seeded instance of scripts/chaos_resume.py (which says how the kills work; its full,
randomised form and a recorded run are in docs/resume.md). Seed 28 draws: a worker SIGKILLed in
the critic's update of step 1 (before the first checkpoint, so the run is started again under its
id), a worker SIGKILLed in the old-log-prob pass of step 2, and the whole process tree SIGKILLed
halfway through writing step 4's checkpoint (then resumed from step 3). The uninterrupted run's
workers are in-process objects (--points-only), the killed runs' are Ray workers: equal metrics also pin
that both compute the same numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.core.controller.tracking import is_timing_key

# In `make test-bench` (2-2.5 min on 2 cores, more than `make test`'s 15 minutes have room for): each of its kills has
# a test of its own in `make test` (a killed worker and resume, a kill before the first checkpoint, a SIGKILL inside a
# checkpoint write, a PPO critic killed and resumed exactly on the asynchronous rollout); this is their composite on
# Ray against an in-process reference.
pytestmark = [pytest.mark.slow, pytest.mark.shared_ray, pytest.mark.bench]

REPO = Path(__file__).resolve().parents[1]


def test_killed_three_times_and_continued_the_run_logs_the_uninterrupted_metrics(tmp_path, tmp_path_factory):
    out = tmp_path / "chaos"
    env = {**os.environ, "RLKIT_CACHE": str(tmp_path_factory.getbasetemp() / "rlkit-cache")}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "chaos_resume.py"), "--out", str(out),
                           "--seed", "28", "--kills", "3", "--steps", "4", "--points-only"],
                          capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert [(k["kind"], k["where"]) for k in report["kills"]] == [
        ("worker-kill", "worker0.update_critic:1"), ("worker-kill", "worker0.log_probs/actor:2"),
        ("tree-kill", "checkpoint-before-marker:4")]
    assert report["kills"][0]["continued_with"].startswith("rlkit train ")  # no checkpoint yet: started again
    assert report["kills"][2]["continued_with"].startswith("rlkit resume chaos")
    assert [k["exit_code"] for k in report["kills"]] == [1, 1, None]
    assert report["steps"] == [1, 2, 3, 4] and report["each_step_once"]
    assert report["mismatches"] == {} and report["equal"]
    reference = [json.loads(line) for line in (out / "runs" / "reference" / "metrics.jsonl").read_text().splitlines()]
    metrics = sum(1 for record in reference for key in record if key != "step" and not is_timing_key(key))
    assert report["values_compared"] == metrics > 4 * 20  # every metric of every step, not a handful
