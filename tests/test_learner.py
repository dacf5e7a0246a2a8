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
