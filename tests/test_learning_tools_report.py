"""bench/learning_tools_report.py: an rlkit run's validation points with tool calls and its training steps, the
table (the no-tool line to beat, tool calls at the start and the end) and the three-panel picture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not part of the package

from bench.learning_tools_report import plot, table, tool_points  # noqa: E402


def test_tool_points_read_validation_and_training_steps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "validation").mkdir(parents=True)
    records = [{"step": 0, "val/reward/mean@1": 0.25, "val/agent/tool_calls": 0.5},
               {"step": 1, "rollout/samples": 16.0, "reward/mean": 0.375, "agent/tool_calls": 0.75},
               {"step": 2, "rollout/samples": 16.0, "reward/mean": 0.5, "agent/tool_calls": 1.0,
                "val/reward/mean@1": 0.5, "val/agent/tool_calls": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    found = tool_points(run, began=0.0)
    assert [(p["step"], p["samples"], p["val"], p["tool_calls"]) for p in found["points"]] == [
        (0, 0.0, 0.25, 0.5), (2, 32.0, 0.5, 1.0)]
    assert found["train"] == [{"step": 1, "reward": 0.375, "tool_calls": 0.75},
                              {"step": 2, "reward": 0.5, "tool_calls": 1.0}]
    # A single-turn run logs no tool calls: 0 per episode.
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/reward/mean@1": 0.0}) + "\n")
    assert tool_points(run, began=0.0)["points"][0]["tool_calls"] == 0.0
    assert tool_points(tmp_path / "missing", began=0.0) == {"points": [], "train": []}


def results() -> dict:
    def points(*rows):
        return [{"step": s, "samples": s * 256, "seconds": 10.0 * s, "val": v, "tool_calls": c} for s, v, c in rows]

    return {"calls": [{"date": "2026-12-05 19:00 UTC", "command": "bench/learning_tools.py", "seconds": 480.2}],
            "model": {"size": "large", "params": 114_000_000}, "no_tool_sft": 0.0078125,
            "runs": {"rlkit-grpo-tool": {"tool": "rlkit", "status": "ok",
                                         "points": points((0, 0.5, 0.9), (10, 0.75, 1.0)),
                                         "train": [{"step": s, "reward": 0.5 + s / 40, "tool_calls": 1.0}
                                                   for s in range(1, 11)]},
                     "trl-grpo-tool": {"tool": "trl", "status": "stopped at its deadline",
                                       "points": points((0, 0.5, 0.9), (5, 0.625, 1.0)), "train": []},
                     "rlkit-grpo-none": {"tool": "rlkit", "status": "ok", "points": points((0, 0.0, 0.0))},
                     "broken": {"tool": "rlkit", "status": "exit 1", "points": []}},
            "phases": {"sft-tool": {"status": "ok", "seconds": 90.4}}}


def test_table_shows_the_no_tool_line_and_tool_calls(tmp_path: Path) -> None:
    lines = table(results()).splitlines()
    assert lines[2] == ("The no-tool SFT model's greedy score on the test split (single turn, bench/greedy_eval.py): "
                        "0.008.")
    assert lines[6] == "| rlkit-grpo-tool | ok | 0.500 | 0.750 | 0.750 | 0.90 | 1.00 | 10 | 2,560 | 100 |"
    assert lines[7] == ("| trl-grpo-tool | stopped at its deadline | 0.500 | 0.625 | 0.625 | 0.90 | 1.00 | 5 | 1,280 "
                        "| 50 |")
    assert lines[9] == "| broken | exit 1 | - | - | - | - | - | - | - | - |"
    assert lines[-1] == "Phases: sft-tool 90 s (ok)."
    assert plot(results(), tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
