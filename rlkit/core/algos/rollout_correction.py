"""Rollout correction: what the update does about samples the engine drew from another policy than pi_old.

The engine's pi_rollout differs from the policy the update starts from (pi_old): its numerics (bf16 kernels,
another attention), or an older version in asynchronous rollout. With r_t = pi_old(y_t) / pi_rollout(y_t):

- importance weights (`rollout_is`, `rollout_is_threshold`): each token's policy loss times min(r_t, C)
  (token level, TIS: Yao et al. 2025) or min(prod_t r_t, C) (sequence level) (rlkit.core.algos.losses.
  rollout_importance_weights);
- IcePop (`rollout_is_threshold_lower` = L; Ling Team 2025, Ring-1T, arXiv 2510.18855): the weight r (or
  the sequence's product) where L <= r <= C, else 0: the token (sequence) leaves the policy loss;
- batch normalisation (`rollout_is_batch_normalize`): weights divided by their mean over the step's batch;
- rejection sampling (`rollout_rs`, `rollout_rs_threshold`, `rollout_rs_threshold_lower`): tokens or
  sequences whose divergence is beyond the threshold get weight 0 (verl's options, `RejectionOption`; Li et al.
  2025, Trust Region Masking, arXiv 2512.23075); with several options (`RejectionRule`s) a token is kept only
  where every one keeps it, as verl's comma-separated list.

Bypass (actor.old_log_probs=rollout; verl's `bypass_mode`): the engine's log-probs are the old ones and no
old-log-prob pass runs, so pi_old = pi_rollout and the loss's ratio is pi_theta / pi_rollout. The correction then
compares the policy being updated (its log-probs, detached) with the engine's, as verl's bypass loss does:
rejection masks the tokens where pi_theta has moved beyond the bound from pi_rollout, and importance weights (only
with a loss that has no ratio, gpg: verl's `loss_type=reinforce`) are min(pi_theta / pi_rollout, C). The caller
passes that policy as `old_log_probs` (rlkit.core.train.actor); the functions here are the same in both modes.

verl (verl/trainer/ppo/rollout_corr_helper.py, read at 1dda039b) removes rejected tokens from the response
mask, and so from the loss's token count and the entropy and KL terms too; here they keep their place in the
count (the update cannot know the whole mini-batch's rejections before its first micro-batch when its own
log-probs are the old ones) and only their policy loss is 0, as IcePop's are.

Diagnostics (metrics `rollout_corr/*`, verl's names): the weights' effective sample size
ESS = (sum w)^2 / (n sum w^2) over the n valid tokens, chi^2 = E[r^2] - 1 per token and E[(prod_t r_t)^2] - 1
per sequence, and the shares masked. The micro-steps add up sums (`correction_sums`); `correction_metrics`
turns the step's totals into the metrics. Torch-free at import (the config checks read `resolve`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlkit.recipes.correction_schema import DEFAULT_ROLLOUT_IS_CAP

if TYPE_CHECKING:
    from torch import Tensor

    from rlkit.recipes.correction_schema import RolloutCorrectionConfig

# exp() of a log-ratio beyond this overflows or dominates (verl's SAFETY_BOUND; rlkit's TOKEN_LOG_RATIO_BOUND).
LOG_RATIO_BOUND = 20.0
SUMS = "rollout_corr_sums/"  # the micro-steps' sums; `correction_metrics` replaces them with the metrics
Weights = tuple[str, float]  # the importance weights' level (token, sequence) and upper bound


@dataclass(frozen=True)
class RejectionRule:
    """One rejection option and its bounds."""

    option: str  # a RejectionOption
    threshold: float | None  # None only in a config the checks refuse (rlkit.recipes.correction_checks)
    threshold_lower: float | None = None  # k1 options: None = 1 / threshold


@dataclass(frozen=True)
class CorrectionOptions:
    """The correction beyond the truncated weights `(level, cap)`: IcePop, batch normalisation, rejection."""

    is_threshold_lower: float | None = None  # IcePop's lower bound (None: truncation)
    batch_normalize: bool = False
    rs: tuple[RejectionRule, ...] = ()  # every rule must keep a token (none: no rejection)


def resolve(section: RolloutCorrectionConfig, mode: str) -> tuple[Weights | None, CorrectionOptions]:
    """The importance weights' (level, upper bound), or None when they are off, and the other options.

    `auto` weighs the tokens when rollout.mode overlaps generation with training, or when a rollout_is_*
    option is set (a truncation, IcePop's band, batch normalisation); otherwise off."""
    asked = (
        section.rollout_is_threshold is not None
        or section.rollout_is_threshold_lower is not None
        or section.rollout_is_batch_normalize
    )
    weights: Weights | None = None
    if section.rollout_is is not None and not (section.rollout_is == "auto" and mode == "sync" and not asked):
        level = "token" if section.rollout_is == "auto" else section.rollout_is
        cap = section.rollout_is_threshold if section.rollout_is_threshold is not None else DEFAULT_ROLLOUT_IS_CAP
        weights = (level, cap)
    options_rs = section.rollout_rs or []
    uppers = _per_option(section.rollout_rs_threshold, len(options_rs))
    lowers = _per_option(section.rollout_rs_threshold_lower, len(options_rs))
    options = CorrectionOptions(
        is_threshold_lower=section.rollout_is_threshold_lower if weights else None,
        batch_normalize=section.rollout_is_batch_normalize and weights is not None,
        rs=tuple(RejectionRule(*rule) for rule in zip(options_rs, uppers, lowers, strict=True)),
    )
    return weights, options


def _per_option(values: list | None, count: int) -> list:
    """One value shared by `count` options, or one each (any other length the checks refuse: None each)."""
    if values is not None and len(values) == 1:
        return values * count
    return list(values) if values is not None and len(values) == count else [None] * count


def importance_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, weights: Weights, options: CorrectionOptions
) -> Tensor:
    """The importance weights [B,R] before batch normalisation, detached: min(r, C) (TIS), or r inside
    IcePop's band [L, C] and 0 outside it; r per token, or one product per sequence on all its tokens."""
    from rlkit.core.algos.losses import rollout_importance_weights

    level, cap = weights
    if options.is_threshold_lower is None:
        return rollout_importance_weights(old_log_probs, rollout_log_probs, cap, level=level, response_mask=mask)
    raw = rollout_importance_weights(old_log_probs, rollout_log_probs, math.inf, level=level, response_mask=mask)
    inside = (raw >= options.is_threshold_lower) & (raw <= cap)
    return raw.where(inside, raw.new_zeros(()))


