"""bench/learning.py: how the RL runs share the devices and the time, the split over two calls (--runs,
--reuse-sft), and --tiny, the whole pipeline on CPU (task, tokenizer and model, SFT, export, rlkit
GRPO/PPO/DAPO and TRL GRPO from the export, curves, table). TRL's run happens where `trl` imports (e.g.
PYTHONPATH with a scratch install of trl, datasets, multiprocess) and is reported skipped elsewhere."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not part of the package

from bench.learning import SETTINGS, Bench, run_names  # noqa: E402
from bench.learning_results import earlier_results  # noqa: E402


def fake_bench(tmp_path: Path, budget: float, run_seconds) -> tuple[Bench, list]:
    """A Bench on a fake clock whose runs record (name, gpu, deadline) and take run_seconds(name, deadline)."""
    bench = Bench(tmp_path, tmp_path, SETTINGS["tiny"], budget, io.StringIO())
    clock, calls = [0.0], []
    bench.left = lambda: budget - clock[0]

    def rl_run(name: str, model: Path, deadline_s: float, gpu: str) -> None:
        calls.append((name, gpu, deadline_s))
        clock[0] += run_seconds(name, deadline_s)

    bench.rl_run = rl_run
    return bench, calls


def test_one_gpu_runs_one_after_another_each_an_equal_share_of_what_is_left(tmp_path: Path) -> None:
    # 330 s, less 30 s for the last run's stop: 100 s each.
    bench, calls = fake_bench(tmp_path, 330, lambda name, deadline: deadline)
    bench.rl_runs(["rlkit-ppo", "rlkit-grpo", "trl-grpo"], Path("export"), gpus=1)
    assert calls == [("rlkit-ppo", "0", 100.0), ("rlkit-grpo", "0", 100.0), ("trl-grpo", "0", 100.0)]
    # The first run takes 20 s to stop: the others share the 210 s left, (210 - 30) / 2 = 90 s each,
    # and the last one's stop (30 s at most) still ends inside the 330 s.
    bench, calls = fake_bench(tmp_path, 330, lambda name, deadline: deadline + (20 if name == "rlkit-ppo" else 0))
    bench.rl_runs(["rlkit-ppo", "rlkit-grpo", "trl-grpo"], Path("export"), gpus=1)
    assert calls == [("rlkit-ppo", "0", 100.0), ("rlkit-grpo", "0", 90.0), ("trl-grpo", "0", 90.0)]


def test_runs_none_is_sft_only_and_names_are_checked(tmp_path: Path) -> None:
    assert run_names("none") == []
    assert run_names("trl-grpo, rlkit-grpo") == ["trl-grpo", "rlkit-grpo"]
    for bad in ("rlkit-grpo,rlkit-grpo", "sft", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="or none"):
            run_names(bad)
    bench, calls = fake_bench(tmp_path, 330, lambda name, deadline: deadline)
    bench.rl_runs([], Path("export"), gpus=1)
    assert calls == []


def test_two_gpus_deal_the_runs_to_two_lanes(tmp_path: Path) -> None:
    # The clock stands still: each lane's first run gets half of 330 - 30 s, its second all of it.
    bench, calls = fake_bench(tmp_path, 330, lambda name, deadline: 0.0)
    bench.rl_runs(["rlkit-grpo", "trl-grpo", "rlkit-ppo", "rlkit-dapo"], Path("export"), gpus=2)
    assert [c for c in calls if c[1] == "0"] == [("rlkit-grpo", "0", 150.0), ("rlkit-ppo", "0", 300.0)]
    assert [c for c in calls if c[1] == "1"] == [("trl-grpo", "1", 150.0), ("rlkit-dapo", "1", 300.0)]


def test_reuse_sft_names_what_is_missing_or_different(tmp_path: Path, capsys) -> None:
    settings = asdict(SETTINGS["tiny"])
    with pytest.raises(SystemExit) as stop:
        earlier_results(tmp_path, settings)
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"--reuse-sft: {tmp_path / 'results.json'} is missing; run once without "
                                       f"--reuse-sft with --workdir {tmp_path} first\n")
    (tmp_path / "results.json").write_text(json.dumps({"settings": {**settings, "rl_lr": 0.1}, "sft_step": 4}))
    with pytest.raises(SystemExit):
        earlier_results(tmp_path, settings)
    assert "was made with other settings (rl_lr)" in capsys.readouterr().err
    (tmp_path / "results.json").write_text(json.dumps({"settings": {**settings, "sft_steps": 9}, "sft_step": 4}))
    with pytest.raises(SystemExit):  # sft_steps may differ: a call that reuses the export runs no SFT
        earlier_results(tmp_path, settings)
    assert f"the SFT export {tmp_path / 'sft-export-4'} that" in capsys.readouterr().err
    (tmp_path / "sft-export-4").mkdir()
    assert earlier_results(tmp_path, settings)[1] == tmp_path / "sft-export-4"


def test_reuse_sft_without_an_earlier_call_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "learning.py"), "--tiny", "--out", str(tmp_path / "out"),
                           "--workdir", str(tmp_path / "work"), "--reuse-sft", "--runs", "rlkit-ppo"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(tmp_path / "work" / "results.json") in proc.stderr


def bench_call(out: Path, workdir: Path, *args: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "learning.py"), "--tiny", "--out", str(out),
                           "--workdir", str(workdir), *args], capture_output=True, text=True, timeout=900)
    log = (out / "bench.log").read_text() if (out / "bench.log").exists() else ""
    assert proc.returncode == 0, (proc.stderr[-3000:], log[-5000:])
    return json.loads((out / "results.json").read_text()), log


@pytest.mark.slow
@pytest.mark.bench
def test_learning_bench_runs_end_to_end_on_cpu_over_two_calls(tmp_path: Path) -> None:
    work = tmp_path / "work"
    # Call 1: task, model, SFT, then rlkit GRPO and PPO one after another on "GPU 0".
    first, _ = bench_call(tmp_path / "call1", work, "--gpus", "1", "--runs", "rlkit-grpo,rlkit-ppo")
    assert first["model"]["size"] == "tiny" and first["phases"]["sft"]["status"] == "ok"
    grpo, ppo = first["phases"]["rlkit-grpo"], first["phases"]["rlkit-ppo"]
    assert grpo["began"] + grpo["seconds"] <= ppo["began"]  # never two runs on the device at once
    assert set(first["runs"]) == {"rlkit-grpo", "rlkit-ppo"}
    # Call 2: the same SFT export, TRL GRPO and rlkit DAPO in two lanes, added to call 1's results.
    results, log = bench_call(tmp_path / "call2", work, "--gpus", "2", "--reuse-sft", "--runs", "trl-grpo,rlkit-dapo")
    assert "[sft]" not in log and "[prep-" not in log and "[build-model]" not in log
    assert [c["runs"] for c in results["calls"]] == [["rlkit-grpo", "rlkit-ppo"], ["trl-grpo", "rlkit-dapo"]]
    assert results["sft_checkpoints"] == first["sft_checkpoints"] and results["sft_step"] == first["sft_step"]
    assert json.loads((work / "results.json").read_text()) == results
    assert list(results["runs"]) == ["rlkit-grpo", "rlkit-ppo", "trl-grpo", "rlkit-dapo"]
    for name in ("rlkit-grpo", "rlkit-ppo", "rlkit-dapo"):
        run = results["runs"][name]
        assert run["status"] == "ok", (name, log[-5000:])
        # Validation before training (the SFT checkpoint's score) and after each step (val_freq 1).
        assert [p["step"] for p in run["points"]] == [0, 1, 2], run
        assert run["points"][0]["samples"] == 0 and run["points"][-1]["samples"] >= 2 * 16
        assert all(0 <= p["val"] <= 1 and p["seconds"] > 0 for p in run["points"])
    # Every rlkit run, in either call, starts from the same SFT export: the same greedy score at step 0.
    assert len({results["runs"][n]["points"][0]["val"] for n in ("rlkit-grpo", "rlkit-ppo", "rlkit-dapo")}) == 1
    trl = results["runs"]["trl-grpo"]
    if importlib.util.find_spec("trl") is None:
        assert trl["status"] == "skipped: trl is not installed"
    else:
        assert trl["status"] == "ok" and [p["step"] for p in trl["points"]] == [0, 1, 2], trl
        assert trl["points"][2]["samples"] == 2 * 16
    rows = (tmp_path / "call2" / "results.md").read_text().splitlines()
    assert sum(line.startswith("| rlkit-") for line in rows) == 3
    assert (tmp_path / "call2" / "learning.png").read_bytes()[:4] == b"\x89PNG"
