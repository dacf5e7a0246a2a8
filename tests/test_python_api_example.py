"""examples/train_from_python.py end to end, as a user runs it (`python examples/train_from_python.py`): the
reward function defined in the script's `__main__` reaches the reward worker processes (cloudpickle, by value),
the run's metrics are read back through Run, and the policy is exported. Two steps, workers in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

pytestmark = pytest.mark.slow


def test_the_example_trains_with_its_python_reward_reads_the_metrics_and_exports(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_from_python.py"), "--steps", "2", "--runs-dir",
         str(tmp_path / "runs")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["reward"]["function"] == "python:__main__:echo_reward"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: the validation before training
    for record in records[1:]:  # scored by echo_reward: its dict's other key is logged, no row failed
        assert 0.0 <= record["reward/digit"] <= 1.0 and record["reward/errors"] == 0.0
    digits = [r["reward/digit"] for r in records[1:]]
    assert f"answers that are a digit: {digits[0]:.2f} at step 1 -> {digits[1]:.2f} at step 2" in proc.stdout
    assert "checkpoints: [2]" in proc.stdout
    assert (run_dir / "export" / "config.json").is_file() and (run_dir / "export" / "model.safetensors").is_file()
    assert json.loads((run_dir / "export" / "rlkit_export.json").read_text())["step"] == 2
