"""Roles composed in one device worker (rlkit.core.cluster.roles): the controller calls a role's function,
the worker serves it under the same name, and the role's phases are the worker's (board and fault points)."""

from __future__ import annotations

import pytest

from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.failures import WorkerFailure
from rlkit.core.cluster.local_group import InProcessWorkerGroup
from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.cluster.roles import Role, serve
from rlkit.core.train.actor import Actor
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.loader import load_config


class Counter(Role):
    """A role with only its own state: a count it adds to."""

    def __init__(self, phases: PhaseReporter, start: int) -> None:
        super().__init__(phases)
        self.count, self.seen = start, []

    @in_phase("count")
    def add(self, n: int) -> int:
        self.seen.append(self.phases.phase)  # what the worker reports while the role works
        self.count += n
        return self.count


class Other(Role):
    def elsewhere(self) -> None:
        pass


class Counting(PhaseReporter):
    """A worker composing one role and serving one of its calls."""

    add = serve("counter", Counter.add)

    def __init__(self, config, rank: int, world_size: int) -> None:
        self.rank, self.counter = rank, Counter(self, start=40)


@pytest.fixture
def group():
    return InProcessWorkerGroup(Counting, load_config("grpo-demo", ["trainer.workers=in_process"]), name="worker")


def test_a_call_naming_the_roles_function_runs_on_the_workers_role(group):
    assert group.call(Counter.add, 2) == [42]
    assert group.call(Counter.add, 1, phase="again") == [43]
    worker = group.workers[0]
    assert worker.counter.seen == ["count", "count"]  # the worker's phase while the role ran
    assert group.places()[0].phase == "idle"  # and the board has it back to idle afterwards


def test_a_role_phase_is_the_workers_fault_point(group, monkeypatch):
    monkeypatch.setenv("RLKIT_FAULT", "raise:worker0.count:2")
    assert group.call(Counter.add, 2) == [42]
    with pytest.raises(WorkerFailure, match="count"):
        group.call(Counter.add, 2)


def test_a_role_function_the_worker_does_not_serve_is_refused_before_any_call(group):
    with pytest.raises(TypeError, match="Counting has no method 'elsewhere'"):
        group.call(Other.elsewhere)
    assert group.workers[0].counter.seen == []


def test_a_call_served_under_another_name_is_refused_when_the_worker_class_is_made():
    with pytest.raises(TypeError, match=r"Misnamed.increment serves Counter.add: name them the same"):

        class Misnamed(DeviceWorker):
            increment = serve("counter", Counter.add)


def test_the_policy_worker_serves_each_role_call_under_its_own_name():
    assert PolicyWorker.update_actor.__wrapped__ is Actor.update_actor
    assert PolicyWorker.update_actor.served_by == "actor"
