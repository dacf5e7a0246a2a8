"""WorkerGroup with a stand-in worker: deaths, deadlines and exceptions become named WorkerFailures."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import pytest

from rlkit.core.cluster.failures import WorkerFailure
from rlkit.core.cluster.phases import PhaseReporter
from rlkit.errors import UserError

pytestmark = [pytest.mark.slow]


class StandInWorker(PhaseReporter):
    """Does nothing heavy: each method enters a phase and then misbehaves on one rank."""

    def __init__(self, config, rank: int, world_size: int) -> None:
        self.rank = rank

    def work(self, bad_rank: int, how: str) -> int:
        self.phase = "work/inner"
        if self.rank == bad_rank:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "sleep":
                time.sleep(60)
            if how == "raise":
                _parse_row(7)
            if how == "user":
                raise UserError("data.train_files: row 3 has no prompt")
            if how == "unpicklable":
                _engine_config(528)
        self.phase = "idle"
        return self.rank

    def start_up(self) -> None:
        for stage in ("setup/load-models", "setup/rollout-engine"):
            self.phase = stage
            time.sleep(1.5)
        self.phase = "idle"


class BrokenAtStart(PhaseReporter):
    def __init__(self, config, rank: int, world_size: int) -> None:
        raise RuntimeError("no such device")


def _engine_config(max_model_len: int) -> None:
    """Fails as vLLM's config check does: a ValidationError whose input (ArgsKwargs) does not pickle."""
    from pydantic import model_validator
    from pydantic.dataclasses import dataclass

    @dataclass
    class ModelConfig:
        __module__ = "builtins"  # this test module is sent by value: the worker cannot import it
        max_model_len: int

        @model_validator(mode="after")
        def check(self):
            raise ValueError(f"max_model_len ({self.max_model_len}) is greater than the derived max_model_len (256)")

    ModelConfig(max_model_len=max_model_len)


def _parse_row(index: int) -> None:
    raise ValueError(f"row {index} is not a number")


@pytest.fixture(scope="module")
def ray_session():
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    # "local": a cluster of its own, never one another test (another pytest-xdist worker) left running here
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture
def group(ray_session):
    from rlkit.core.cluster.worker_group import WorkerGroup
    from rlkit.recipes.loader import load_config

    config = load_config("grpo-demo", ["trainer.n_gpus_per_node=2", "trainer.phase_timeout_s=2"])
    workers = WorkerGroup(StandInWorker, config, name="worker")
    yield workers
    workers.shutdown()


def test_healthy_call_returns_results_in_rank_order(group):
    assert group.call(StandInWorker.work, -1, "") == [0, 1]
    places = group.places()
    assert sorted(places) == [0, 1] and all(place.host and place.pid > 0 for place in places.values())


def test_killed_worker_is_named_within_seconds(group):
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        group.call(StandInWorker.work, 1, "kill", phase="update_actor")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "worker rank 1 (node 0, host " in message
    assert "died during 'update_actor' in its phase 'work/inner'" in message
    assert "killed by a signal (SIGKILL" in message


def test_late_worker_is_named_at_the_deadline(group):
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        group.call(StandInWorker.work, 0, "sleep", phase="generate")
    assert 2 <= time.monotonic() - start < 2 + 5
    message = str(info.value)
    assert "'generate' did not finish within 2 s (trainer.phase_timeout_s)" in message
    assert "worker rank 0 (node 0, host " in message and "still in 'work/inner' after 2 s" in message
    assert "rank(s) [1] finished" in message


def test_worker_exception_names_rank_and_phase_and_keeps_its_traceback(group):
    with pytest.raises(WorkerFailure) as info:
        group.call(StandInWorker.work, 1, "raise", phase="update_actor")
    failure = info.value
    assert "worker rank 1 (node 0, host " in str(failure)
    assert "raised ValueError during 'update_actor' (worker phase 'work/inner'): row 7 is not a number" in str(failure)
    assert isinstance(failure.cause, ValueError)
    assert "Traceback" not in str(failure)
    assert "in _parse_row" in failure.detail and "ValueError: row 7 is not a number" in failure.detail


def test_an_exception_that_does_not_pickle_still_arrives_as_its_type_and_message(group):
    with pytest.raises(WorkerFailure) as info:
        group.call(StandInWorker.work, 0, "unpicklable", phase="setup")
    message = str(info.value)
    assert ("raised ValidationError during 'setup' (worker phase 'work/inner'): 1 validation error for "
            "ModelConfig: Value error, max_model_len (528) is greater than the derived max_model_len (256)") in message
    assert "isn't serializable" not in message + info.value.detail
    assert "in _engine_config" in info.value.detail  # the worker's own traceback


def test_user_error_in_a_worker_stays_a_user_error(group):
    with pytest.raises(UserError, match=r"^worker rank 0: data.train_files: row 3 has no prompt$"):
        group.call(StandInWorker.work, 0, "user")


def test_start_up_logs_each_ranks_progress(group, caplog):
    with caplog.at_level(logging.INFO, logger="rlkit.workers"):
        group.call(StandInWorker.start_up, phase="setup", startup=True)
    lines = [record.getMessage() for record in caplog.records]
    for rank in (0, 1):
        assert f"setup: worker rank {rank} in setup/rollout-engine" in lines, lines
    assert lines[-1].startswith("setup: all 2 workers done in ")


def test_error_in_worker_start_up_is_named_with_its_traceback(ray_session):
    from rlkit.core.cluster.worker_group import WorkerGroup
    from rlkit.recipes.loader import load_config

    config = load_config("grpo-demo", ["trainer.setup_timeout_s=60"])
    with pytest.raises(WorkerFailure) as info:
        WorkerGroup(BrokenAtStart, config, name="worker")
    assert "worker rank 0 (node 0) died during 'start (worker processes)'" in str(info.value)
    assert "its start-up (__init__) raised an error" in str(info.value)
    assert "RuntimeError: no such device" in info.value.detail
