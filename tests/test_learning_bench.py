"""bench/learning.py --tiny: the whole pipeline on CPU (task, tokenizer and model, SFT, export, rlkit
GRPO/PPO/DAPO and TRL GRPO from the export, curves, table). TRL's lane runs where `trl` imports
(e.g. PYTHONPATH with a scratch install of trl, datasets, multiprocess) and is reported skipped elsewhere."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_learning_bench_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "learning.py"), "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    log = (tmp_path / "bench.log").read_text() if (tmp_path / "bench.log").exists() else ""
    assert proc.returncode == 0, (proc.stderr[-3000:], log[-5000:])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["model"]["size"] == "tiny" and results["phases"]["sft"]["status"] == "ok"
    for name, steps in (("rlkit-grpo", 2), ("rlkit-ppo", 2), ("rlkit-dapo", 2)):
        run = results["runs"][name]
        assert run["status"] == "ok", (name, log[-5000:])
        # Validation before training (the SFT checkpoint's score) and after each step (val_freq 1).
        assert [p["step"] for p in run["points"]] == list(range(steps + 1)), run
        assert run["points"][0]["samples"] == 0 and run["points"][-1]["samples"] >= steps * 16
        assert all(0 <= p["val"] <= 1 and p["seconds"] > 0 for p in run["points"])
    # Every rlkit run starts from the same SFT export: the same greedy score at step 0.
    assert len({results["runs"][n]["points"][0]["val"] for n in ("rlkit-grpo", "rlkit-ppo", "rlkit-dapo")}) == 1
    trl = results["runs"]["trl-grpo"]
    if importlib.util.find_spec("trl") is None:
        assert trl["status"] == "skipped: trl is not installed"
    else:
        assert trl["status"] == "ok" and [p["step"] for p in trl["points"]] == [0, 1, 2], trl
        assert trl["points"][2]["samples"] == 2 * 16
    rows = (tmp_path / "results.md").read_text().splitlines()
    assert sum(line.startswith("| rlkit-") for line in rows) == 3
    assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"
