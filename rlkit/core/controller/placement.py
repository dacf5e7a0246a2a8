"""Where rollout runs relative to training (rollout.placement).

colocated: every training worker also holds a rollout engine on its own device; vLLM
    sleeps (frees its KV cache, moves its weights to host memory) while training runs,
    and the weight sync is a local copy from the FSDP shards.
split: rollout.devices devices hold only rollout workers; the others train. After each
    update every training rank gathers the full weights and training rank 0 sends them to
    every rollout worker (across nodes too): broadcast over a collective of their own
    (rlkit.core.cluster.weight_transfer; NCCL on GPUs, gloo on CPU), or through Ray's object
    store in buckets (rollout.weight_sync=object_store).

A weight sync has two halves: `start_sync` does the training side and queues the rollout
side on the rollout workers (behind any generation already queued there); `finish_sync`
waits for the rollout side. `sync_weights` is both at once; an asynchronous rollout source
(rlkit.core.rollout.async_source) waits for the rollout side only when it needs the batch
generated after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rlkit.core.cluster.backend import Backend
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.rollout.generator import Generator
from rlkit.core.rollout.sync_check import first_change
from rlkit.core.rollout.worker import RolloutWorker
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.core.train.weight_export import WeightExport
from rlkit.recipes.schema import RLConfig

# Size of one bucket of weights (split placement), for either way of sending them.
BUCKET_BYTES = 256 << 20


@dataclass
class PendingSync:
    """A weight sync whose training side is done: the training side's metrics, the rollout side's calls."""

    metrics: dict[str, float]
    rollout_refs: list[Any] = field(default_factory=list)  # empty when colocated (nothing left to wait for)


class Placement:
    """The training group and the group that generates (the same group when colocated)."""

    def __init__(self, config: RLConfig, model_path: str, backend: Backend) -> None:
        """Training on the run's first config.world_size devices; split placement's rollout workers on the rest."""
        self.config = config
        self.train = backend.group(PolicyWorker, model_path, name="worker")
        self.split = config.rollout.placement == "split"
        self.broadcast = self.split and config.rollout.weight_sync == "broadcast"
        self.rollout = (
            backend.group(
                RolloutWorker, model_path, name="rollout worker", first=config.world_size, count=config.rollout.devices
            )
            if self.split
            else self.train
        )
        self.rollout_setup: list[dict[str, Any]] = []  # split placement: each rollout worker's, after setup()

    @property
    def rollout_size(self) -> int:
        return self.rollout.size

    def setup(self) -> list[Any]:
        """Start process groups, load models, start engines; returns the training ranks' setup info
        (the rollout workers' is `rollout_setup`).

        Split placement: the rollout workers start their engines while the training workers load the
        model, both at once: they share no device, and neither needs the other until the weight transfer.
        """
        master = self.train.call(DeviceWorker.address, phase="address")[0]
        train = self.train.submit(PolicyWorker.setup, *master)
        rollout = self.rollout.submit(RolloutWorker.setup) if self.split else []
        info = self.train.collect(train, "setup (model load + engine start)", startup=True)
        if self.split:
            self.rollout_setup = self.rollout.collect(rollout, "rollout setup (engine start)", startup=True)
        if self.broadcast:
            self.join_weight_transfer()
        return info

    def join_weight_transfer(self) -> None:
        """Training rank 0 and every rollout worker form the transfer group (each side waits for the other)."""
        host, port = self.train.call(DeviceWorker.address, phase="address")[0]
        specs = self.train.call(WeightExport.weight_specs, phase="weight specs")[0]
        world = 1 + self.rollout_size
        train = self.train.submit(WeightExport.join_weight_transfer, host, port, world, specs, BUCKET_BYTES)
        rollout = self.rollout.submit(RolloutWorker.join_weight_transfer, host, port, world, specs, BUCKET_BYTES)
        self.train.collect(train, "weight transfer group (training rank 0)", startup=True)
        self.rollout.collect(rollout, "weight transfer group (rollout workers)", startup=True)

    def sync_weights(self) -> dict[str, float]:
        """Load the trained weights into every engine; checked by each engine's SyncProbe
        (rlkit.core.rollout.sync_check)."""
        pending = self.start_sync()
        return {**pending.metrics, **self.finish_sync(pending)}

    def start_sync(self) -> PendingSync:
        """The training side of a weight sync; the rollout side is queued on the rollout workers."""
        if not self.split:
            synced = self.train.call(Generator.sync_weights)
            return PendingSync({**synced[0], **first_change(synced)})
        start = time.perf_counter()
        if self.broadcast:
            self.train.call(WeightExport.send_weights, phase="sync_weights (gather + stage)")
            refs = self.rollout.submit(RolloutWorker.receive_weights)
        else:
            buckets = self.train.call(WeightExport.export_weights, BUCKET_BYTES, phase="sync_weights (gather)")[0]
            refs = self.rollout.submit(RolloutWorker.load_weights, buckets)
        return PendingSync({"sync/seconds": time.perf_counter() - start}, refs)

    def finish_sync(self, pending: PendingSync) -> dict[str, float]:
        """Wait for the rollout side of a sync; its metrics (the slowest rollout worker's)."""
        if not pending.rollout_refs:
            return {}
        loaded = self.rollout.collect(pending.rollout_refs, "sync_weights (rollout workers load)")
        return {
            "sync/bytes": loaded[0]["bytes"],
            "sync/rollout_load_seconds": max(r["seconds"] for r in loaded),
            # From the end of the rollout's previous call: waiting for these weights, then loading them.
            "rollout/wait_for_weights_seconds": max(r["idle_seconds"] + r["seconds"] for r in loaded),
            **first_change(loaded),
        }

    def shutdown(self) -> None:
        if self.split:
            self.rollout.shutdown()
        self.train.shutdown()
