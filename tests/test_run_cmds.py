"""`rlkit runs list/show`, `rlkit plot`, status.json and the metrics sinks on resume (no training)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import invoke

from rlkit.cli.run_cmds import register
from rlkit.core.state.run_dir import RunDir
from rlkit.core.controller.tracking import (
    Tracker,
    is_timing_key,
    read_metrics,
    truncate_metrics,
)
from rlkit.core.state.checkpoint import write_checkpoint
from rlkit.recipes.loader import load_config


def cli(*args: str):
    return invoke(register, *args)


def fake_run(runs: Path, run_id: str, steps: int, status: str = "finished") -> RunDir:
    config = load_config("grpo-demo", [f"trainer.runs_dir={runs}", f"trainer.total_steps={steps}"])
    run = RunDir.create(config, run_id)
    with (run.path / "metrics.jsonl").open("w") as handle:
        for step in range(1, steps + 1):
            handle.write(json.dumps({"step": step, "reward/mean": step / 10, "response/length_mean": 3.0 + step,
                                     "actor/kl_loss": 0.01 * step, "actor/entropy": 4.0 - step / 10,
                                     "actor/grad_norm": 1.0, "timing/gen": 0.5, "timing/update_actor": 1.5,
                                     "timing/step": 2.1}) + "\n")
    for step in range(1, steps + 1):
        def shards(folder: Path) -> None:
            (folder / "policy").mkdir()
            (folder / "policy" / "rank_0.pt").write_bytes(b"w" * 2048)

        write_checkpoint(run.path, step, reason="final" if step == steps else "periodic", write_shards=shards,
                         trainer_state={}, controller_rng={}, config_yaml="", keep_last=2)
    run.write_status(status, step=steps, total_steps=steps)
    return run


def test_runs_list_shows_status_step_reward_and_checkpoints(tmp_path) -> None:
    fake_run(tmp_path, "alpha", 4)
    dead = fake_run(tmp_path, "beta", 3, status="running")
    record = json.loads((dead.path / "status.json").read_text())
    (dead.path / "status.json").write_text(json.dumps({**record, "pid": 2**22 + 17}))  # no such process
    result = cli("runs", "list", "--runs-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if "alpha" in line or "beta" in line}
    assert "finished" in rows["alpha"] and "4/4" in rows["alpha"] and "0.4" in rows["alpha"]
    assert "2 (last 4)" in rows["alpha"]
    assert "dead" in rows["beta"]  # status "running" whose process is gone


def test_runs_show_lists_metrics_and_flags_damaged_checkpoints(tmp_path) -> None:
    run = fake_run(tmp_path, "alpha", 4)
    (run.path / "checkpoints" / "step_00000004" / "policy" / "rank_0.pt").write_bytes(b"w" * 10)
    (run.path / "checkpoints" / ".tmp-step_00000005").mkdir()
    result = cli("runs", "show", "alpha", "--runs-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "status finished, step 4/4" in out
    assert "reward/mean" in out and "0.4" in out
    assert "policy/rank_0.pt has 10 bytes, the manifest says 2048" in out
    assert ".tmp-step_00000005" in out and "interrupted write" in out
    line_3 = next(line for line in out.splitlines() if line.strip().startswith("│ 3 "))
    assert "periodic" in line_3 and "yes" in line_3


def test_runs_show_an_unknown_run_exits_2_naming_the_runs(tmp_path) -> None:
    fake_run(tmp_path, "alpha", 1)
    result = cli("runs", "show", "gamma", "--runs-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "runs there: alpha" in result.output


def test_plot_writes_a_png(tmp_path) -> None:
    fake_run(tmp_path, "alpha", 5)
    result = cli("plot", "alpha", "--runs-dir", str(tmp_path), "--out", str(tmp_path / "p.png"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_run_without_metrics_is_a_user_error(tmp_path) -> None:
    run = fake_run(tmp_path, "alpha", 1)
    (run.path / "metrics.jsonl").unlink()
    result = cli("plot", "alpha", "--runs-dir", str(tmp_path))
    assert result.exit_code == 2 and "has no metrics yet" in result.output


def test_status_keeps_earlier_fields_and_records_the_process(tmp_path) -> None:
    run = fake_run(tmp_path, "alpha", 2)
    run.write_status("running", step=1, last_checkpoint=1)
    run.write_status("failed", error="boom")
    status = run.read_status()
    assert (status["status"], status["step"], status["last_checkpoint"], status["error"]) == ("failed", 1, 1, "boom")
    assert isinstance(status["pid"], int)


def test_truncate_metrics_keeps_each_step_up_to_the_checkpoint_once(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "x"')
    truncate_metrics(path, 2)
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_a_resumed_tracker_continues_metrics_after_the_checkpoint(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    tracker = Tracker(tmp_path, ["jsonl", "tensorboard"], total_steps=4, start_step=1, project="p", name="n",
                      config={})
    for step in (2, 3, 4):
        tracker.log({"reward/mean": float(step)}, step)
    tracker.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert list((tmp_path / "tensorboard").iterdir())


def test_timing_keys_are_recognised() -> None:
    assert all(map(is_timing_key, ["timing/gen", "perf/tokens_per_s", "sync/seconds", "reward/call_seconds_max"]))
    assert not any(map(is_timing_key, ["reward/mean", "perf/response_tokens", "sync/bytes", "actor/lr"]))