def batch_weight_mean(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, weights: Weights, options: CorrectionOptions
) -> float:
    """The mean `rollout_is_batch_normalize` divides by: of the weights over the batch's valid tokens (token
    level), or of the sequences' weights over its sequences with a valid token (sequence level, as verl)."""
    w = importance_weights(old_log_probs, rollout_log_probs, mask, weights, options)
    mask = mask.to(w.dtype)
    if weights[0] == "token":
        return float((w * mask).sum() / mask.sum().clamp(min=1))
    has_tokens = mask.sum(-1) > 0
    return float(w[:, 0][has_tokens].mean()) if has_tokens.any() else 1.0


def rejection_keep(log_ratio: Tensor, mask: Tensor, rule: RejectionRule) -> Tensor:
    """True where `rule` keeps a token (and its whole sequence, for seq_* options), [B,R] bool.

    With log r = log pi_old - log pi_rollout (bounded at +-20): k1 = -log r, k2 = (log r)^2 / 2,
    k3 = r - 1 - log r, per token (token_*), or their sum, mean or max over the sequence's valid tokens
    (seq_sum_*, seq_mean_*, seq_max_*). k1 statistics are kept within [log L, log U] (L = U's reciprocal
    unless given: seq_mean_k1 is then the geometric-mean ratio's band), k2 and k3 up to U."""
    option, upper = rule.option, rule.threshold
    assert upper is not None, "rollout_rs needs rollout_rs_threshold (rlkit.recipes.correction_checks)"
    log_r = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    divergence = option.rsplit("_", 1)[-1]
    per_token = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}[divergence]
    valid = mask.bool()
    if option.startswith("token_"):
        stat = per_token
    elif option.startswith("seq_max_"):
        stat = per_token.masked_fill(~valid, -math.inf).max(-1).values.clamp(min=0).unsqueeze(-1)
    else:
        total = per_token.where(valid, per_token.new_zeros(())).sum(-1)
        stat = (total if option.startswith("seq_sum_") else total / valid.sum(-1).clamp(min=1)).unsqueeze(-1)
    if divergence == "k1":
        lower = rule.threshold_lower if rule.threshold_lower is not None else 1 / upper
        keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
    else:
        keep = stat <= upper
    return keep.expand_as(log_ratio)


