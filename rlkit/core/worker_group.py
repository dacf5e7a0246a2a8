"""Ray worker groups: start one actor per device, fan calls out, and never wait forever.

Every call has a deadline (trainer.phase_timeout_s). A dead actor or a missed deadline
becomes a WorkerFailure that names the phase, the ranks and Ray's reason.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlkit.recipes.schema import RLConfig

# NVLink multicast stays off on the lent GPU machines (see ../shared/gpu/README.md).
WORKER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    # vLLM logs every weight reload; the live metrics table is what a person watches.
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    # vLLM's CPU build (no effect on GPUs): a small KV cache instead of a share of all RAM,
    # and no core pinning, so several workers on one host don't pin to the same cores.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


class WorkerFailure(RuntimeError):
    """A worker died or missed its deadline; the message says which, where and why."""


def init_ray(config: RLConfig) -> None:
    if ray.is_initialized():
        return
    env = {**WORKER_ENV, **{k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "RLKIT_"))}}
    address = os.environ.get("RAY_ADDRESS")
    # Worker output (library warnings, load bars) stays in Ray's log files unless asked for:
    # the console belongs to the live metrics table. Worker exceptions still surface here.
    verbose = os.environ.get("RLKIT_WORKER_LOGS", "0") == "1"
    kwargs: dict[str, Any] = dict(runtime_env={"env_vars": env}, include_dashboard=False,
                                  log_to_driver=verbose, logging_level="WARNING")
    if not address:
        # A fresh local cluster ("local" never attaches to another one found on this host),
        # sized so that every CPU worker gets its slot.
        address = "local"
        devices = config.trainer.nnodes * config.trainer.n_gpus_per_node
        kwargs["num_cpus"] = max(os.cpu_count() or 1, devices + 1)
    ray.init(address=address, **kwargs)


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
        self.groups = [placement_group([bundle] * trainer.n_gpus_per_node, strategy="STRICT_PACK")
                       for _ in range(trainer.nnodes)]
        self.slots = [(node, local) for node in range(trainer.nnodes) for local in range(trainer.n_gpus_per_node)]
        done, _ = ray.wait([group.ready() for group in self.groups], num_returns=len(self.groups),
                           timeout=trainer.phase_timeout_s)
        if len(done) < len(self.groups):
            raise WorkerFailure(f"could not reserve {trainer.nnodes} node(s) x {trainer.n_gpus_per_node} "
                                f"{'GPU' if self.use_gpu else 'CPU'}(s) within {trainer.phase_timeout_s:.0f} s; "
                                f"the Ray cluster has {ray.cluster_resources()} "
                                "(check trainer.nnodes / trainer.n_gpus_per_node)")

    def release(self) -> None:
        for group in self.groups:
            remove_placement_group(group)


class WorkerGroup:
    """One actor of `worker_cls` per slot of a DeviceReservation; rank r gets slots[r].

    `colocate_with` puts this group's rank r on the same device as that group's rank r (the
    critic beside the policy); every group of the run then takes an equal share of each device.
    """

    def __init__(self, worker_cls: type, config: RLConfig, *args: Any, name: str = "worker",
                 colocate_with: WorkerGroup | None = None, reservation: DeviceReservation | None = None,
                 slots: Sequence[tuple[int, int]] | None = None) -> None:
        self.config, self.name = config, name
        if colocate_with is not None:
            reservation, slots = colocate_with.reservation, colocate_with.slots
        self.owns_reservation = reservation is None
        self.reservation = reservation or DeviceReservation(config)
        self.slots = list(self.reservation.slots[:config.world_size] if slots is None else slots)
        share = 1.0 / groups_per_device(config)
        remote_cls = ray.remote(num_cpus=share, num_gpus=share if self.reservation.use_gpu else 0)(worker_cls)
        self.actors = []
        for rank, (node, local) in enumerate(self.slots):
            strategy = PlacementGroupSchedulingStrategy(self.reservation.groups[node], placement_group_bundle_index=local)
            self.actors.append(remote_cls.options(scheduling_strategy=strategy, name=None).remote(
                config, *args, rank, len(self.slots)))

    def call(self, method: str, *args: Any, phase: str | None = None, timeout: float | None = None,
             per_rank: Sequence[tuple] | None = None) -> list[Any]:
        """Call `method` on every rank (same args, or per_rank[r]) and gather the results in rank order."""
        phase = phase or method
        if per_rank is not None:
            refs = [getattr(a, method).remote(*per_rank[r]) for r, a in enumerate(self.actors)]
        else:
            refs = [getattr(a, method).remote(*args) for a in self.actors]
        return self._wait(refs, phase, timeout=timeout or self.config.trainer.phase_timeout_s)

    def _wait(self, refs: list, phase: str, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                late = [refs.index(r) for r in pending]
                raise WorkerFailure(f"{self.name}s {late} did not finish phase '{phase}' within {timeout:.0f} s "
                                    f"(trainer.phase_timeout_s); the run stops instead of waiting forever")
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                rank = refs.index(done[0])
                raise WorkerFailure(f"{self.name} rank {rank} (node {self.slots[rank][0]}) "
                                    f"died during phase '{phase}': {_reason(exc)}") from None
        return ray.get(refs)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.owns_reservation:
            self.reservation.release()


def groups_per_device(config: RLConfig) -> int:
    """Worker groups sharing each device: the policy group, and the critic group when there is one."""
    return 2 if config.critic_enabled else 1


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    for line in text:  # Ray's message is long; the cause line is the useful one
        if "exit" in line.lower() or "killed" in line.lower() or "oom" in line.lower() or "signal" in line.lower():
            return line.strip()
    return text[0] if text else type(exc).__name__
