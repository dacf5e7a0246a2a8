"""The weight-export role (split placement): the actor's full weights, out to rollout workers on other devices.

Gathering a full tensor from its FSDP2 shards is a collective, so every training rank takes part;
training rank 0 alone sends: into Ray's object store in buckets (rollout.weight_sync=object_store,
`export_weights`; in-process workers hand the buckets over as they are), or over a transfer group it shares
with the rollout workers (broadcast, `join_weight_transfer` once, then `send_weights` after every update;
rlkit.core.cluster.weight_transfer).
The rollout workers load what arrives into their generation role (rlkit.core.rollout.worker).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.cluster.roles import Role
from rlkit.core.cluster.weight_transfer import TensorSpec, TransferGroup, WeightSender
from rlkit.core.train import fsdp
from rlkit.core.train.model import TrainableModel


class WeightExport(Role):
    """Rank `rank`'s part in sending `model`'s weights, in the rollout dtype `dtype`; `share` puts a bucket where
    the rollout workers fetch it (rlkit.core.cluster.device_worker.DeviceWorker.share); a transfer group's
    handshake waits up to `handshake_timeout_s` (trainer.phase_timeout_s), a transfer up to
    `transfer_timeout_s` (rollout.weight_sync_timeout_s)."""

    def __init__(
        self,
        phases: PhaseReporter,
        model: TrainableModel,
        rank: int,
        device: torch.device,
        dtype: str,
        share: Callable[[Any], Any],
        *,
        handshake_timeout_s: float,
        transfer_timeout_s: float,
    ) -> None:
        super().__init__(phases)
        self.model, self.rank, self.device, self.dtype, self.share = model, rank, device, dtype, share
        self.handshake_timeout_s, self.transfer_timeout_s = handshake_timeout_s, transfer_timeout_s
        self.weight_sender: WeightSender | None = None  # rank 0, once it joined the transfer group

    @in_phase("export_weights")
    def export_weights(self, bucket_bytes: int) -> list | None:
        """Full tensors in the rollout dtype, in shared buckets (rank 0 returns their refs).

        Every rank must take part (gathering a full tensor is a collective); rollout workers
        then fetch the buckets straight from the object store.
        """
        refs, bucket, size = [], [], 0
        for name, tensor in self.model.engine_weights():
            if self.rank == 0:
                bucket.append((name, tensor.to(fsdp.DTYPES[self.dtype]).cpu()))
                size += bucket[-1][1].numel() * bucket[-1][1].element_size()
                if size >= bucket_bytes:
                    refs.append(self.share(bucket))
                    bucket, size = [], 0
        if bucket:
            refs.append(self.share(bucket))
        return refs if self.rank == 0 else None

    # -- over a collective of its own ---------------------------------------------------
    def weight_specs(self) -> list[TensorSpec]:
        """Every weight's name and full shape, in the order send_weights gathers them (no collective)."""
        return [TensorSpec(name, shape) for name, shape in self.model.engine_weight_shapes()]

    def join_weight_transfer(
        self, host: str, port: int, world_size: int, specs: list[TensorSpec], bucket_bytes: int
    ) -> None:
        """Rank 0 joins the rollout workers' transfer group (as its rank 0); the other ranks only help gather."""
        if self.rank == 0:
            group = TransferGroup(
                host,
                port,
                0,
                world_size,
                self.device,
                handshake_timeout_s=self.handshake_timeout_s,
                transfer_timeout_s=self.transfer_timeout_s,
            )
            self.weight_sender = WeightSender(group, specs, fsdp.DTYPES[self.dtype], bucket_bytes)

    @in_phase("send_weights")
    def send_weights(self) -> None:
        """Gather the full tensors (every rank); rank 0 stages them and broadcasts them in the background."""
        items = self.model.engine_weights()
        if self.rank == 0:
            self.weight_sender.send(items)  # type: ignore[union-attr]
        else:
            for _ in items:  # each gather is a collective: every rank takes part
                pass
