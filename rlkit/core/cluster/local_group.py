"""In-process workers (trainer.workers=in_process): the worker groups' protocol with no Ray and no subprocess.

Each group is one plain object of its worker class in the controller's process (rank 0 of 1, on the
CPU), for debugging on one device, notebooks and tests: a run starts in seconds instead of starting
worker processes, and a debugger or profiler sees the workers' code.

What it keeps from the Ray groups (rlkit.core.cluster.worker_group): calls run one at a time in
the order they were submitted (`submit` runs the call at once and returns its finished handle), a
worker's exception becomes the same WorkerFailure (a UserError stays a UserError, named with the
rank), and the workers post their phases to a PhaseBoard, here the object itself.

What it cannot do: enforce trainer.phase_timeout_s / setup_timeout_s. A call runs in the controller's
own thread, which cannot be stopped from outside without leaving the worker half-way through its
work; a call that hangs hangs the run until Ctrl-C (a second Ctrl-C stops at once). It refuses
several devices and GPUs (rlkit.recipes.checks.check_in_process); split placement is one training and one
rollout worker, each an object here, the weights handed over in memory. An asynchronous rollout
(rollout.mode=one_step_off/async) keeps its schedule: each batch is generated when it is submitted, with the
policy version the schedule gives it, so the batches, versions and checkpoints are those of a Ray run; only
the overlap of generation with training is gone.

Process state it takes and gives back at shutdown: torch.distributed's world of one (the policy and a
colocated critic share it: rlkit.core.cluster.device_worker), the environment variables that the
workers set (rlkit's worker settings, MASTER_ADDR and friends), torch's thread count, and vLLM's
parallel state when an engine started. The workers seed the process's RNGs, which the controller's
own draws share: a checkpoint saves that state once for both, and a resume restores it.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from rlkit.core.cluster.calls import method_name
from rlkit.core.cluster.failures import worker_raised
from rlkit.core.cluster.phases import PhaseBoard, PhaseReporter, WorkerPlace
from rlkit.core.cluster.worker_env import worker_env
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

logger = logging.getLogger("rlkit.workers")
# Set by DeviceWorker.join_process_group for torch.distributed; given back at shutdown.
PROCESS_GROUP_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
NODE = 0  # the one node (messages name a rank's node)
START_PHASE = "start (worker objects)"


@dataclass
class Finished:
    """A call that has run: its result, or the exception it raised and its traceback."""

    result: Any = None
    error: Exception | None = None
    traceback: str = ""
    seconds: float = 0.0


class InProcessWorkerGroup:
    """Rank 0 of 1: an object of `worker_cls`, constructed as a Ray group constructs its actors."""

    def __init__(self, worker_cls: type, config: RLConfig, *args: Any, name: str = "worker") -> None:
        self.config, self.name, self.worker_cls = config, name, worker_cls
        self.board: PhaseBoard | None = None  # what each rank last reported, for worker classes that report
        self.workers: list[Any] = []
        try:
            self.workers.append(worker_cls(config, *args, 0, 1))
        except Exception as exc:  # noqa: BLE001 - reported as the Ray group reports a raising worker
            self._result(Finished(error=exc, traceback=traceback.format_exc()), 0, START_PHASE)
        if issubclass(worker_cls, PhaseReporter):
            self.board = PhaseBoard()
            self.call(PhaseReporter.attach_board, self.board, phase=START_PHASE, startup=True)

    @property
    def size(self) -> int:
        return len(self.workers)

    def call(
        self,
        method: Callable[..., Any],
        *args: Any,
        phase: str | None = None,
        per_rank: Sequence[tuple] | None = None,
        startup: bool = False,
    ) -> list[Any]:
        handles = self.submit(method, *args, per_rank=per_rank)
        return self.collect(handles, phase or method.__name__, startup=startup)

    def submit(self, method: Callable[..., Any], *args: Any, per_rank: Sequence[tuple] | None = None) -> list[Finished]:
        """Run `method` on every rank now; an exception waits in its handle for `collect`, as on Ray."""
        name = method_name(self.worker_cls, method)
        handles = []
        for rank, worker in enumerate(self.workers):
            started = time.perf_counter()
            try:
                handle = Finished(getattr(worker, name)(*(per_rank[rank] if per_rank is not None else args)))
            except Exception as exc:  # noqa: BLE001 - KeyboardInterrupt goes on up: Ctrl-C stops the run
                handle = Finished(error=exc, traceback=traceback.format_exc())
            handle.seconds = time.perf_counter() - started
            handles.append(handle)
        return handles

    def collect(self, refs: list[Finished], phase: str, *, startup: bool = False) -> list[Any]:
        """The results in rank order, or the first rank's failure. No deadline: the calls have already run."""
        results = [self._result(handle, rank, phase) for rank, handle in enumerate(refs)]
        if startup:
            logger.info(
                "%s: all %d %ss done in %.0f s",
                phase,
                len(refs),
                self.name,
                max((handle.seconds for handle in refs), default=0.0),
            )
        return results

    def _result(self, handle: Finished, rank: int, phase: str) -> Any:
        cause = handle.error
        if cause is None:
            return handle.result
        if isinstance(cause, UserError):  # a fixable input the worker was first to see
            raise UserError(f"{self.name} rank {rank}: {cause}") from None
        raise worker_raised(self.name, rank, NODE, phase, self.places().get(rank), cause, handle.traceback) from None

    def places(self) -> dict[int, WorkerPlace]:
        return self.board.read() if self.board is not None else {}

    def shutdown(self) -> None:
        """Drop the workers (their models and engines go with the last reference)."""
        self.workers = []


