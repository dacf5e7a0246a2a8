"""What each worker is doing right now, readable by the controller while the worker is busy.

A Ray actor runs one call at a time, so the controller cannot ask a busy worker where it is.
Instead every worker posts each phase change to a small shared `PhaseBoard` actor. The
controller reads the board to show start-up progress, and to say where a worker was when it
died or stopped answering.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from rlkit.core.cluster import faults
from rlkit.core.cluster.profiling import PhaseProfiler, step_folder

if TYPE_CHECKING:
    from rlkit.core.cluster.backend import Group

POST_TIMEOUT_S = 5.0  # a board that does not answer must never stall the worker
IDLE = "idle"  # between calls: posted without waiting, it costs the step nothing


@dataclass
class WorkerPlace:
    """Where a worker lives and what it last reported."""

    rank: int
    host: str
    pid: int
    phase: str
    seconds_in_phase: float


class PhaseBoard:
    """A Ray actor (no CPU), or an object beside in-process workers: the last phase each rank posted, and when."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[str, int, str, float]] = {}

    def post(self, rank: int, host: str, pid: int, phase: str) -> None:
        self.entries[rank] = (host, pid, phase, time.monotonic())

    def read(self) -> dict[int, WorkerPlace]:
        now = time.monotonic()
        return {
            rank: WorkerPlace(rank, host, pid, phase, now - since)
            for rank, (host, pid, phase, since) in self.entries.items()
        }


Method = TypeVar("Method", bound=Callable[..., Any])


def in_phase(name: str) -> Callable[[Method], Method]:
    """A worker or role method that runs as phase `name` (`PhaseReporter.reporting`, which a role passes on to
    its worker: rlkit.core.cluster.roles): the one way methods mark theirs."""

    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.reporting(name):
                return method(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


class PhaseReporter:
    """Mixin for worker classes: a method marked `@in_phase(name)`, or a block `with self.reporting(name)`,
    posts its phase to the board, and idle when it returns.

    Entering a phase is also the fault-injection point `worker<rank>.<phase>` (rlkit.core.cluster.faults).
    """

    rank: int
    _board: Any = None
    _phase: str = "starting"
    _profiler: PhaseProfiler | None = None  # made when first armed (trainer.profile_steps)

    def attach_board(self, board: Any) -> dict[str, Any]:
        """Called by the worker group once the worker exists; returns where it runs."""
        self._board = board
        self.phase = "started"
        return {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid()}

    @contextmanager
    def reporting(self, name: str) -> Iterator[None]:
        """Phase `name` while the block runs, then idle. A block that raises leaves `name` on the board, so a
        failure message says where the worker was."""
        self.phase = name
        if self._profiler is None:
            yield
        else:
            with self._profiler.phase(name, self.rank):
                yield
        self.phase = IDLE

    def profile_phases(self, folder: str | None) -> None:
        """Profile every phase from now on into `folder`, or stop (None): rlkit.core.cluster.profiling."""
        if self._profiler is None:
            self._profiler = PhaseProfiler()
        self._profiler.arm(folder)

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        if isinstance(self._board, PhaseBoard):  # the board itself, in this process (trainer.workers=in_process)
            self._board.post(self.rank, socket.gethostname(), os.getpid(), value)
        elif self._board is not None:
            import ray

            try:
                posted = self._board.post.remote(self.rank, socket.gethostname(), os.getpid(), value)
                if value != IDLE:  # wait (~1 ms), so the phase is on the board even if this process dies next
                    ray.get(posted, timeout=POST_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - progress reporting must never break the work itself
                pass
        faults.reached(f"worker{self.rank}.{value}")


@contextmanager
def profiled_step(
    groups: Callable[[], dict[str, Group]], run_path: Path | str, step: int, steps: list[int]
) -> Iterator[Path | None]:
    """Step `step` with every worker of the groups `groups()` returns profiling its phases into RUN/profile/step<N>/
    (rlkit.core.cluster.profiling) when `step` is one of `steps` (trainer.profile_steps); yields that folder, or None
    for a step not profiled. The workers are disarmed after the step, also when it raises; then a worker that cannot
    be reached (the step's failure may be its death) leaves the step's own error to say so."""
    if step not in steps:
        yield None
        return
    folder = step_folder(run_path, step)
    armed, failed = [], True
    try:
        for name, group in groups().items():
            group.call(PhaseReporter.profile_phases, str(folder), phase=f"start profiling ({name})")
            armed.append((name, group))
        yield folder
        failed = False
    finally:
        for name, group in armed:
            try:
                group.call(PhaseReporter.profile_phases, None, phase=f"stop profiling ({name})")
            except Exception:
                if not failed:
                    raise
