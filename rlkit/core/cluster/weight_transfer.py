"""Weights from training rank 0 to the rollout workers (split placement) over a collective of their own.

The rollout workers are not in the training world, so they and training rank 0 form a
separate process group: rank 0 is training rank 0, ranks 1..R the rollout workers. It is
built straight from a TCPStore (NCCL on GPUs, gloo on CPU, the same calls), so it never
touches the default group of either side (training's, or the one vLLM creates for itself).

After each update every training rank gathers the full tensors (FSDP2), training rank 0
casts them to the rollout dtype and packs them into flat buckets of `bucket_bytes`, and a
background thread broadcasts the buckets, so the trainer goes on with the next step while
they travel. A rollout worker receives the buckets in its queue of calls, after the
generation already queued there: it does not generate while it receives and loads (at most
one bucket in memory), and no request ever mixes two policy versions.

Every wait has a deadline. A transfer starts with a handshake through the store (transfer n
begins when the sender has posted it and every receiver has answered): a receiver may still
be generating, so each side gives the other trainer.phase_timeout_s to arrive. From then on the buckets must
arrive within rollout.weight_sync_timeout_s; past it the side that waits raises WeightTransferStalled,
which names the transfer, the bucket and the key to raise.
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

POLL_S = 0.0005  # how often a waiting side checks its broadcast (and its deadline)
STORE_PREFIX = "rlkit-weight-transfer"


class WeightTransferStalled(RuntimeError):
    """A weight transfer (or its handshake) missed its deadline."""


@dataclass(frozen=True)
class TensorSpec:
    """A parameter as it travels: its HF name and full shape (every tensor in the rollout dtype)."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def plan_buckets(specs: list[TensorSpec], bucket_numel: int) -> list[list[TensorSpec]]:
    """Consecutive tensors grouped into buckets of at most `bucket_numel` elements (a larger tensor
    gets a bucket of its own). Both sides compute the same plan from the same specs."""
    buckets: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.numel > bucket_numel:
            buckets.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.numel
    if current:
        buckets.append(current)
    return buckets


