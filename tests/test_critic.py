"""The critic worker learns: on one fixed batch its clipped value loss goes down, step after step.

The worker runs in this process (a one-rank gloo group), without Ray, on the tiny Qwen2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from rlkit.core.batch import Batch, build_batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import RolloutSample
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.train.critic_worker import CriticWorker
from rlkit.recipes.loader import load_config


@pytest.fixture
def critic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CriticWorker]:
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    config = load_config("ppo", ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "critic.lr=1e-3",
                                 "trainer.device=cpu"])
    worker = CriticWorker(config, resolve_model_path(config.model.path), rank=0, world_size=1)
    worker.setup("127.0.0.1", free_port())
    yield worker
    dist.destroy_process_group()


def fixed_batch() -> Batch:
    """Four sequences, prompts of 2-3 tokens, responses of 1-3 tokens (so both sides are padded)."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13, 14]]
    responses = [[20], [21, 22, 2], [23, 24], [25, 26, 27]]
    samples = [Trajectory.single_turn(PromptRow(i, p, "synthetic/echo", "0"), i, RolloutSample(0, r, [0.0] * len(r), True))
               for i, (p, r) in enumerate(zip(prompts, responses))]
    batch = build_batch(samples, pad_id=0)
    # Returns a value model can fit: each sequence's score on every response token.
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    batch["returns"] = scores[:, None] * batch["response_mask"]
    return batch


def test_critic_loss_goes_down_on_a_fixed_batch(critic: CriticWorker) -> None:
    batch = fixed_batch()
    mask = batch["response_mask"]
    norms = [{"num_tokens": float(mask.sum()), "num_seqs": float(len(batch))}]
    losses = []
    for _ in range(15):  # one PPO step each: values at "rollout", then one update anchored at them
        batch["values"] = critic.compute_values(batch)
        assert torch.equal(batch["values"] * (1 - mask), torch.zeros_like(mask))  # 0 on padding
        metrics = critic.update_critic([batch], norms)
        losses.append(metrics["critic/vf_loss"])
        assert 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0 and metrics["critic/grad_norm"] > 0
    # The first loss is 0.5 * mean((V - R)^2) at the fresh head; it must fall by far and stay down
    # (Adam at this learning rate wobbles from step to step, so no step-by-step monotonicity).
    assert max(losses[-3:]) < 0.2 * losses[0], losses
    final = critic.compute_values(batch)
    assert torch.allclose(final * mask, batch["returns"], atol=0.2)
