"""Policy losses, loss aggregation, the PPO value loss and token entropy.

Policy losses are registered by name in ``POLICY_LOSSES`` and called through :func:`policy_loss`.
They return a *per-token* loss ``[B,R]``; turning it into a scalar is :func:`aggregate_loss`'s
job, which is where micro-batching and data parallelism are made harmless (see its docstring).
"""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Any

import torch
from torch import Tensor

from rlkit.core.algos.tensor_math import SEQ_LOG_RATIO_MAX, TOKEN_LOG_RATIO_BOUND, masked_mean
from rlkit.core.registrations import POLICY_LOSSES
from rlkit.recipes.actor_schema import DEFAULT_CLIP_RATIO_C

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def policy_loss(
    name: str,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    **options: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token policy loss ``[B,R]`` (0 on padding) and metrics for this batch.

    ``options`` are the loss's own hyper-parameters, the keyword-only parameters it declares
    (:func:`loss_options`); each loss documents its metrics. PPO's clip losses report
    ``pg_clipfrac`` (share of tokens where the ratio clip is active), ``ppo_kl`` (mean of
    old_logp - logp), ``pg_clipfrac_lower`` (share of tokens where the dual-clip cap is active;
    0 without ``clip_ratio_c``); ``gspo`` adds ``seq_ratio_mean`` (its sequence ratio s_i,
    averaged over tokens).
    """
    loss_fn = POLICY_LOSSES.get(name)
    unknown = sorted(set(options) - set(loss_options(name)))
    if unknown:
        raise TypeError(
            f"policy loss {name!r} has no option {', '.join(unknown)} "
            f"(its options: {', '.join(loss_options(name)) or 'none'})"
        )
    return loss_fn(log_probs, old_log_probs, advantages, response_mask, **options)


def loss_options(name: str) -> dict[str, Any]:
    """A registered policy loss's hyper-parameters: its keyword-only parameters, with their defaults."""
    parameters = inspect.signature(POLICY_LOSSES.get(name)).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


PPO_CLIP_KEYS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")  # the actor's keys a loss may declare


def configured_loss_options(name: str, actor: Any) -> dict[str, Any]:
    """The options `name` runs with: PPO's clip keys from the actor config (actor.clip_ratio_low, ...) for
    a loss that declares them, and `actor.policy_loss_options` for the loss's own. ValueError names a key
    the loss does not have, with the closest it does."""
    declared = loss_options(name)
    own = dict(actor.policy_loss_options)
    for key in own:
        if key not in declared:
            close = difflib.get_close_matches(key, declared, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"policy loss {name!r} has no option {key!r} (its options: {', '.join(declared) or 'none'}){hint}"
            )
        if hasattr(actor, key):
            raise ValueError(f"{key!r} is an actor key: set actor.{key}, not actor.policy_loss_options.{key}")
    for key in PPO_CLIP_KEYS:  # verl's cispo, geo_mean and sapo read its clip_ratio_* as their own bounds: not here
        default = type(actor).model_fields[key].default
        if key not in declared and getattr(actor, key) != default:
            raise ValueError(
                f"policy loss {name!r} does not read actor.{key} (PPO's clip), set to {getattr(actor, key)}; its "
                f"own options are actor.policy_loss_options.{{{', '.join(declared)}}} (docs/algorithms.md). "
                f"Leave actor.{key} at {default}."
            )
    from_actor = {key: getattr(actor, key) for key in declared if hasattr(actor, key)}
    return {**from_actor, **own}


def rollout_importance_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    cap: float,
    *,
    level: str = "token",
    response_mask: Tensor | None = None,
) -> Tensor:
    """Truncated importance weights of the rollout policy's samples, [B,R], detached.

    The engine samples from a policy that differs from the one the update starts from (pi_old):
    its numerics (bf16 kernels, another attention), or an older version in asynchronous
    rollout. Weighting each token's policy loss by pi_old / pi_rollout corrects the gradient
    for it, and truncating at `cap` bounds the variance (TIS: Yao et al. 2025, "Your Efficient
    RL Framework Secretly Brings You Off-Policy RL Training"; IMPALA's truncated weights,
    Espeholt et al. 2018). level "token": min(r_t, cap) per token. level "sequence": one
    weight per sequence, min(prod_t r_t, cap) over its `response_mask` tokens, on all of them.
    """
    if level == "token":
        log_ratio = (old_log_probs - rollout_log_probs).clamp(max=TOKEN_LOG_RATIO_BOUND)
        return log_ratio.exp().clamp(max=cap).detach()
    if level != "sequence":
        raise ValueError(f"unknown importance-weight level {level!r} (token, sequence)")
    if response_mask is None:
        raise ValueError("sequence-level importance weights need the response mask")
    mask = response_mask.bool()
    token_log_ratio = torch.where(mask, old_log_probs - rollout_log_probs, torch.zeros_like(old_log_probs))
    # min(exp(s), cap) = exp(min(s, log cap)): the product of many ratios never overflows.
    weight = token_log_ratio.sum(-1).clamp(max=math.log(cap)).exp()
    return weight.unsqueeze(-1).expand_as(old_log_probs).detach()


