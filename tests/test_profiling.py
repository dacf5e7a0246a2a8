"""trainer.profile_steps: the phases of chosen steps under torch.profiler (rlkit.core.cluster.profiling)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.core.cluster.phases import PhaseReporter, profiled_step
from rlkit.core.cluster.profiling import device_busy_seconds, summary_lines
from rlkit.recipes.loader import ConfigError, load_config


class Worker(PhaseReporter):
    rank = 1

    def work(self, name: str, inner: str | None = None) -> None:
        with self.reporting(name):
            torch.randn(64, 64) @ torch.randn(64, 64)
            if inner is not None:
                with self.reporting(inner):
                    torch.randn(8, 8).sum()


def test_an_armed_worker_writes_each_phase_s_table_summary_and_trace(tmp_path) -> None:
    worker = Worker()
    worker.work("generate")  # never armed: nothing
    worker.profile_phases(str(tmp_path / "step2"))
    worker.work("update_actor", inner="log_probs/ref")  # the inner phase is part of the outer one's profile
    worker.work("log_probs/ref")
    worker.profile_phases(None)
    worker.work("sync_weights")  # disarmed: nothing
    files = sorted(p.name for p in (tmp_path / "step2").iterdir())
    assert files == [f"rank1-{phase}{suffix}" for phase in ("log_probs-ref", "update_actor")
                     for suffix in (".json", ".trace.json.gz", ".txt")]
    summary = json.loads((tmp_path / "step2" / "rank1-update_actor.json").read_text())
    assert summary["phase"] == "update_actor" and summary["wall_seconds"] > 0
    assert summary["device_busy_seconds"] is None and summary["sorted_by"] == "self_cpu_time_total"  # a CPU
    assert "aten::mm" in [entry["name"] for entry in summary["top"]]
    table = (tmp_path / "step2" / "rank1-update_actor.txt").read_text()
    assert table.startswith("phase update_actor: ") and "aten::mm" in table
    trace = json.loads(gzip.decompress((tmp_path / "step2" / "rank1-update_actor.trace.json.gz").read_bytes()))
    assert any(event.get("name") == "aten::mm" for event in trace["traceEvents"])


def test_a_phase_that_raises_writes_nothing_and_the_next_is_profiled(tmp_path) -> None:
    worker = Worker()
    worker.profile_phases(str(tmp_path))
    with pytest.raises(RuntimeError), worker.reporting("update_actor"):
        raise RuntimeError("boom")
    assert worker.phase == "update_actor"  # the board still says where the worker failed
    worker.work("generate")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rank1-generate.json", "rank1-generate.trace.json.gz", "rank1-generate.txt"]


def test_device_busy_is_the_union_of_kernel_intervals_over_streams() -> None:
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(start_s: float, seconds: float, device=cuda):
        return SimpleNamespace(start_ns=lambda: int(start_s * 1e9), duration_ns=lambda: int(seconds * 1e9),
                               device_type=lambda: device)

    # 0-1 s and 0.5-1.5 s overlap (1.5 s), 1.2-1.4 s lies inside, 2-3 s alone (1 s); the CPU op and an empty
    # kernel do not count: 2.5 s.
    events = [event(2, 1), event(0, 1), event(1.2, 0.2), event(0.5, 1), event(0, 9, cpu), event(4, 0)]
    profile = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events)))
    assert device_busy_seconds(profile) == pytest.approx(2.5)


def test_the_logs_summary_is_a_line_a_phase_longest_first(tmp_path) -> None:
    def write(stem: str, phase: str, wall: float, busy: float | None, top: list) -> None:
        entries = [{"name": name, "calls": calls, "self_seconds": seconds} for name, calls, seconds in top]
        summary = {"phase": phase, "wall_seconds": wall, "device_busy_seconds": busy, "top": entries}
        (tmp_path / f"{stem}.json").write_text(json.dumps(summary))

    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute"
    write("rank0-generate", "generate", 1.5, 0.3, [("aten::mm", 10, 0.2)])
    write("rank0-update_actor", "update_actor", 4.0, 3.8, [(gemm, 1200, 1.6), ("triton_red_fused_0", 600, 0.4)])
    write("rank1-update_actor", "update_actor", 9.0, None, [])  # another rank's: not in rank 0's lines
    assert summary_lines(tmp_path, top=2) == [
        f"update_actor: 4.000 s, device busy 3.800 s (95%); top: {gemm[:57]}... 1.600 s x1200, "
        "triton_red_fused_0 0.400 s x600",
        "generate: 1.500 s, device busy 0.300 s (20%); top: aten::mm 0.200 s x10",
    ]


class Group:
    """A worker group as the controller calls it (rlkit.core.cluster.backend.Group), its calls logged."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def call(self, method, *args, phase=None, per_rank=None, startup=False) -> list:
        self.calls.append((method.__name__, args))
        return [None]


