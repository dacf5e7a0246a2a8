"""The weight transfer's own process group over gloo: buckets, exact tensors, and deadlines that name the stall.

Training rank 0 and one rollout worker are two threads of this process here; in a run they
are two Ray actors (tests/test_async_e2e.py).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlkit.core.cluster.device_worker import free_port
from rlkit.core.cluster.weight_transfer import (
    TensorSpec,
    TransferGroup,
    WeightReceiver,
    WeightSender,
    WeightTransferStalled,
    plan_buckets,
)

SPECS = [TensorSpec("a", (2, 3)), TensorSpec("b", (4,)), TensorSpec("c", (10,)), TensorSpec("d", (1,))]


def test_buckets_take_consecutive_tensors_up_to_the_size_and_a_large_tensor_alone():
    # 10 elements a bucket: a (6) + b (4) fill the first; c (10) fills its own; d (1) starts a third.
    assert [[s.name for s in b] for b in plan_buckets(SPECS, 10)] == [["a", "b"], ["c"], ["d"]]
    assert [[s.name for s in b] for b in plan_buckets(SPECS, 8)] == [["a"], ["b"], ["c"], ["d"]]
    assert [[s.name for s in b] for b in plan_buckets(SPECS, 100)] == [["a", "b", "c", "d"]]


def groups(handshake_s: float = 5.0, transfer_s: float = 5.0) -> tuple[TransferGroup, TransferGroup]:
    """Rank 0 and rank 1 of a two-rank gloo group (built at once: each constructor waits for the other)."""
    port, made = free_port(), {}

    def make(rank: int) -> None:
        made[rank] = TransferGroup("127.0.0.1", port, rank, 2, torch.device("cpu"),
                                   handshake_timeout_s=handshake_s, transfer_timeout_s=transfer_s)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made[0], made[1]


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(s.name, torch.randn(s.shape, generator=gen, dtype=torch.float32)) for s in SPECS]


def test_every_tensor_arrives_exactly_in_the_rollout_dtype_transfer_after_transfer():
    trainer, rollout = groups()
    sender = WeightSender(trainer, SPECS, torch.bfloat16, bucket_bytes=20)  # 10 bf16 elements a bucket
    receiver = WeightReceiver(rollout, SPECS, torch.bfloat16, bucket_bytes=20)
    assert len(sender.buckets) == 3
    for seed in (1, 2):  # the staging buckets are reused by the second transfer
        sent = weights(seed)
        assert sender.send(iter(sent)) == 21 * 2  # 21 elements of 2 bytes staged
        got = {name: tensor.clone() for name, tensor in receiver.receive()}
        sender.wait()
        assert list(got) == ["a", "b", "c", "d"]
        for name, tensor in sent:
            assert got[name].dtype == torch.bfloat16
            assert torch.equal(got[name], tensor.to(torch.bfloat16))
    assert trainer.transfers == rollout.transfers == 2


def test_a_tensor_out_of_the_plan_is_refused():
    trainer, _ = groups()
    sender = WeightSender(trainer, SPECS, torch.float32, bucket_bytes=40)
    with pytest.raises(RuntimeError, match=r"got b \(5,\) where the plan has b \(4,\)"):
        sender.send(iter([("a", torch.zeros(2, 3)), ("b", torch.zeros(5))]))


def test_a_receiver_that_never_comes_stops_the_sender_with_a_named_message():
    trainer, _ = groups(handshake_s=0.3)
    sender = WeightSender(trainer, SPECS, torch.float32, bucket_bytes=40)
    start = time.monotonic()
    sender.send(iter(weights(0)))  # returns at once: the broadcast runs in the background
    assert time.monotonic() - start < 0.3
    with pytest.raises(WeightTransferStalled, match=r"weight transfer #1: the trainer waited over 0.3 s "
                                                    r"\(trainer.phase_timeout_s\) for the other side to join"):
        sender.wait()


def test_buckets_that_stop_coming_stop_the_receiver_with_a_named_message():
    trainer, rollout = groups(transfer_s=0.3)
    receiver = WeightReceiver(rollout, SPECS, torch.float32, bucket_bytes=40)
    handshake = threading.Thread(target=trainer.begin, args=("trainer",))  # joins, then sends nothing
    handshake.start()
    start = time.monotonic()
    with pytest.raises(WeightTransferStalled, match=r"weight transfer #1 stalled: the rollout worker \(rank 1\) "
                                                    r"waited over 0.3 s \(rollout.weight_sync_timeout_s\) for "
                                                    r"bucket 1/3 \(0 MB\)"):
        list(receiver.receive())
    assert 0.3 <= time.monotonic() - start < 3
    handshake.join()