def correction_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    weights: Weights | None,
    options: CorrectionOptions,
    *,
    weight_mean: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """What multiplies each token's policy loss [B,R] (detached), and this micro-batch's diagnostic sums.

    The importance weights (1 when off), divided by `weight_mean` (the batch's, when normalised), times the
    rejection's keep mask (when on). With the default options this is exactly `rollout_importance_weights`.
    """
    import torch

    old_log_probs, rollout_log_probs = old_log_probs.detach(), rollout_log_probs.detach()
    valid = mask.bool()
    log_ratio = (old_log_probs - rollout_log_probs).where(valid, old_log_probs.new_zeros(()))
    sums = _divergence_sums(log_ratio, valid)
    out = torch.ones_like(old_log_probs)
    if weights is not None:
        out = importance_weights(old_log_probs, rollout_log_probs, mask, weights, options)
        applied = out.where(valid, out.new_zeros(()))
        sums[SUMS + "w"], sums[SUMS + "w2"] = applied.sum(), applied.square().sum()
        if options.is_threshold_lower is not None:
            sums[SUMS + "oob"] = ((out == 0) & valid).sum().to(torch.float32)
        if weight_mean is not None:
            out = out / weight_mean
    if options.rs:
        keep = torch.ones_like(valid)
        for rule in options.rs:
            kept_here = rejection_keep(log_ratio, mask, rule)
            if len(options.rs) > 1:  # each option's own share, as verl reports them
                rejected_here = ~kept_here & valid
                sums[f"{SUMS}rs_tokens/{rule.option}"] = rejected_here.sum().to(torch.float32)
                sums[f"{SUMS}rs_seqs/{rule.option}"] = rejected_here.any(-1).sum().to(torch.float32)
            keep = keep & kept_here
        rejected = ~keep & valid
        sums[SUMS + "rs_tokens"] = rejected.sum().to(torch.float32)
        sums[SUMS + "rs_seqs"] = rejected.any(-1).sum().to(torch.float32)
        out = out * keep
    return out.detach(), {k: v.detach() for k, v in sums.items()}


def _divergence_sums(log_ratio: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """Sums for the chi-squared divergences: valid tokens, sequences with one, sum r_t^2, sum_i (prod_t r_t)^2."""
    import torch

    bounded = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    has_tokens = valid.any(-1)
    seq_log_ratio = log_ratio.sum(-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return {
        SUMS + "tokens": valid.sum().to(torch.float32),
        SUMS + "seqs": has_tokens.sum().to(torch.float32),
        SUMS + "r2": (2 * bounded).exp().where(valid, bounded.new_zeros(())).sum(),
        SUMS + "seq_r2": (2 * seq_log_ratio).exp().where(has_tokens, seq_log_ratio.new_zeros(())).sum(),
    }


def correction_metrics(totals: dict[str, float]) -> dict[str, float]:
    """`totals` (a step's summed metrics, every one divided by the same token count) with the correction's
    sums replaced by its metrics: ratios of sums, so the common divisor cancels.

    rollout_corr/chi2_token = sum r^2 / n - 1; chi2_seq = sum_i (prod r)^2 / sequences - 1;
    rollout_is_eff_sample_size = (sum w)^2 / (n sum w^2) (verl's 1 / mean((w / mean w)^2));
    rollout_is_oob_ratio: share of tokens IcePop set to 0; rollout_rs_masked_fraction and
    rollout_rs_seq_masked_fraction: shares of tokens rejected and of sequences with a rejected token."""
    sums = {k[len(SUMS) :]: v for k, v in totals.items() if k.startswith(SUMS)}
    out = {k: v for k, v in totals.items() if not k.startswith(SUMS)}
    if not sums:
        return out
    tokens, seqs = max(sums["tokens"], 1e-12), max(sums["seqs"], 1e-12)
    out["rollout_corr/chi2_token"] = sums["r2"] / tokens - 1
    out["rollout_corr/chi2_seq"] = sums["seq_r2"] / seqs - 1
    if "w" in sums:
        out["rollout_corr/rollout_is_eff_sample_size"] = sums["w"] ** 2 / (tokens * sums["w2"]) if sums["w2"] else 0.0
    if "oob" in sums:
        out["rollout_corr/rollout_is_oob_ratio"] = sums["oob"] / tokens
    if "rs_tokens" in sums:
        out["rollout_corr/rollout_rs_masked_fraction"] = sums["rs_tokens"] / tokens
        out["rollout_corr/rollout_rs_seq_masked_fraction"] = sums["rs_seqs"] / seqs
    for key, value in sums.items():
        if key.startswith("rs_tokens/"):
            option = key.split("/", 1)[1]
            out[f"rollout_corr/rollout_rs_{option}_masked_fraction"] = value / tokens
            out[f"rollout_corr/rollout_rs_{option}_seq_masked_fraction"] = sums[f"rs_seqs/{option}"] / seqs
    return out