class InProcessBackend:
    """trainer.workers=in_process (rlkit.core.cluster.backend): groups of one worker object each, on the CPU."""

    def __init__(self, config: RLConfig) -> None:
        if config.trainer.device == "auto" and torch.cuda.is_available():
            raise UserError(
                "trainer.workers=in_process runs on the CPU only, and trainer.device=auto would use this "
                "machine's GPU; set trainer.device=cpu or use trainer.workers=ray"
            )
        if dist.is_initialized():
            raise UserError(
                "trainer.workers=in_process needs this process's torch.distributed for its workers, and "
                "it is already initialised (another in-process run that was not closed?); close that run "
                "first or use trainer.workers=ray"
            )
        self.config = config
        added = {k: v for k, v in worker_env(config).items() if k not in os.environ}  # the caller's settings win
        self.saved_env = {key: os.environ.get(key) for key in (*added, *PROCESS_GROUP_ENV)}
        self.saved_threads = torch.get_num_threads()  # a CPU worker sets trainer.cpu_threads_per_worker
        os.environ.update(added)
        self.groups: list[InProcessWorkerGroup] = []

    def group(
        self,
        worker_cls: type,
        *args: Any,
        name: str,
        first: int = 0,
        count: int | None = None,
        colocate_with: InProcessWorkerGroup | None = None,
    ) -> InProcessWorkerGroup:
        """The group's one worker (first=0, count=1: rlkit.recipes.checks refuses other layouts); a colocated
        group is simply another object in this process."""
        group = InProcessWorkerGroup(worker_cls, self.config, *args, name=name)
        self.groups.append(group)
        return group

    def shutdown(self) -> None:
        """Drop the workers, then give back the process state they took, so another run can start here."""
        for group in self.groups:
            group.shutdown()
        self.groups = []
        release_engines()
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.set_num_threads(self.saved_threads)


def release_engines() -> None:
    """Free what engines that ran in this process hold once nothing references them (their models, and the
    torch.distributed world vLLM set up), so that another run or engine can start in this process."""
    gc.collect()  # engines and models whose last reference is gone but sits in a reference cycle
    if "vllm.distributed.parallel_state" in sys.modules:  # an engine ran: its groups hold the world below
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()
