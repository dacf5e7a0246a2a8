"""The shared optimize loop (rlkit.core.train.learner) on a one-weight model, numbers by hand."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlkit.core.batch import Batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.train.learner import optimize
from rlkit.core.train.model import TrainableModel


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_optimize_sums_micro_batches_clips_and_averages_metrics(world_of_one) -> None:
    weight = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        weight.weight.fill_(2.0)
    model = TrainableModel(weight, torch.optim.SGD(weight.parameters(), lr=1.0), scheduler=None)

    def micro_step(mb: Batch, norm: dict[str, float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x = mb["x"]  # loss = w * sum(x) / (the mini-batch's tokens): its gradient is mean(x) per mini-batch
        loss = weight.weight[0, 0] * x.sum() / norm["num_tokens"]
        return loss, {"loss": loss, "x": x.sum(), "tokens": torch.tensor(float(len(x)))}

    # One token per row and a budget of 2 tokens: the first mini-batch runs as two micro-batches.
    first = Batch({"x": torch.tensor([1.0, 2.0, 3.0]), "attention_mask": torch.ones(3, 1, dtype=torch.long)})
    second = Batch({"x": torch.tensor([4.0]), "attention_mask": torch.ones(1, 1, dtype=torch.long)})
    metrics = optimize(model, [first, second], [{"num_tokens": 3.0}, {"num_tokens": 1.0}], micro_step,
                       grad_clip=1.0, micro_batch_tokens=2, per_update=("loss",))
    # Step 1: gradient mean(1, 2, 3) = 2, clipped to 1: w = 2 - 1 = 1; loss 2 * 6 / 3 = 4.
    # Step 2: gradient 4, clipped to 1: w = 0; loss 1 * 4 / 1 = 4. (The clip scales by
    # max_norm / (norm + 1e-6), hence the tolerances.)
    assert weight.weight.item() == pytest.approx(0.0, abs=1e-5)
    assert metrics == pytest.approx({"grad_norm": 3.0, "loss": 4.0, "x": 10.0 / 4, "lr": 1.0}, abs=1e-5)


def _sharded_pair() -> tuple[torch.nn.Module, TrainableModel]:
    """Two bf16-computing linear layers under FSDP2 (fp32 master weights, fp32 gradient reduction), as the trainer
    shards a model, and an SGD over them."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in net:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=False)
    fully_shard(net, mp_policy=policy, reshard_after_forward=False)
    return net, TrainableModel(net, torch.optim.SGD(net.parameters(), lr=0.1), scheduler=None)


def test_one_rank_holds_cast_weights_and_fp32_gradients_between_micro_batches(world_of_one, monkeypatch) -> None:
    """On one rank FSDP2 reduces the gradients once, at the last micro-batch, and keeps the cast weights until then:
    the update's result is bit for bit the default's (a reduction and a sum into the shards every micro-batch)."""
    from rlkit.core.train import learner

    x = torch.linspace(-1, 1, 20).view(5, 4)
    batch = Batch({"x": x, "attention_mask": torch.ones(5, 1, dtype=torch.long)})

    def run(hold: bool) -> tuple[list[torch.Tensor], list[bool], list[bool]]:
        net, model = _sharded_pair()
        lasts: list[bool] = []
        reduced: list[bool] = []  # at each micro-step: whether the shards hold a gradient yet
        original = learner.hold_between_micro_batches

        def spy(module: torch.nn.Module, *, last: bool) -> None:
            lasts.append(last)
            if hold:
                original(module, last=last)

        monkeypatch.setattr(learner, "hold_between_micro_batches", spy)

        def micro_step(mb: Batch, norm: dict[str, float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            reduced.append(any(p.grad is not None for p in net.parameters()))
            loss = net(mb["x"]).float().square().sum() / norm["num_tokens"]
            return loss, {"loss": loss, "tokens": torch.tensor(float(len(mb["x"])))}

        optimize(model, [batch], [{"num_tokens": 5.0}], micro_step, grad_clip=100.0, micro_batch_tokens=2)
        return [p.detach().full_tensor().clone() for p in net.parameters()], lasts, reduced

    held, lasts, reduced_held = run(hold=True)
    default, _, reduced_default = run(hold=False)
    assert lasts == [False, False, True]  # 5 one-token rows, 2 tokens a micro-batch
    # held: nothing reaches the shards before the last backward; by default every backward reduces into them
    assert reduced_held == [False, False, False] and reduced_default == [False, True, True]
    for a, b in zip(held, default):
        assert torch.equal(a, b)
    assert not torch.equal(held[0], _sharded_pair()[0][0].weight.detach().full_tensor())  # the step moved them