def unpack(flat: torch.Tensor, specs: list[TensorSpec]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, view) for each tensor packed in `flat`, in order."""
    offset = 0
    for spec in specs:
        yield spec.name, flat[offset : offset + spec.numel].view(spec.shape)
        offset += spec.numel


class TransferGroup:
    """The process group of training rank 0 (rank 0) and the rollout workers (ranks 1..R)."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        device: torch.device,
        *,
        handshake_timeout_s: float,
        transfer_timeout_s: float,
    ) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.handshake_timeout_s, self.transfer_timeout_s = handshake_timeout_s, transfer_timeout_s
        # The backend's own timeout is only a backstop behind the polled deadlines below.
        backstop = datetime.timedelta(seconds=handshake_timeout_s + transfer_timeout_s + 60)
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=backstop)
        store = dist.PrefixStore(STORE_PREFIX, self.store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = backstop
            self.group = dist.ProcessGroupNCCL(store, rank, world_size, options)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world_size, backstop)
        self.transfers = 0  # transfers begun on this side; the handshake checks both sides agree

    def broadcast(self, tensor: torch.Tensor, deadline: float, stalled: str) -> None:
        """Broadcast from rank 0 in place; raise WeightTransferStalled(`stalled`) past `deadline` (monotonic)."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        work = self.group.broadcast([tensor], options)
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise WeightTransferStalled(stalled)
            time.sleep(POLL_S)
        work.wait()

    def begin(self, side: str) -> float:
        """The handshake of the next transfer, through the store (no device kernel spins while a
        rollout worker finishes generating); returns the deadline of its buckets."""
        self.transfers += 1
        number, wait = self.transfers, datetime.timedelta(seconds=self.handshake_timeout_s)
        try:
            if self.rank == 0:
                self.store.set(f"begin/{number}", "1")
                self.store.wait([f"ready/{number}/{rank}" for rank in range(1, self.world_size)], wait)
            else:
                self.store.wait([f"begin/{number}"], wait)
                self.store.set(f"ready/{number}/{self.rank}", "1")
        except dist.DistStoreError:
            raise WeightTransferStalled(
                f"weight transfer #{number}: the {side} waited over {self.handshake_timeout_s:g} s "
                "(trainer.phase_timeout_s) for the other side to join; is a rollout worker stuck generating, "
                "or did the trainer stop?"
            ) from None
        return time.monotonic() + self.transfer_timeout_s

    def stalled(self, side: str, index: int, buckets: int, numel: int, dtype: torch.dtype) -> str:
        mb = numel * torch.empty((), dtype=dtype).element_size() / 2**20
        return (
            f"weight transfer #{self.transfers} stalled: the {side} waited over {self.transfer_timeout_s:g} s "
            f"(rollout.weight_sync_timeout_s) for bucket {index + 1}/{buckets} ({mb:.0f} MB). Check the "
            "network between the training and rollout devices (NCCL_DEBUG=INFO), raise "
            "rollout.weight_sync_timeout_s if it is only slow, or use rollout.weight_sync=object_store"
        )


class WeightSender:
    """Training rank 0's side: stage full tensors into flat buckets, broadcast them from a thread."""

    def __init__(self, group: TransferGroup, specs: list[TensorSpec], dtype: torch.dtype, bucket_bytes: int) -> None:
        self.group, self.specs, self.dtype = group, specs, dtype
        element = torch.empty((), dtype=dtype).element_size()
        self.plan = plan_buckets(specs, max(1, bucket_bytes // element))
        # Allocated once: the next transfer refills them only after the last one has left.
        self.buckets = [
            torch.empty(sum(s.numel for s in bucket), dtype=dtype, device=group.device) for bucket in self.plan
        ]
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Stage the tensors (in the specs' order) and start broadcasting them; returns the bytes staged."""
        self.wait()
        slots = [
            (bucket, spec, view)
            for bucket, plan in zip(self.buckets, self.plan)
            for spec, (_, view) in zip(plan, unpack(bucket, plan))
        ]
        staged = 0
        for (_, spec, view), (name, tensor) in zip(slots, named_tensors, strict=True):
            if name != spec.name or tuple(tensor.shape) != spec.shape:
                raise RuntimeError(
                    f"weight transfer: got {name} {tuple(tensor.shape)} where the plan has {spec.name} {spec.shape}"
                )
            view.copy_(tensor)
            staged += view.numel() * view.element_size()
        if self.group.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # the copies are done before another stream reads them
        self.thread = threading.Thread(target=self._broadcast, name="rlkit-weight-sender", daemon=True)
        self.thread.start()
        return staged

    def _broadcast(self) -> None:
        try:
            deadline = self.group.begin("trainer")
            for index, bucket in enumerate(self.buckets):
                self.group.broadcast(
                    bucket,
                    deadline,
                    self.group.stalled("trainer", index, len(self.buckets), bucket.numel(), self.dtype),
                )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the worker's own thread by wait()
            self.error = exc

    def wait(self) -> None:
        """Until the transfer in flight has left; raises what went wrong with it."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class WeightReceiver:
    """A rollout worker's side: receive the buckets one at a time and hand out their tensors."""

    def __init__(self, group: TransferGroup, specs: list[TensorSpec], dtype: torch.dtype, bucket_bytes: int) -> None:
        self.group, self.dtype = group, dtype
        element = torch.empty((), dtype=dtype).element_size()
        self.plan = plan_buckets(specs, max(1, bucket_bytes // element))

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every parameter, bucket by bucket, as they arrive."""
        deadline = self.group.begin("rollout worker")
        for index, plan in enumerate(self.plan):
            flat = torch.empty(sum(s.numel for s in plan), dtype=self.dtype, device=self.group.device)
            self.group.broadcast(
                flat,
                deadline,
                self.group.stalled(
                    f"rollout worker (rank {self.group.rank})", index, len(self.plan), flat.numel(), self.dtype
                ),
            )
            yield from unpack(flat, plan)
