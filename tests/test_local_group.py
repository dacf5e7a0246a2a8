"""trainer.workers=in_process: the worker groups' protocol with plain objects in this process.

The same calls and messages as the Ray group (tests/test_worker_group_failures.py), what it refuses,
and the process state it gives back at shutdown so that the next in-process run can start.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.failures import WorkerFailure
from rlkit.core.cluster.local_group import InProcessBackend, InProcessWorkerGroup
from rlkit.core.cluster.phases import PhaseReporter
from rlkit.errors import ConfigError, UserError
from rlkit.recipes.loader import load_config

CPU = ["trainer.workers=in_process", "trainer.device=cpu"]


class Recorder(PhaseReporter):
    """Each call enters a phase, appends to a log the test reads, and misbehaves when asked."""

    def __init__(self, config, log: list, rank: int, world_size: int) -> None:
        self.log, self.rank, self.world_size = log, rank, world_size

    def work(self, label: str, how: str = "") -> str:
        self.phase = "work/inner"
        self.log.append(label)
        if how == "raise":
            _parse_row(7)
        if how == "user":
            raise UserError("data.train_files: row 3 has no prompt")
        self.phase = "idle"
        return f"{label} on rank {self.rank} of {self.world_size}"


class BrokenAtStart(PhaseReporter):
    def __init__(self, config, rank: int, world_size: int) -> None:
        raise RuntimeError("no such device")


class Joiner(DeviceWorker):
    """Joins torch.distributed as a policy or critic worker does in its setup."""

    def setup(self) -> int:
        self.join_process_group(*self.address())
        return dist.get_world_size()


def _parse_row(row: int) -> None:
    raise ValueError(f"row {row} is not a number")


@pytest.fixture
def config():
    return load_config("grpo-demo", CPU)


def test_calls_run_in_submission_order_with_each_ranks_arguments(config):
    log: list[str] = []
    group = InProcessWorkerGroup(Recorder, config, log, name="worker")
    first = group.submit(Recorder.work, "a")
    second = group.submit(Recorder.work, "b")
    assert log == ["a", "b"]  # submit ran them, in order
    assert group.collect(second, "b") == ["b on rank 0 of 1"] and group.collect(first, "a") == ["a on rank 0 of 1"]
    assert group.call(Recorder.work, per_rank=[("c",)]) == ["c on rank 0 of 1"]
    assert group.size == 1 and log == ["a", "b", "c"]
    place = group.places()[0]
    assert (place.rank, place.host, place.pid, place.phase) == (0, socket.gethostname(), os.getpid(), "idle")


def test_worker_exception_waits_for_collect_and_reads_as_on_ray(config):
    group = InProcessWorkerGroup(Recorder, config, [], name="worker")
    refs = group.submit(Recorder.work, "x", "raise")  # no exception yet: as a Ray ObjectRef, it holds it
    with pytest.raises(WorkerFailure) as info:
        group.collect(refs, "update_actor")
    failure = info.value
    assert str(failure) == (f"worker rank 0 (node 0, host {socket.gethostname()}, pid {os.getpid()}) raised "
                            "ValueError during 'update_actor' (worker phase 'work/inner'): row 7 is not a number")
    assert isinstance(failure.cause, ValueError)
    assert "in _parse_row" in failure.detail and "ValueError: row 7 is not a number" in failure.detail


def test_user_error_in_a_worker_stays_a_user_error(config):
    group = InProcessWorkerGroup(Recorder, config, [], name="critic")
    with pytest.raises(UserError, match=r"^critic rank 0: data.train_files: row 3 has no prompt$"):
        group.call(Recorder.work, "x", "user")


def test_error_in_worker_start_up_is_named_with_its_traceback(config):
    with pytest.raises(WorkerFailure) as info:
        InProcessWorkerGroup(BrokenAtStart, config, name="worker")
    assert str(info.value) == ("worker rank 0 (node 0) raised RuntimeError during 'start (worker objects)': "
                               "no such device")
    assert "RuntimeError: no such device" in info.value.detail


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.n_gpus_per_node=2"], r"trainer.n_gpus_per_node \(command line\): trainer.workers=in_process runs one "
                                    r"worker per group in this process, but trainer.nnodes x trainer.n_gpus_per_node "
                                    r"= 2 devices; set both to 1 or use trainer.workers=ray"),
    (["trainer.nnodes=2"], r"trainer.nnodes \(command line\): .* = 2 devices"),
    (["trainer.device=cuda"], r"trainer.device \(command line\): trainer.workers=in_process runs on the CPU only; "
                              r"set trainer.device=cpu or use trainer.workers=ray"),
    # Split placement: one training and one rollout worker, the weights handed over in memory.
    (["trainer.n_gpus_per_node=3", "rollout.placement=split", "rollout.devices=1", "rollout.weight_sync=object_store"],
     r"trainer.n_gpus_per_node \(command line\): trainer.workers=in_process with split placement runs one training "
     r"and one rollout worker in this process, but trainer.nnodes x trainer.n_gpus_per_node = 3 devices and "
     r"rollout.devices=1; set trainer.n_gpus_per_node=2 and rollout.devices=1, or use trainer.workers=ray"),
    (["trainer.n_gpus_per_node=2", "rollout.placement=split", "rollout.devices=1"],
     r"rollout.weight_sync: trainer.workers=in_process hands the weights to the rollout worker in "
     r"memory, with no collective to broadcast over; set rollout.weight_sync=object_store"),
])
def test_layouts_it_cannot_run_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("grpo-demo", [*CPU, *overrides])


def test_shutdown_gives_back_torch_distributed_env_and_threads(config, monkeypatch, request):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the caller's own setting stays
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not the workers' 1 (make test runs with OMP_NUM_THREADS=1): giving it back shows
    request.addfinalizer(lambda: torch.set_num_threads(before))
    threads = torch.get_num_threads()
    for _ in range(2):  # a second run in this process starts its own world again
        backend = InProcessBackend(config)
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "info"
        policy = backend.group(Joiner, "model", name="worker")
        critic = backend.group(Joiner, "model", name="critic", colocate_with=policy)
        # The colocated critic shares the policy's world of one.
        assert policy.call(Joiner.setup) == [1] and critic.call(Joiner.setup) == [1]
        assert torch.get_num_threads() == config.trainer.cpu_threads_per_worker
        backend.shutdown()
        assert not dist.is_initialized() and policy.size == 0
        assert "MASTER_PORT" not in os.environ and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
        assert torch.get_num_threads() == threads


def test_a_second_backend_beside_a_live_one_is_refused(config):
    backend = InProcessBackend(config)
    backend.group(Joiner, "model", name="worker").call(Joiner.setup)
    try:
        with pytest.raises(UserError, match="torch.distributed for its workers, and it is already initialised"):
            InProcessBackend(config)
    finally:
        backend.shutdown()


def test_the_in_process_path_imports_no_ray():
    """The controllers, the backend factory and the in-process group load without Ray."""
    code = ("import sys\nfrom rlkit.core.controller.loop import train_run\nfrom rlkit.core.cluster.backend import "
            "start_backend\nimport rlkit.core.cluster.local_group\nprint('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_method_the_workers_do_not_have_is_refused_before_any_call(config):
    log: list[str] = []
    group = InProcessWorkerGroup(Recorder, config, log, name="worker")
    with pytest.raises(TypeError, match="Recorder has no method 'setup'"):
        group.call(Joiner.setup)  # another worker class's method: nothing runs
    assert log == []
