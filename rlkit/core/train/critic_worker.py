"""The critic worker: one per device, a worker (a Ray actor, or an object in the controller's process) holding
its FSDP2 shard of a value model.

The value model is the policy's base model with a one-output head on every token
(AutoModelForTokenClassification, num_labels=1). Its Ray actors are processes of their own, so
they form their own torch.distributed group (own master port), colocated with the policy
workers rank by rank (Backend.group colocate_with); in-process, it shares the process's world of one.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.losses import aggregate_loss, value_loss
from rlkit.core.batch import Batch
from rlkit.core.cluster.backend import Backend, Group
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.phases import in_phase
from rlkit.core.state import shards as checkpoint_shards
from rlkit.core.train import fast_paths, fsdp, packing
from rlkit.core.train.learner import micro_batches, optimize
from rlkit.core.train.model import build_critic
from rlkit.recipes.schema import RLConfig

# What compute_values and update_critic read from a batch.
VALUE_INPUT_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


class CriticWorker(DeviceWorker):
    """Rank `rank` of the critic group. Method names are the controller's phases."""

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        self.join_process_group(master_addr, master_port)
        cfg = self.config
        with self.reporting("setup/load-models"):
            self.model = build_critic(cfg.model, cfg.critic, self.model_path, self.device, seed=cfg.trainer.seed)
        # The policy workers sized an auto budget for this device, the critic included (the controller
        # passes it on in the config); on CPU auto is the CPU default.
        paths = fast_paths.resolve(cfg.model, cfg.rollout, cfg.actor, self.device.type)
        self.micro_batch_tokens = paths.micro_batch_tokens
        self.freeze_heap()
        return {"rank": self.rank, "shards": fsdp.shard_numels(self.model.module)}

    def _values(self, mb: Batch) -> tuple[torch.Tensor, Batch]:
        """V(s_t) for each response position t (the state before token t): [b, R], 0 on padding.

        Returns the micro-batch moved to the device too; its sequences run packed (rlkit.core.train.packing).
        """
        packed = packing.pack(mb).to(self.device)
        return packed.scatter(fsdp.packed_outputs(self.model.module, packed).squeeze(-1).float()), mb.to(self.device)

    @torch.no_grad()
    @in_phase("compute_values")
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """[B, R] values of the batch's response positions, 0 on padding."""
        self.model.module.eval()
        values = torch.zeros(batch["responses"].shape)
        for rows in micro_batches(batch, self.micro_batch_tokens):
            values[rows] = self._values(batch.select(rows))[0].cpu()
        return values * batch["response_mask"]

    @in_phase("update_critic")
    def update_critic(self, minibatches: list[Batch], norms: list[dict[str, float]]) -> dict[str, float]:
        """One optimizer step per mini-batch on the clipped value loss (token-mean over the mini-batch).

        Batches carry `values` (the critic's values at rollout time, the clip's anchor) and
        `returns` (the targets). Metrics are global: summed over micro-batches, all-reduced over ranks.
        """
        totals = optimize(
            self.model,
            minibatches,
            norms,
            self._micro_step,
            grad_clip=self.config.critic.grad_clip,
            micro_batch_tokens=self.micro_batch_tokens,
            per_update=("vf_loss",),
        )
        return {f"critic/{k}": v for k, v in totals.items()}

    def _micro_step(self, mb: Batch, norm: dict[str, float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        values, mb = self._values(mb)
        mask = mb["response_mask"].float()
        per_token, metrics = value_loss(
            values, mb["values"], mb["returns"], mask, cliprange_value=self.config.critic.cliprange_value
        )
        loss = aggregate_loss(per_token, mask, "token-mean", global_num_tokens=norm["num_tokens"])
        tokens = mask.sum()
        return loss, {"vf_loss": loss, "vf_clipfrac": metrics["vf_clipfrac"] * tokens, "tokens": tokens}

    # -- checkpoints (collective: every rank calls with the same folder) -----------------
    def save_checkpoint(self, folder: str) -> None:
        checkpoint_shards.save_shards(folder, self.rank, model=self.model.module, optimizer=self.model.optimizer)

    def load_checkpoint(self, folder: str) -> None:
        checkpoint_shards.load_shards(folder, self.rank, model=self.model.module, optimizer=self.model.optimizer)


def start_critic_group(config: RLConfig, model_path: str, policy: Group, backend: Backend) -> Group | None:
    """The critic workers beside `policy`, set up and ready; None when the run has no critic."""
    if not Algorithm.from_config(config).critic:
        return None
    group = backend.group(CriticWorker, model_path, name="critic", colocate_with=policy)
    master = group.call(CriticWorker.address, phase="critic address")[0]
    group.call(CriticWorker.setup, *master, phase="critic setup (model load)", startup=True)
    return group
