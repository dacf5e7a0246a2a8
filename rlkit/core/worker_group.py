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
}


class WorkerFailure(RuntimeError):
    """A worker died or missed its deadline; the message says which, where and why."""


def init_ray(config: RLConfig) -> None:
    if ray.is_initialized():
        return
    env = {**WORKER_ENV, **{k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "RLKIT_"))}}
    address = os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = dict(runtime_env={"env_vars": env}, include_dashboard=False,
                                  log_to_driver=True, logging_level="WARNING")
    if not address:  # a local cluster sized so that every CPU worker gets its slot
        devices = config.trainer.nnodes * config.trainer.n_gpus_per_node
        kwargs["num_cpus"] = max(os.cpu_count() or 1, devices + 1)
    ray.init(address=address, **kwargs)


def uses_gpus(config: RLConfig) -> bool:
    trainer = config.trainer
    return trainer.device == "cuda" or (trainer.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


class DeviceReservation:
    """Every device of the run, reserved at once: one placement-group bundle per node.

    Bundles are spread over distinct nodes (STRICT_SPREAD), so trainer.nnodes=2 really
    uses two nodes. `slots` lists each device's bundle, node-major; worker groups take
    consecutive slices of it (training first, then split-placement rollout workers).
    """

    def __init__(self, config: RLConfig) -> None:
        trainer = config.trainer
        self.use_gpu = uses_gpus(config)
        per_node = trainer.n_gpus_per_node
        bundle = {"CPU": per_node, "GPU": per_node} if self.use_gpu else {"CPU": per_node}
        self.group = placement_group([bundle] * trainer.nnodes,
                                     strategy="STRICT_SPREAD" if trainer.nnodes > 1 else "STRICT_PACK")
        self.slots = [node for node in range(trainer.nnodes) for _ in range(per_node)]
        ready = self.group.ready()
        deadline = trainer.phase_timeout_s
        done, _ = ray.wait([ready], timeout=deadline)
        if not done:
            raise WorkerFailure(f"could not reserve {trainer.nnodes} node(s) x {per_node} "
                                f"{'GPU' if self.use_gpu else 'CPU'}(s) within {deadline:.0f} s; the Ray cluster "
                                f"has {ray.cluster_resources()} (check trainer.nnodes / trainer.n_gpus_per_node)")

    def release(self) -> None:
        remove_placement_group(self.group)


class WorkerGroup:
    """One actor of `worker_cls` per slot of a DeviceReservation; rank r gets slots[r]."""

    def __init__(self, worker_cls: type, config: RLConfig, *args: Any, name: str = "worker",
                 reservation: DeviceReservation | None = None, slots: Sequence[int] | None = None) -> None:
        self.config, self.name = config, name
        self.owns_reservation = reservation is None
        self.reservation = reservation or DeviceReservation(config)
        slots = list(self.reservation.slots[:config.world_size] if slots is None else slots)
        self.node_of_rank = slots
        remote_cls = ray.remote(num_cpus=1, num_gpus=1 if self.reservation.use_gpu else 0)(worker_cls)
        self.actors = []
        for rank, bundle in enumerate(slots):
            strategy = PlacementGroupSchedulingStrategy(self.reservation.group, placement_group_bundle_index=bundle)
            self.actors.append(remote_cls.options(scheduling_strategy=strategy, name=None).remote(
                config, *args, rank, len(slots)))

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
                raise WorkerFailure(f"{self.name} rank {rank} (node {self.node_of_rank[rank]}) "
                                    f"died during phase '{phase}': {_reason(exc)}") from None
        return ray.get(refs)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.owns_reservation:
            self.reservation.release()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    for line in text:  # Ray's message is long; the cause line is the useful one
        if "exit" in line.lower() or "killed" in line.lower() or "oom" in line.lower() or "signal" in line.lower():
            return line.strip()
    return text[0] if text else type(exc).__name__
