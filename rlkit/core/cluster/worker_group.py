"""Ray worker groups: start one actor per device, fan calls out, and never wait forever.

Every call has a deadline (trainer.phase_timeout_s; start-up: trainer.setup_timeout_s). A dead
actor, a missed deadline or an exception in a worker becomes a WorkerFailure that names the
phase, the ranks, where they run and what they were doing (rlkit.core.cluster.phases), and the cause.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.cluster.calls import method_name
from rlkit.core.cluster.failures import (
    WorkerFailure,
    late_worker,
    with_portable_exceptions,
    worker_died,
    worker_raised,
    workers_late,
)
from rlkit.core.cluster.phases import PhaseBoard, PhaseReporter, WorkerPlace
from rlkit.core.cluster.ray_access import check_cluster, local_cluster_options, prepare_attach
from rlkit.core.cluster.worker_env import worker_env
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

logger = logging.getLogger("rlkit.workers")
POLL_S = 1.0  # how often a waiting controller looks at the phase board
PROGRESS_EVERY_S = 30  # during start-up, a "still in phase X" line this often
QUIET_PHASES = ("started", "idle")  # between phases: nothing to report


def init_ray(config: RLConfig) -> None:
    if ray.is_initialized():
        return
    env = worker_env(config)
    address = os.environ.get("RAY_ADDRESS")
    # Worker output (library warnings, load bars) stays in Ray's log files unless asked for:
    # the console belongs to the live metrics table. Worker exceptions still surface here.
    verbose = os.environ.get("RLKIT_WORKER_LOGS", "0") == "1"
    kwargs: dict[str, Any] = dict(
        runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=verbose, logging_level="WARNING"
    )
    if not address:
        # A fresh local cluster ("local" never attaches to another one found on this host),
        # sized so that every CPU worker gets its slot.
        address = "local"
        devices = config.trainer.nnodes * config.trainer.n_gpus_per_node
        kwargs["num_cpus"] = max(os.cpu_count() or 1, devices + 1)
        # Ray starts num_cpus idle Python workers for the first driver and holds ray.init until they are up;
        # rlkit's actors carry their own runtime_env, which those workers lack, so none would ever be used
        # (about 1 s of CPU each, and start-up time, on every local run).
        kwargs["_system_config"] = {"prestart_worker_first_driver": False}
        kwargs.update(local_cluster_options())  # loopback only, token authentication
    else:
        prepare_attach(address)
    ray.init(address=address, **kwargs)
    if address != "local":  # a cluster: its nodes must fit the run before any worker is placed
        check_cluster(config, ray.nodes())


def uses_gpus(config: RLConfig) -> bool:
    trainer = config.trainer
    return trainer.device == "cuda" or (trainer.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


class DeviceReservation:
    """Every device of the run, reserved at once: per node, a placement group of one bundle a device.

    `slots` lists each device as (node, bundle), node-major; worker groups take consecutive
    slices of it (training first, then split-placement rollout workers). A node's bundles
    are packed onto one Ray node; with nodes that have exactly trainer.n_gpus_per_node
    devices, the groups land on distinct nodes.
    """

    def __init__(self, config: RLConfig) -> None:
        trainer = config.trainer
        self.use_gpu = uses_gpus(config)
        bundle = {"CPU": 1, "GPU": 1} if self.use_gpu else {"CPU": 1}
        self.groups = [
            placement_group([bundle] * trainer.n_gpus_per_node, strategy="STRICT_PACK") for _ in range(trainer.nnodes)
        ]
        self.slots = [(node, local) for node in range(trainer.nnodes) for local in range(trainer.n_gpus_per_node)]
        done, _ = ray.wait(
            [group.ready() for group in self.groups], num_returns=len(self.groups), timeout=trainer.phase_timeout_s
        )
        if len(done) < len(self.groups):
            raise WorkerFailure(
                f"could not reserve {trainer.nnodes} node(s) x {trainer.n_gpus_per_node} "
                f"{'GPU' if self.use_gpu else 'CPU'}(s) within {trainer.phase_timeout_s:g} s "
                "(trainer.phase_timeout_s); "
                f"the Ray cluster has {ray.cluster_resources()} "
                "(check trainer.nnodes / trainer.n_gpus_per_node)"
            )

    def release(self) -> None:
        for group in self.groups:
            remove_placement_group(group)


class WorkerGroup:
    """One actor of `worker_cls` per slot of a DeviceReservation; rank r gets slots[r].

    `colocate_with` puts this group's rank r on the same device as that group's rank r (the
    critic beside the policy); every group of the run then takes an equal share of each device.
    """

    def __init__(
        self,
        worker_cls: type,
        config: RLConfig,
        *args: Any,
        name: str = "worker",
        colocate_with: WorkerGroup | None = None,
        reservation: DeviceReservation | None = None,
        slots: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        self.config, self.name, self.worker_cls = config, name, worker_cls
        if colocate_with is not None:
            reservation, slots = colocate_with.reservation, colocate_with.slots
        self.owns_reservation = reservation is None
        self.reservation = reservation or DeviceReservation(config)
        self.slots = list(self.reservation.slots[: config.world_size] if slots is None else slots)
        share = 1.0 / groups_per_device(config)
        remote_cls = ray.remote(num_cpus=share, num_gpus=share if self.reservation.use_gpu else 0)(
            with_portable_exceptions(worker_cls)
        )
        self.actors = []
        for rank, (node, local) in enumerate(self.slots):
            strategy = PlacementGroupSchedulingStrategy(
                self.reservation.groups[node], placement_group_bundle_index=local
            )
            self.actors.append(
                remote_cls.options(scheduling_strategy=strategy, name=None).remote(config, *args, rank, len(self.slots))
            )
        self.board: Any = None  # the PhaseBoard, for worker classes that report phases
        if issubclass(worker_cls, PhaseReporter):
            self.board = ray.remote(num_cpus=0)(PhaseBoard).remote()
            self.call(PhaseReporter.attach_board, self.board, phase="start (worker processes)", startup=True)

    @property
    def size(self) -> int:
        return len(self.actors)

    def call(
        self,
        method: Callable[..., Any],
        *args: Any,
        phase: str | None = None,
        per_rank: Sequence[tuple] | None = None,
        startup: bool = False,
    ) -> list[Any]:
        """Call `method` on every rank (same args, or per_rank[r]) and gather the results in rank order.

        The deadline is trainer.phase_timeout_s, or trainer.setup_timeout_s for start-up calls
        (startup=True: model load, engine start), which also log each rank's progress.
        """
        return self.collect(self.submit(method, *args, per_rank=per_rank), phase or method.__name__, startup=startup)

    def submit(self, method: Callable[..., Any], *args: Any, per_rank: Sequence[tuple] | None = None) -> list[Any]:
        """Start `method` on every rank without waiting: one Ray ObjectRef per rank, in rank order.

        An actor runs its calls one at a time in the order they were submitted, so a call
        submitted after another on the same group runs after it on every rank.
        """
        name = method_name(self.worker_cls, method)
        if per_rank is not None:
            return [getattr(a, name).remote(*per_rank[r]) for r, a in enumerate(self.actors)]
        return [getattr(a, name).remote(*args) for a in self.actors]

    def collect(self, refs: list[Any], phase: str, *, startup: bool = False) -> list[Any]:
        """Wait for submitted calls (deadline as `call`'s, counted from now) and return their results in rank order."""
        trainer = self.config.trainer
        key = "trainer.setup_timeout_s" if startup else "trainer.phase_timeout_s"
        timeout = trainer.setup_timeout_s if startup else trainer.phase_timeout_s
        return self._wait(refs, phase, timeout=timeout, timeout_key=key, progress=startup)

    def _wait(self, refs: list, phase: str, timeout: float, timeout_key: str, progress: bool) -> list[Any]:
        start = time.monotonic()
        deadline = start + timeout
        pending = list(refs)
        results: list[Any] = [None] * len(refs)
        shown: dict[int, tuple[str, int]] = {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            if progress:
                self._log_progress(phase, shown)
            for ref in done:
                rank = refs.index(ref)
                results[rank] = self._result(ref, rank, phase)
            if pending and not done and time.monotonic() >= deadline:
                places = self.places()
                late = [late_worker(r, self._node(r), places.get(r)) for r, ref in enumerate(refs) if ref in pending]
                finished = [r for r, ref in enumerate(refs) if ref not in pending]
                raise workers_late(self.name, phase, timeout, timeout_key, late, finished)
        if progress:
            logger.info("%s: all %d %ss done in %.0f s", phase, len(refs), self.name, time.monotonic() - start)
        return results

    def _result(self, ref: Any, rank: int, phase: str) -> Any:
        """The call's result, or the WorkerFailure (UserError) saying why there is none."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise worker_died(self.name, rank, self._node(rank), phase, self.places().get(rank), str(exc)) from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            if isinstance(cause, UserError):  # a fixable input the worker was first to see
                raise UserError(f"{self.name} rank {rank}: {cause}") from None
            raise worker_raised(
                self.name, rank, self._node(rank), phase, self.places().get(rank), cause, str(exc)
            ) from None

    def places(self) -> dict[int, WorkerPlace]:
        """Each rank's host, pid and last reported phase (empty if the board cannot be read)."""
        if self.board is None:
            return {}
        try:
            return ray.get(self.board.read.remote(), timeout=POLL_S)
        except Exception:  # noqa: BLE001 - a failure message must not fail for want of detail
            return {}

    def _log_progress(self, phase: str, shown: dict[int, tuple[str, int]]) -> None:
        """One line per phase change of each rank, and a reminder every PROGRESS_EVERY_S seconds."""
        for rank, place in sorted(self.places().items()):
            tick = int(place.seconds_in_phase // PROGRESS_EVERY_S)
            if place.phase in QUIET_PHASES or shown.get(rank) == (place.phase, tick):
                continue
            shown[rank] = (place.phase, tick)
            if tick:
                logger.info(
                    "%s: %s rank %d still in %s after %.0f s",
                    phase,
                    self.name,
                    rank,
                    place.phase,
                    place.seconds_in_phase,
                )
            else:
                logger.info("%s: %s rank %d in %s", phase, self.name, rank, place.phase)

    def _node(self, rank: int) -> int:
        return self.slots[rank][0]

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.owns_reservation:
            self.reservation.release()


def groups_per_device(config: RLConfig) -> int:
    """Worker groups sharing each device: the policy group, and the critic group when there is one."""
    return 2 if Algorithm.from_config(config).critic else 1


class RayBackend:
    """trainer.workers=ray (rlkit.core.cluster.backend): the Ray cluster (started, or the one at RAY_ADDRESS)
    and every device of the run reserved at once; groups take slices of the reservation."""

    def __init__(self, config: RLConfig) -> None:
        self.config = config
        try:
            init_ray(config)
            self.reservation = DeviceReservation(config)
        except BaseException:  # a cluster too small, no devices free: leave no Ray session behind
            ray.shutdown()
            raise

    def group(
        self,
        worker_cls: type,
        *args: Any,
        name: str,
        first: int = 0,
        count: int | None = None,
        colocate_with: WorkerGroup | None = None,
    ) -> WorkerGroup:
        count = self.config.world_size if count is None else count
        slots = None if colocate_with is not None else self.reservation.slots[first : first + count]
        return WorkerGroup(
            worker_cls,
            self.config,
            *args,
            name=name,
            colocate_with=colocate_with,
            reservation=self.reservation,
            slots=slots,
        )

    def shutdown(self) -> None:
        """Every actor of the run ends with the Ray session (the driver's actors die with it)."""
        try:
            self.reservation.release()
        finally:
            ray.shutdown()