def test_profiled_step_arms_the_groups_for_the_steps_named_and_disarms_them_after(tmp_path) -> None:
    groups = {"policy": Group(), "critic": Group()}
    with profiled_step(lambda: groups, tmp_path, 1, [3]) as folder:
        assert folder is None
    assert all(not group.calls for group in groups.values())
    with pytest.raises(RuntimeError), profiled_step(lambda: groups, tmp_path, 3, [3]) as folder:
        assert folder == tmp_path / "profile" / "step3"
        raise RuntimeError("a failed step still disarms")
    for group in groups.values():
        assert group.calls == [("profile_phases", (str(tmp_path / "profile" / "step3"),)), ("profile_phases", (None,))]


def test_a_failed_step_s_error_is_not_replaced_by_a_worker_that_cannot_be_disarmed(tmp_path) -> None:
    class Dead(Group):
        def call(self, method, *args, **kwargs) -> list:
            if args == (None,):
                raise RuntimeError("worker 0 died")
            return super().call(method, *args, **kwargs)

    group = Dead()
    with pytest.raises(ValueError, match="the step's own error"), profiled_step(lambda: {"policy": group}, tmp_path,
                                                                                 2, [2]):
        raise ValueError("the step's own error")
    with pytest.raises(RuntimeError, match="worker 0 died"), profiled_step(lambda: {"policy": group}, tmp_path, 2, [2]):
        pass  # a step that succeeded: the failed disarm is the error


def test_profile_steps_take_one_step_or_a_list_inside_the_run() -> None:
    assert load_config("grpo-demo", ["trainer.profile_steps=3"]).trainer.profile_steps == [3]
    assert load_config("grpo-demo", ["trainer.profile_steps=[2,5]"]).trainer.profile_steps == [2, 5]
    assert load_config("grpo-demo", []).trainer.profile_steps == []
    with pytest.raises(ConfigError, match=r"trainer.profile_steps has \[0, 9\], outside this run's steps 1..8"):
        load_config("grpo-demo", ["trainer.total_steps=8", "trainer.profile_steps=[0,9,8]"])


@pytest.mark.slow
def test_a_run_profiles_the_step_named_and_trains_as_without(tmp_path, monkeypatch) -> None:
    """An in-process run with step 2 profiled: its phases' files, and the same metrics as the run without."""
    from test_resume_e2e import training_overrides

    from rlkit.core.controller.loop import train_run
    from rlkit.core.data.builders import write_parquet
    from rlkit.core.data.synthetic import build_synthetic

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    data = write_parquet(build_synthetic(task="echo", n_train=8, n_test=0, seed=3)["train"], tmp_path / "echo.parquet")
    overrides = [*training_overrides(data, tmp_path / "runs"), "trainer.total_steps=2", "trainer.save_freq=0",
                 "trainer.workers=in_process", "trainer.device=cpu"]
    plain = train_run(load_config("grpo-demo", overrides), run_id="plain")
    profiled = train_run(load_config("grpo-demo", [*overrides, "trainer.profile_steps=[2]"]), run_id="profiled")
    assert sorted(p.name for p in (profiled / "profile").iterdir()) == ["step2"]
    phases = {p.name.removeprefix("rank0-").removesuffix(".json") for p in (profiled / "profile" / "step2").glob("*.json")}
    assert {"generate", "update_actor", "sync_weights"} <= phases
    assert not (plain / "profile").exists()

    def losses(run: Path) -> list[float]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [row["actor/pg_loss"] for row in rows if "actor/pg_loss" in row]

    assert losses(profiled) == losses(plain) and len(losses(plain)) == 2