def _clipped_surrogate(
    ratio: Tensor,
    token_log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's pessimistic clipped objective, shared by the token-ratio and sequence-ratio losses.

    loss = max(-A*r, -A*clip(r, 1-low, 1+high)); with dual clip, for A < 0 the loss is further
    capped at -A*c so a huge ratio on a bad token cannot blow up the update (Ye et al. 2020).
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean((clipped > unclipped).float(), mask)
    if clip_ratio_c is None:
        clipfrac_lower = torch.zeros((), dtype=loss.dtype)
    else:
        cap = -advantages * clip_ratio_c
        negative = advantages < 0
        clipfrac_lower = masked_mean(((loss > cap) & negative).float(), mask)
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    metrics = {
        "pg_clipfrac": clipfrac.detach(),
        "ppo_kl": masked_mean(-token_log_ratio, mask).detach(),
        "pg_clipfrac_lower": clipfrac_lower.detach(),
    }
    return loss, metrics


def vanilla(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = DEFAULT_CLIP_RATIO_C,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip with a token-level ratio r_t = pi(y_t) / pi_old(y_t) (Schulman et al. 2017).

    Separate low/high bounds give DAPO's clip-higher (Yu et al. 2025): a larger high bound lets
    rare, positively rewarded tokens grow further before the clip stops their gradient.
    """
    mask = response_mask.bool()
    log_ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
    log_ratio = log_ratio.clamp(-TOKEN_LOG_RATIO_BOUND, TOKEN_LOG_RATIO_BOUND)
    return _clipped_surrogate(
        log_ratio.exp(),
        log_ratio,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )


def gspo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = DEFAULT_CLIP_RATIO_C,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): clip a length-normalised *sequence* ratio instead of token ratios.

    s_i = exp(mean_t(logp_t - old_logp_t)). The per-token ratio is written as
    s_i,t = sg(s_i) * pi(y_t) / sg(pi(y_t)) (GSPO-token): its value is s_i on every token, and
    its gradient w.r.t. logp_t is s_i, so with equal advantages on a sequence and
    ``seq-mean-token-mean`` aggregation the gradient is exactly GSPO's.
    """
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    token_log_ratio = torch.where(mask, log_probs - old_log_probs, zeros)
    lengths = mask.sum(-1).clamp(min=1)
    seq_log_ratio = token_log_ratio.sum(-1) / lengths
    log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = log_ratio.clamp(max=SEQ_LOG_RATIO_MAX).exp()
    loss, metrics = _clipped_surrogate(
        ratio,
        token_log_ratio,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    # The sequence ratio, to read against the paper's tiny clip range (token mean: each token
    # carries its sequence's s_i, so micro-batches and ranks aggregate it like the other metrics).
    metrics["seq_ratio_mean"] = masked_mean(ratio, mask).detach()
    return loss, metrics


def aggregate_loss(
    per_token_loss: Tensor,
    response_mask: Tensor,
    mode: str,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    norm_length: int | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B,R]`` to a scalar.

    The trainer splits an optimizer mini-batch into micro-batches (and ranks) and *sums* their
    gradients. For that sum to equal the unsplit loss, every micro-batch must divide by the
    normaliser of the whole mini-batch: pass ``global_num_tokens`` (valid tokens) and
    ``global_num_seqs`` (sequences with at least one valid token) of the mini-batch. Left as
    None, this batch's own counts are used, which is right only when the batch is not split.

    - token-mean:              sum(loss) / num_tokens
    - token-sum:               sum(loss), no normaliser (verl's token-sum): the parts' sums add up to the
      mini-batch's whatever the split, so it reads no count; its gradient grows with the mini-batch's tokens
    - seq-mean-token-mean:     sum_i mean_t(loss_i,t) / num_seqs
    - seq-mean-token-sum:      sum(loss) / num_seqs
    - seq-mean-token-sum-norm: sum(loss) / (num_seqs * norm_length), norm_length defaulting to R
      (Dr.GRPO: a constant length normaliser, so long answers are not down-weighted per token)
    """
    mask = response_mask.bool()
    mask_f = mask.to(per_token_loss.dtype)
    loss = torch.where(mask, per_token_loss, torch.zeros_like(per_token_loss))
    if mode == "token-mean":
        num_tokens = mask_f.sum().clamp(min=1) if global_num_tokens is None else global_num_tokens
        return loss.sum() / num_tokens
    if mode == "token-sum":
        return loss.sum()
    if mode not in AGG_MODES:
        close = difflib.get_close_matches(mode, AGG_MODES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown loss aggregation mode {mode!r} (known: {', '.join(AGG_MODES)}){hint}")
    if global_num_seqs is None:
        num_seqs = (mask_f.sum(-1) > 0).sum().clamp(min=1).to(loss.dtype)
    else:
        num_seqs = global_num_seqs
    if mode == "seq-mean-token-mean":
        return (loss.sum(-1) / mask_f.sum(-1).clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum":
        return loss.sum() / num_seqs
    length = loss.shape[-1] if norm_length is None else norm_length
    return loss.sum() / (num_seqs * length)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO critic loss per token: 0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2).

    Taking the max makes the clip pessimistic: the critic cannot lower its loss by jumping more
    than ``c`` away from the values it had at rollout time. ``None`` disables clipping.
    Metric ``vf_clipfrac``: share of valid tokens where the clipped term is the larger one.
    """
    mask = response_mask.bool()
    loss = (values - returns) ** 2
    if cliprange_value is None:
        clipfrac = torch.zeros((), dtype=loss.dtype)
    else:
        clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
        clipped_loss = (clipped_values - returns) ** 2
        clipfrac = masked_mean((clipped_loss > loss).float(), mask)
        loss = torch.maximum(loss, clipped_loss)
    loss = torch.where(mask, 0.5 * loss, torch.zeros_like(loss))
    return loss, {"vf_clipfrac": clipfrac.detach()}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim: H = logsumexp(z) - sum_v p_v z_v.

    Equal to -sum p log p, but never takes log of a tiny probability. Logits are first shifted
    so their max is 0 (H is shift-invariant, so the detached shift changes neither value nor
    gradient): otherwise with logits near 1000 the two terms are ~1000 each and float32
    cancellation loses the ~1 that is left. Logits must be finite.
    """
    shifted = logits - logits.max(dim=-1, keepdim=True).values.detach()
    probs = torch.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - (probs * shifted).sum(-1)
