"""The actor role: the policy's FSDP2 shard with its optimizer and schedule, and what reads or writes them.

Its log-probs (the old-log-prob pass), the RL update (`update_actor`, one optimizer step per
mini-batch through rlkit.core.train.learner), the offline objectives' updates
(rlkit.core.train.offline_worker) and the sharded checkpoint. The checkpoint belongs here: what
it saves is exactly this role's state (the weights, the optimizer, the schedule, and the
process's RNG), so a role of its own would hold the same three references and nothing else.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.kl import kl_estimate
from rlkit.core.algos.losses import aggregate_loss
from rlkit.core.algos.rollout_correction import correction_metrics, correction_weights
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch
from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.cluster.roles import Role
from rlkit.core.state import shards as checkpoint_shards
from rlkit.core.train import fsdp, packing
from rlkit.core.train.fast_paths import FastPaths
from rlkit.core.train.learner import micro_batches, optimize
from rlkit.core.train.logprobs import selected_log_probs, sum_squared_probs
from rlkit.core.train.model import TrainableModel
from rlkit.core.train.offline_worker import OfflineUpdates
from rlkit.recipes.actor_schema import ActorConfig
from rlkit.recipes.trainer_schema import DPOConfig

# The key of Actor.update_actor's result that holds its per-token log-probs (UpdateInputs.keep_log_probs).
KEPT_LOG_PROBS = "trainer_log_probs"
# The engine-vs-trainer log-prob gap (rlkit.core.rollout.sync_check), and the tokens it was measured on: on a check
# step only a share of the rows has the engine's log-probs (rollout_log_prob_rows).
GAP, CHECKED_TOKENS = "rollout/log_prob_diff", "rollout/log_prob_checked_tokens"


def response_log_probs(
    module: torch.nn.Module,
    batch: Batch,
    *,
    device: torch.device,
    micro_batch_tokens: int,
    temperature: float,
    with_entropy: bool,
    fused_head: bool,
    with_sum_pi_squared: bool = False,
) -> dict[str, torch.Tensor]:
    """Per-token log-probs (and entropy, or zeros) of the batch's responses under `module`, packed
    micro-batch by micro-batch; 0 on padding. `fused_head`: actor.fused_lm_head (fsdp.packed_log_probs).
    `with_sum_pi_squared`: also "sum_pi_squared", each token's sum over the vocabulary of its squared
    probabilities, which reads the full logits (that pass is never fused)."""
    names = ("log_probs", "entropy", "sum_pi_squared") if with_sum_pi_squared else ("log_probs", "entropy")
    # Each micro-batch's results stay on the device until the last is queued (reading one back would wait for
    # the device, which would then idle while the host packs the next).
    done: list[tuple[list[int], tuple[torch.Tensor, ...]]] = []
    for rows in micro_batches(batch, micro_batch_tokens):
        packed = packing.pack(batch.select(rows)).to(device)
        if with_sum_pi_squared:
            logits = fsdp.packed_outputs(module, packed)
            squared = sum_squared_probs(logits, temperature)
            lp, ent = selected_log_probs(logits, packed.targets, temperature, with_entropy=with_entropy)
            done.append((rows, (packed.scatter(lp), packed.scatter(ent), packed.scatter(squared))))
        else:
            lp, ent = fsdp.packed_log_probs(
                module, packed, temperature=temperature, with_entropy=with_entropy, fused_head=fused_head
            )
            done.append((rows, (packed.scatter(lp), packed.scatter(ent))))
    out = {name: torch.zeros(batch["responses"].shape) for name in names}
    for rows, values in done:
        for name, value in zip(names, values):
            out[name][rows] = value.cpu()
    mask = batch["response_mask"]
    return {name: value * mask for name, value in out.items()}


class Actor(Role, OfflineUpdates):
    """Rank `rank`'s shard of the actor (`model`), on `device`, passes packed to `fast_paths`' budget.

    Built from the sections it reads: `actor` (the update's options), `algorithm` (what the RL update
    computes: the policy loss with its options, resolved once, and its terms), `objective` (rl, or the
    offline objective whose micro-step `update_offline` runs, with `dpo`'s options), `temperature` (of
    the log-prob passes and the RL update: rollout.temperature in RL, 1 offline), `micro_batch_group`
    (rows that share a micro-batch) and `max_response_length` (the seq-mean-token-sum-norm divisor).
    """

    def __init__(
        self,
        phases: PhaseReporter,
        model: TrainableModel,
        rank: int,
        device: torch.device,
        fast_paths: FastPaths,
        *,
        actor: ActorConfig,
        algorithm: Algorithm,
        objective: Literal["rl", "sft", "dpo"],
        temperature: float,
        micro_batch_group: int,
        max_response_length: int,
        dpo: DPOConfig,
    ) -> None:
        super().__init__(phases)
        self.model, self.rank, self.device, self.fast_paths = model, rank, device, fast_paths
        self.actor, self.algorithm, self.objective, self.dpo = actor, algorithm, objective, dpo
        self.temperature, self.micro_batch_group = temperature, micro_batch_group
        self.max_response_length = max_response_length

    @torch.no_grad()
    @in_phase("log_probs/actor")
    def actor_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Per-token log-probs and entropy of the batch's responses under the actor, and each token's sum of
        squared probabilities when the algorithm's estimator reads it (Algorithm.token_stats)."""
        self.model.module.eval()  # the update switches it back to train()
        return response_log_probs(
            self.model.module,
            batch,
            device=self.device,
            micro_batch_tokens=self.fast_paths.micro_batch_tokens,
            temperature=self.temperature,
            with_entropy=True,
            fused_head=self.actor.fused_lm_head,
            with_sum_pi_squared=self.algorithm.token_stats,
        )

    @in_phase("update_actor")
    def update_actor(
        self, minibatches: list[Batch], norms: list[dict[str, float]], inputs: UpdateInputs
    ) -> dict[str, float | torch.Tensor]:
        """One optimizer step per mini-batch; `norms` are the whole mini-batch's token/sequence counts;
        `inputs` what the loss reads (rlkit.core.algos.update_inputs). With `inputs.keep_log_probs`, also this
        rank's rows' per-token log-probs before the step, under KEPT_LOG_PROBS.

        Metrics are global (rlkit.core.train.learner): every worker returns the same numbers.
        """
        cfg = self.actor
        kept = None  # (rows, their log-probs on the device) per micro-batch, read back after the update
        if inputs.keep_log_probs:  # one mini-batch, one epoch (old log-probs from the update): rows in shard order
            minibatches[0]["update_row"] = torch.arange(len(minibatches[0]))
            kept = []
        micro_step = functools.partial(self._micro_step, inputs=inputs, kept=kept)
        totals = optimize(
            self.model,
            minibatches,
            norms,
            micro_step,
            grad_clip=cfg.grad_clip,
            micro_batch_tokens=self.fast_paths.micro_batch_tokens,
            per_update=("pg_loss", "kl_loss"),
        )
        totals = correction_metrics(totals)
        if CHECKED_TOKENS in totals:  # both per loss token so far: the gap is per checked token (none: no gap)
            checked = totals.pop(CHECKED_TOKENS)
            gap = totals.pop(GAP)
            if checked > 0:
                totals[GAP] = gap / checked
        if inputs.rollout_is_weight_mean is not None:
            totals["rollout_corr/rollout_is_batch_norm_factor"] = inputs.rollout_is_weight_mean
        metrics: dict[str, float | torch.Tensor] = {k if "/" in k else f"actor/{k}": v for k, v in totals.items()}
        if kept is not None:  # not a metric: the controller takes it out (Controller.update_actor)
            log_probs = torch.zeros(minibatches[0]["responses"].shape)
            for rows, values in kept:
                log_probs[rows] = values.cpu()
            metrics[KEPT_LOG_PROBS] = log_probs
        return metrics

    def _micro_step(
        self,
        mb: Batch,
        norm: dict[str, float],
        *,
        inputs: UpdateInputs,
        kept: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one micro-batch, and metric sums to aggregate across micro-batches and ranks, left on the
        device (rlkit.core.train.learner reads them back once, after the update)."""
        algorithm = self.algorithm
        rows = mb["update_row"] if kept is not None else None  # on the host: where `kept` puts them
        packed = packing.pack(mb).to(self.device)
        mb = mb.to(self.device)
        old_from_here = inputs.old_log_probs_from_update
        flat_log_probs, flat_entropy = fsdp.packed_log_probs(
            self.model.module,
            packed,
            temperature=self.temperature,
            with_entropy="entropy" in algorithm.loss_terms or old_from_here,
            fused_head=self.actor.fused_lm_head,
            entropy_grad="entropy" in algorithm.loss_terms,
        )
        log_probs = packed.scatter(flat_log_probs)
        old_log_probs = log_probs.detach() if old_from_here else mb["old_log_probs"]
        mask = mb["response_mask"].float()
        if kept is not None:
            kept.append((rows, (old_log_probs * mask).float().detach()))
        per_token, pg_metrics = algorithm.policy_loss(log_probs, old_log_probs, mb["advantages"], mask)
        correction_sums: dict[str, torch.Tensor] = {}
        if inputs.corrects_rollout:  # importance weights and rejection (rlkit.core.algos.rollout_correction)
            # Bypass: pi_old is the engine's, so the trainer's side of the comparison is the policy being updated.
            trainer_side = log_probs.detach() if inputs.old_log_probs_from_rollout else old_log_probs
            weights, correction_sums = correction_weights(
                trainer_side,
                mb["rollout_log_probs"],
                mask,
                inputs.rollout_correction,
                inputs.rollout_correction_options,
                weight_mean=inputs.rollout_is_weight_mean,
            )
            per_token = per_token * weights
            pg_metrics["rollout_is_weight"] = (weights * mask).sum() / mask.sum().clamp(min=1)
        agg = dict(
            global_num_tokens=norm["num_tokens"],
            global_num_seqs=norm["num_seqs"],
            norm_length=self.max_response_length,
        )
        loss = aggregate_loss(per_token, mask, algorithm.loss_agg_mode, **agg)
        tokens = mask.sum().detach()
        sums = {"pg_loss": loss.detach(), "tokens": tokens}
        sums.update({k: torch.as_tensor(v).detach() * tokens for k, v in pg_metrics.items()})
        sums.update(correction_sums)
        entropy = packed.scatter(flat_entropy)
        if old_from_here:  # what the old-log-prob pass would have reported, token sums
            sums["entropy"] = (entropy.detach() * mask).sum()
            if inputs.rollout_log_probs:  # the engine returned them this step (rollout.log_prob_check_freq)
                checked = mask * mb["rollout_log_prob_rows"].unsqueeze(-1)  # a check step's share of the rows
                sums[GAP] = ((mb["rollout_log_probs"] - old_log_probs).abs() * checked).sum()
                sums[CHECKED_TOKENS] = checked.sum()
            if inputs.reference:
                sums["kl_ref"] = (kl_estimate(old_log_probs, mb["ref_log_probs"], "k1") * mask).sum()
        if "entropy" in algorithm.loss_terms:
            loss = loss - algorithm.entropy_coeff * aggregate_loss(entropy, mask, algorithm.loss_agg_mode, **agg)
        if inputs.reference:
            kl = kl_estimate(log_probs, mb["ref_log_probs"], algorithm.kl_loss_type)
            kl_loss = aggregate_loss(kl, mask, algorithm.loss_agg_mode, **agg)
            loss = loss + algorithm.kl_loss_coef * kl_loss
            sums["kl_loss"] = kl_loss.detach()
        return loss, sums

    # -- checkpoint (collective: every rank calls with the same folder) ------------------
    @in_phase("save_checkpoint")
    def save_checkpoint(self, folder: str) -> None:
        """The actor, its optimizer, LR schedule and RNG (the reference is the base model: nothing to save)."""
        checkpoint_shards.save_shards(
            folder, self.rank, model=self.model.module, optimizer=self.model.optimizer, scheduler=self.model.scheduler
        )

    @in_phase("load_checkpoint")
    def load_checkpoint(self, folder: str) -> None:
        """The actor, its optimizer, LR schedule and RNG; the reference stays the base model."""
        checkpoint_shards.load_shards(
            folder, self.rank, model=self.model.module, optimizer=self.model.optimizer, scheduler=self.model.scheduler
        )

    # -- test and debugging hooks -------------------------------------------------------
    @torch.no_grad()
    def policy_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The actor's full logits for `input_ids` (for checking exported weights)."""
        self.model.module.eval()
        return self.model.module(input_ids=input_ids.to(self.device), use_cache=False).logits.float().cpu()
