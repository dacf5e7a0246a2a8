"""bench/learning.py's bookkeeping: validation points of an rlkit run, the table, the picture."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is not part of the package

from bench.learning_report import first_reaching, plot, table  # noqa: E402
from bench.learning_results import pick_checkpoint, plateau_step, rlkit_points  # noqa: E402


def test_rlkit_points_count_samples_and_time_each_validation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "validation").mkdir(parents=True)
    records = [{"step": 0, "val/reward/mean@1": 0.25},
               {"step": 1, "rollout/samples": 32.0}, {"step": 2, "rollout/samples": 48.0, "val/reward/mean@1": 0.5},
               {"step": 3, "rollout/samples": 32.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for step, written in ((0, 1000.0), (2, 1030.5)):
        path = run / "validation" / f"step_{step:08d}.jsonl"
        path.write_text("{}\n")
        os.utime(path, (written, written))
    assert rlkit_points(run, began=990.0) == [
        {"step": 0, "samples": 0.0, "seconds": 10.0, "val": 0.25},
        {"step": 2, "samples": 80.0, "seconds": 40.5, "val": 0.5}]  # 32 + 48 samples (DAPO may draw more)
    assert rlkit_points(tmp_path / "missing", began=0.0) == []


def results() -> dict:
    def points(*rows):
        return [{"step": s, "samples": s * 256, "seconds": t, "val": v} for s, t, v in rows]

    return {"calls": [{"date": "2026-12-01 10:00 UTC", "command": "bench/learning.py --runs rlkit-grpo,trl-grpo",
                       "seconds": 500.4},
                      {"date": "2026-12-01 10:09 UTC", "command": "bench/learning.py --reuse-sft --runs rlkit-ppo",
                       "seconds": 300.0}],
            "sft_checkpoints": {"80": 0.45, "400": 0.9, "160": 0.7}, "sft_step": 80,
            "model": {"size": "large", "params": 86_000_000},
            "runs": {"rlkit-grpo": {"tool": "rlkit", "status": "ok", "points": points((0, 70, 0.3), (5, 90, 0.35),
                                                                                     (10, 110, 0.42))},
                     "trl-grpo": {"tool": "trl", "status": "ok", "points": points((0, 80, 0.31), (5, 150, 0.40))},
                     "rlkit-ppo": {"tool": "rlkit", "status": "exit 1", "points": []}},
            "phases": {"sft": {"status": "ok", "seconds": 120.4}}}


def test_table_reports_start_end_and_when_trls_final_score_was_reached() -> None:
    assert first_reaching([{"val": 0.3, "samples": 0}, {"val": 0.4, "samples": 1280}], 0.4, "samples") == 1280
    assert first_reaching([{"val": 0.3, "samples": 0}], 0.4, "samples") is None
    lines = table(results()).splitlines()
    assert lines[0].endswith("calls: `bench/learning.py --runs rlkit-grpo,trl-grpo` (2026-12-01 10:00 UTC, 500 s); "
                             "`bench/learning.py --reuse-sft --runs rlkit-ppo` (2026-12-01 10:09 UTC, 300 s).")
    assert "samples to TRL's final (0.400)" in lines[2]
    # rlkit GRPO: from 0.300, last 0.420 at step 10 (2,560 samples, 110 s); first >= 0.40 at step 10.
    assert lines[4] == "| rlkit-grpo | ok | 0.300 | 0.420 | 0.420 | 10 | 2,560 | 110 | 2,560 | 110 |"
    assert lines[5] == "| trl-grpo | ok | 0.310 | 0.400 | 0.400 | 5 | 1,280 | 150 | 1,280 | 150 |"
    assert lines[6] == "| rlkit-ppo | exit 1 | - | - | - | - | - | - | - | - |"
    assert lines[-3] == ("SFT checkpoints scored (greedy, test split): step 80 0.450, step 160 0.700, step 400 0.900; "
                         "RL starts from step 80, the latest checkpoint scoring at most 0.6.")  # in step order
    assert lines[-1] == "Phases: sft 120 s (ok)."
    plateau = table({**results(), "sft_step": 160, "sft_plateau": {"min_gain": 0.02, "step": 160, "reached": True}})
    assert plateau.splitlines()[-3].endswith("RL starts from step 160, the SFT plateau (the first checkpoint after "
                                             "which no score rose by 0.02 or more).")
    climbing = table({**results(), "sft_step": 400, "sft_plateau": {"min_gain": 0.02, "step": 400, "reached": False}})
    assert climbing.splitlines()[-3].endswith("RL starts from step 400, the last checkpoint: no plateau (a gain of "
                                              "0.02 or more after every earlier one).")


def test_plot_writes_one_png(tmp_path: Path) -> None:
    out = plot(results(), tmp_path / "learning.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sft_checkpoint_is_the_latest_with_a_middling_score() -> None:
    scores = {160: 0.1, 320: 0.3, 480: 0.5, 640: 0.7, 800: 0.85}
    tried = []

    def score(step):
        tried.append(step)
        return scores[step]

    # The last (0.85) is too good; a binary search over 160..640: 320 fits, 480 fits, 640 does not.
    assert pick_checkpoint([800, 160, 640, 320, 480], score, 0.6) == (480, {800: 0.85, 320: 0.3, 480: 0.5, 640: 0.7})
    assert tried == [800, 320, 480, 640]
    assert pick_checkpoint([160, 800], {160: 0.1, 800: 0.55}.get, 0.6) == (800, {800: 0.55})  # one score
    assert pick_checkpoint([640, 800], scores.get, 0.6) == (640, {800: 0.85, 640: 0.7})  # all above: the lowest
    assert pick_checkpoint([160, 320, 800], {160: 0.1, 320: None, 800: 0.9}.get, 0.6) == (160, {800: 0.9, 160: 0.1})
    assert pick_checkpoint([], score, 0.6) == (None, {})


def test_the_sft_plateau_is_the_first_validation_no_later_one_beats_by_min_gain() -> None:
    # The climb, then 0.80 at 240; 0.83 and 0.84 later rise by less than 0.05 over it, the 0.78 dip is no gain.
    curve = {80: 0.20, 160: 0.62, 240: 0.80, 320: 0.83, 400: 0.78, 480: 0.84}
    assert plateau_step(curve, 0.05) == (240, True)
    # A smaller min_gain: 0.80 -> 0.84 is a gain, so is 0.83 -> 0.84; 0.84 is last, nothing is known after it.
    assert plateau_step(curve, 0.01) == (480, False)
    assert plateau_step({**curve, 560: 0.845}, 0.01) == (480, True)
    # A gain of exactly min_gain counts as a gain (binary fractions: no rounding); insertion order is not step order.
    assert plateau_step({240: 0.75, 80: 0.25, 160: 0.5}, 0.25) == (240, False)
    assert plateau_step({240: 0.625, 80: 0.25, 160: 0.5}, 0.25) == (160, True)
    # Still climbing at the end, or one validation only: not reached, the last step.
    assert plateau_step({80: 0.1, 160: 0.3, 240: 0.6}, 0.05) == (240, False)
    assert plateau_step({80: 0.9}, 0.05) == (80, False) and plateau_step({}, 0.05) == (None, False)


def test_trl_reward_is_rlkits_gsm8k_reward_on_conversational_completions() -> None:
    from bench.greedy_eval import reward

    completions = [[{"role": "assistant", "content": "9-4=5.\n#### 5"}], [{"role": "assistant", "content": "#### 4"}],
                   [{"role": "assistant", "content": "5"}], "plain text #### 5"]
    assert reward(completions, ["5", "5", "5", "5.0"]) == [1.0, 0.0, 0.0, 1.0]  # strict: the number after '####'
