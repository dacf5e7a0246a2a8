"""What every worker does with its process at the end of its set-up (rlkit.core.cluster.device_worker)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

from rlkit.core.cluster.device_worker import DeviceWorker


class Node:
    pass


def _worker(workers: str) -> DeviceWorker:
    worker = DeviceWorker.__new__(DeviceWorker)  # only its config is read
    worker.config = SimpleNamespace(trainer=SimpleNamespace(workers=workers))  # type: ignore[assignment]
    return worker


def _collected(obj: object) -> bool:
    """Whether Python's collector would walk `obj` (a frozen object is in none of its generations)."""
    return any(o is obj for o in gc.get_objects())


def test_a_worker_in_its_own_process_collects_then_freezes_its_heap_and_an_in_process_one_leaves_it_alone():
    enabled = gc.isenabled()
    gc.disable()  # no collection but the worker's own
    try:
        cycle = Node()
        cycle.me = cycle  # garbage only a collection frees
        gone = weakref.ref(cycle)
        del cycle
        kept = Node()
        _worker("in_process").freeze_heap()
        assert gone() is not None and _collected(kept)  # the caller's heap as it was
        _worker("ray").freeze_heap()
        assert gone() is None  # collected first: the garbage is not frozen with the rest
        assert not _collected(kept)  # out of the collector's reach
    finally:
        gc.unfreeze()  # this test process's heap back in the collector's reach
        if enabled:
            gc.enable()
