"""The critic worker: one per device, a Ray actor holding its FSDP2 shard of a value model.

The value model is the policy's base model with a one-output head on every token
(AutoModelForTokenClassification, num_labels=1). Its actors are processes of their own, so
they form their own torch.distributed group (own master port), colocated with the policy
workers rank by rank (WorkerGroup colocate_with).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlkit.core.algos.losses import aggregate_loss, value_loss
from rlkit.core.batch import Batch
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.worker_group import WorkerGroup
from rlkit.core.state import shards as checkpoint_shards
from rlkit.core.train import fast_paths, fsdp, packing
from rlkit.recipes.schema import RLConfig

# What compute_values and update_critic read from a batch.
VALUE_INPUT_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


class CriticWorker(DeviceWorker):
    """Rank `rank` of the critic group. Method names are the controller's phases."""

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        self.join_process_group(master_addr, master_port)
        cfg = self.config
        self.phase = "setup/load-models"
        # The same seed on every rank: each rank shards the freshly initialised value head it
        # builds itself, so all ranks must build the same one.
        torch.manual_seed(cfg.trainer.seed)
        self.critic = fsdp.load_sharded_model(self.model_path, device=self.device, compute_dtype=fsdp.compute_dtype(cfg.model.dtype, self.device),
                                              value_head=True, gradient_checkpointing=cfg.model.gradient_checkpointing)
        self.optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic.lr)
        # The policy workers sized an auto budget for this device, the critic included (the controller
        # passes it on in the config); on CPU auto is the CPU default.
        self.micro_batch_tokens = fast_paths.resolve(cfg, self.device.type).micro_batch_tokens
        return {"rank": self.rank, "shards": fsdp.shard_numels(self.critic)}

    def _values(self, mb: Batch) -> tuple[torch.Tensor, Batch]:
        """V(s_t) for each response position t (the state before token t): [b, R], 0 on padding.

        Returns the micro-batch moved to the device too; its sequences run packed (rlkit.core.train.packing).
        """
        packed = packing.pack(mb).to(self.device)
        return packed.scatter(fsdp.packed_outputs(self.critic, packed).squeeze(-1).float()), mb.to(self.device)

    def _micro_batches(self, batch: Batch) -> list[list[int]]:
        return packing.plan_micro_batches(batch["attention_mask"].sum(-1).tolist(), self.micro_batch_tokens)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """[B, R] values of the batch's response positions, 0 on padding."""
        self.phase = "compute_values"
        self.critic.eval()
        values = torch.zeros(batch["responses"].shape)
        for rows in self._micro_batches(batch):
            values[rows] = self._values(batch.select(rows))[0].cpu()
        return values * batch["response_mask"]

    def update_critic(self, minibatches: list[Batch], norms: list[dict[str, float]]) -> dict[str, float]:
        """One optimizer step per mini-batch on the clipped value loss (token-mean over the mini-batch).

        Batches carry `values` (the critic's values at rollout time, the clip's anchor) and
        `returns` (the targets). Metrics are global: summed over micro-batches, all-reduced over ranks.
        """
        self.phase = "update_critic"
        cfg = self.config.critic
        self.critic.train()
        sums = torch.zeros(4, dtype=torch.float64)  # vf_loss, clipped tokens, tokens, grad_norm
        for minibatch, norm in zip(minibatches, norms):
            self.optimizer.zero_grad(set_to_none=True)
            for rows in self._micro_batches(minibatch):
                values, trimmed = self._values(minibatch.select(rows))
                mask = trimmed["response_mask"].float()
                per_token, metrics = value_loss(values, trimmed["values"], trimmed["returns"], mask,
                                                cliprange_value=cfg.cliprange_value)
                loss = aggregate_loss(per_token, mask, "token-mean", global_num_tokens=norm["num_tokens"])
                # FSDP2 averages gradients over ranks; the normaliser is already global, so undo it.
                (loss * self.world_size).backward()
                loss, tokens = loss.detach(), float(mask.sum())
                sums += torch.tensor([loss.item(), metrics["vf_clipfrac"].item() * tokens, tokens, 0.0],
                                     dtype=torch.float64)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.grad_clip)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            sums[3] += float(grad_norm) / self.world_size
            self.optimizer.step()
        sums = sums.to(packing.collective_device())
        dist.all_reduce(sums)
        vf_loss, clipped, tokens, grad_norm = sums.tolist()
        steps = len(minibatches)
        return {"critic/vf_loss": vf_loss / steps, "critic/vf_clipfrac": clipped / max(tokens, 1.0),
                "critic/grad_norm": grad_norm / steps, "critic/lr": cfg.lr}

    # -- checkpoints (collective: every rank calls with the same folder) -----------------
    def save_checkpoint(self, folder: str) -> None:
        checkpoint_shards.save_shards(folder, self.rank, model=self.critic, optimizer=self.optimizer)

    def load_checkpoint(self, folder: str) -> None:
        checkpoint_shards.load_shards(folder, self.rank, model=self.critic, optimizer=self.optimizer)


def start_critic_group(config: RLConfig, model_path: str, policy: WorkerGroup) -> WorkerGroup | None:
    """The critic workers beside `policy`, set up and ready; None when the run has no critic."""
    if not config.critic_enabled:
        return None
    group = WorkerGroup(CriticWorker, config, model_path, name="critic", colocate_with=policy)
    master = group.call("address", phase="critic address")[0]
    group.call("setup", *master, phase="critic setup (model load)", startup=True)
    return group
