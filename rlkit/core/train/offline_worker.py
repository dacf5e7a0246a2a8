"""The actor's updates on rows of a data set (objectives sft, dpo): no rollout, no engine.

`update_offline` is the RL update's twin: the same mini-batches with the whole mini-batch's
counts (`norms`), the same optimize loop (micro-batches packed to actor.micro_batch_tokens,
clip, AdamW, schedule). Only the micro-step differs, and the objective picks it from
`OFFLINE_STEPS`. A micro-step returns (loss, metric sums): `loss` is the micro-batch's share of
the mini-batch's loss; the step's `means` keys are shares of mini-batch means too, every other
key is a token sum that the loop divides by `tokens`. `evaluate_offline` runs the same
micro-step without gradients over a held-out batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlkit.core.algos.preference import PREFERENCE_METRICS
from rlkit.core.algos.sft import sft_loss
from rlkit.core.batch import Batch
from rlkit.core.cluster.phases import in_phase
from rlkit.core.train import fsdp, packing
from rlkit.core.train.learner import all_reduce_sums, micro_batches, optimize
from rlkit.core.train.logprobs import selected_log_probs
from rlkit.core.train.preference_step import preference_micro_step
from rlkit.recipes.actor_schema import ActorConfig
from rlkit.recipes.trainer_schema import DPOConfig


@dataclass(frozen=True)
class OfflineStep:
    method: str  # the worker method that computes one micro-batch's loss and metric sums
    means: tuple[str, ...]  # metric keys that are shares of a mini-batch mean (the rest: token sums)


# objective -> its micro-step (the rows that must share a micro-batch, a dpo pair: the actor's micro_batch_group).
OFFLINE_STEPS = {
    "sft": OfflineStep("_sft_micro_step", ("loss",)),
    "dpo": OfflineStep("_dpo_micro_step", PREFERENCE_METRICS),
}


class OfflineUpdates:
    """Mixed into the actor role (rlkit.core.train.actor), which holds its sections (`actor`, `dpo`), the run's
    `objective`, `micro_batch_group` and `max_response_length`, `model`, `device`, `fast_paths` and reports its
    phases (`reporting`)."""

    actor: ActorConfig
    dpo: DPOConfig
    objective: str
    micro_batch_group: int
    max_response_length: int
    model: Any
    device: torch.device
    fast_paths: Any

    @in_phase("update_offline")
    def update_offline(self, minibatches: list[Batch], norms: list[dict[str, float]]) -> dict[str, float]:
        """One optimizer step per mini-batch; global metrics, the same on every rank."""
        step = OFFLINE_STEPS[self.objective]
        totals = optimize(
            self.model,
            minibatches,
            norms,
            getattr(self, step.method),
            grad_clip=self.actor.grad_clip,
            micro_batch_tokens=self.fast_paths.micro_batch_tokens,
            per_update=step.means,
            group=self.micro_batch_group,
        )
        return {k if "/" in k else f"actor/{k}": v for k, v in totals.items()}

    @torch.no_grad()
    @in_phase("evaluate_offline")
    def evaluate_offline(self, batch: Batch, norm: dict[str, float]) -> dict[str, float]:
        """The loss (and the step's other `means`) of this rank's share of a held-out set whose counts
        are `norm`, summed over ranks; other metric sums divided by its tokens (keys as the micro-step
        names them)."""
        self.model.module.eval()  # no dropout; the next update switches back to train()
        step = OFFLINE_STEPS[self.objective]
        micro_step = getattr(self, step.method)
        sums: dict[str, torch.Tensor] = {}
        for rows in micro_batches(batch, self.fast_paths.micro_batch_tokens, self.micro_batch_group):
            _, metrics = micro_step(batch.select(rows), norm)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value.detach().double().cpu()
        totals = all_reduce_sums(sums)
        tokens = max(totals.pop("tokens"), 1.0)
        return {k: v if k in step.means else v / tokens for k, v in totals.items()}

    def _sft_micro_step(self, mb: Batch, norm: dict[str, float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Negative log-likelihood of the micro-batch's trained tokens, normalised by the mini-batch's counts."""
        packed = packing.pack(mb).to(self.device)  # only positions that predict a trained token get logits
        logits = fsdp.packed_outputs(self.model.module, packed)
        flat_log_probs, _ = selected_log_probs(logits, packed.targets)  # temperature 1: the data's likelihood
        log_probs = packed.scatter(flat_log_probs)
        correct = packed.scatter((logits.argmax(-1) == packed.targets).float())
        mask = mb["response_mask"].to(self.device).float()
        loss = sft_loss(
            log_probs,
            mask,
            self.actor.loss_agg_mode,
            global_num_tokens=norm["num_tokens"],
            global_num_seqs=norm["num_seqs"],
            norm_length=self.max_response_length,
        )
        return loss, {
            "loss": loss.detach().cpu(),
            "token_accuracy": (correct * mask).sum().cpu(),
            "tokens": mask.sum().cpu(),
        }

    def _dpo_micro_step(self, mb: Batch, norm: dict[str, float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The preference loss of the micro-batch's pairs against the reference log-probs it carries."""
        dpo = self.dpo
        return preference_micro_step(
            self.model.module,
            mb,
            norm,
            device=self.device,
            loss_type=dpo.loss_type,
            beta=dpo.beta,
            label_smoothing=dpo.label_smoothing,
            fused_head=self.actor.fused_lm_head,
        )
