"""Where rollout runs relative to training (rollout.placement).

colocated: every training worker also holds a rollout engine on its own device; vLLM
    sleeps (frees its KV cache, moves its weights to host memory) while training runs,
    and the weight sync is a local copy from the FSDP shards.
split: rollout.devices devices hold only rollout workers; the others train. After each
    update training rank 0 gathers the full weights into Ray's object store, in buckets,
    and every rollout worker loads them from there (across nodes too).
"""

from __future__ import annotations

import time
from typing import Any

from rlkit.core.cluster.worker_group import DeviceReservation, WorkerGroup
from rlkit.core.rollout.sync_check import first_change
from rlkit.core.rollout.worker import RolloutWorker
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.schema import RLConfig

# Size of one object-store bucket of weights (split placement).
BUCKET_BYTES = 256 << 20


class Placement:
    """The training group and the group that generates (the same group when colocated)."""

    def __init__(self, config: RLConfig, model_path: str) -> None:
        self.config = config
        self.reservation = DeviceReservation(config)
        train_slots = self.reservation.slots[:config.world_size]
        self.train = WorkerGroup(PolicyWorker, config, model_path, name="worker", reservation=self.reservation,
                                 slots=train_slots)
        self.split = config.rollout.placement == "split"
        self.rollout = WorkerGroup(RolloutWorker, config, model_path, name="rollout worker",
                                   reservation=self.reservation,
                                   slots=self.reservation.slots[config.world_size:]) if self.split else self.train

    @property
    def rollout_size(self) -> int:
        return len(self.rollout.actors)

    def setup(self) -> list[Any]:
        """Start process groups, load models, start engines; returns the training ranks' setup info."""
        master = self.train.call("address", phase="address")[0]
        info = self.train.call("setup", *master, phase="setup (model load + engine start)", startup=True)
        if self.split:
            self.rollout.call("setup", phase="rollout setup (engine start)", startup=True)
        return info

    def sync_weights(self) -> dict[str, float]:
        """Load the trained weights into every engine; with the first load's check (rlkit.core.rollout.sync_check)."""
        if not self.split:
            synced = self.train.call("sync_weights")
            return {**synced[0], **first_change(synced)}
        start = time.perf_counter()
        refs = self.train.call("export_weights", BUCKET_BYTES, phase="sync_weights (gather)")[0]
        loaded = self.rollout.call("load_weights", refs, phase="sync_weights (load)")
        return {"sync/bytes": loaded[0]["bytes"], "sync/seconds": time.perf_counter() - start, **first_change(loaded)}

    def shutdown(self) -> None:
        if self.split:
            self.rollout.shutdown()
        self.train.shutdown()
        self.reservation.release()
