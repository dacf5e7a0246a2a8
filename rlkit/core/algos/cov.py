"""Clip-Cov and KL-Cov: restrain the few tokens that drive entropy down (Cui et al. 2025, "The Entropy
Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617).

Under a policy gradient the policy's entropy falls by about the covariance, over the sampled tokens, of a
token's log-probability and its advantage: confident tokens with a positive advantage collapse it. The paper
measures each token's share of that covariance,

    cov_t = (logp_t - mean(logp)) * (A_t - mean(A))        (means over the valid tokens of the batch)

and restrains only a tiny share of tokens with a large cov_t, leaving every other token's PPO update alone:

- `clip_cov`: PPO's clipped surrogate (rlkit.core.algos.losses.vanilla, dual clip included); of the tokens with
  clip_cov_lb < cov_t < clip_cov_ub whose surrogate still has a gradient, max(1, int(clip_cov_ratio * N)) are
  drawn at random (N: valid tokens) and their loss is detached: its value stays, its gradient is 0.
- `kl_cov`: no clip; loss_t = -A_t r_t, plus ppo_kl_coef * |logp_t - old_logp_t| on the max(1, int(kl_cov_ratio
  * N)) tokens with the largest cov_t (r_t = pi(y_t) / pi_old(y_t)).

Clip-Cov's draw is reproducible without a random generator: each token's draw is an integer hash of its position
in the response, its old log-prob and its advantage (their float32 bits), and the eligible tokens with the
smallest hashes are taken. The same batch always detaches the same tokens, whatever the process's RNG state,
so a resumed run repeats the update bit for bit; ties (identical samples) go to the earlier token.

Both work on the tokens they are given, as verl's: the means, N and the choice are those of one micro-batch
on one rank, so unlike rlkit's other losses the token choice depends on actor.micro_batch_tokens and the
number of ranks (docs/algorithms.md, "Policy losses").

Options (`actor.policy_loss_options`), verl's names: clip_cov_ratio 2e-4, clip_cov_lb 1.0, clip_cov_ub 5.0
(clip_cov); kl_cov_ratio 2e-4, ppo_kl_coef 1.0 (kl_cov). clip_cov also reads actor.clip_ratio_low/high/c.
Metrics: clip_cov: vanilla's (pg_clipfrac, ppo_kl, pg_clipfrac_lower) and clip_cov_frac (share of tokens
detached); kl_cov: ppo_kl and kl_cov_frac (share of tokens penalised).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.losses import vanilla
from rlkit.core.algos.tensor_math import TOKEN_LOG_RATIO_BOUND, masked_mean
from rlkit.recipes.actor_schema import DEFAULT_CLIP_RATIO_C

_HASH_MULTIPLIER = 0x45D9F3B  # a 32-bit integer mixer's constant: products stay below 2**59, no int64 overflow
_LOW_32_BITS = 0xFFFFFFFF


def token_covariance(log_probs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (logp_t - mean logp) * (A_t - mean A), means over the valid tokens; detached, 0 on padding."""
    log_probs, advantages = log_probs.detach(), advantages.detach()
    centred_log_probs = log_probs - masked_mean(log_probs, mask)
    centred_advantages = advantages - masked_mean(advantages, mask)
    return torch.where(mask, centred_log_probs * centred_advantages, torch.zeros_like(log_probs))


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift and multiply, twice), on int64 tensors holding 32-bit values."""
    for _ in range(2):
        x = ((x ^ (x >> 16)) * _HASH_MULTIPLIER) & _LOW_32_BITS
    return x ^ (x >> 16)


def token_draws(old_log_probs: Tensor, advantages: Tensor) -> Tensor:
    """Each token's pseudo-random draw, int64 in [0, 2**32): a hash of its position, its old log-prob and its
    advantage. Deterministic: the same token always draws the same number, on any rank, in any process."""
    old_bits = old_log_probs.detach().float().contiguous().view(torch.int32).long() & _LOW_32_BITS
    advantage_bits = advantages.detach().float().contiguous().view(torch.int32).long() & _LOW_32_BITS
    positions = torch.arange(old_log_probs.shape[-1], device=old_log_probs.device).expand_as(old_bits)
    return _mix(_mix(_mix(old_bits) ^ advantage_bits) ^ positions)


def _first_by_key(candidates: Tensor, key: Tensor, count: int) -> Tensor:
    """The `count` candidates with the smallest keys (ties: the earlier position), as a bool mask."""
    positions = candidates.flatten().nonzero().squeeze(-1)
    order = torch.sort(key.flatten()[positions], stable=True).indices[:count]
    chosen = torch.zeros_like(candidates.flatten())
    chosen[positions[order]] = True
    return chosen.view_as(candidates)


def clip_cov(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = DEFAULT_CLIP_RATIO_C,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token Clip-Cov loss [B,R] (0 on padding) and metrics (arXiv 2505.22617): PPO's clipped surrogate,
    with max(1, int(clip_cov_ratio * N)) tokens drawn among those with clip_cov_lb < cov_t < clip_cov_ub whose
    surrogate still has a gradient, and detached. clip_ratio_low/high/c: PPO's, from the actor's keys."""
    if not (0 < clip_cov_ratio <= 1 and clip_cov_lb < clip_cov_ub):
        raise ValueError(
            f"Clip-Cov needs 0 < clip_cov_ratio <= 1 and clip_cov_lb < clip_cov_ub, got {clip_cov_ratio}, "
            f"{clip_cov_lb}, {clip_cov_ub}"
        )
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    loss, metrics = vanilla(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    # Where PPO's clip or the dual-clip cap binds the token has no gradient already: a draw there would be lost.
    ratio = torch.where(mask, log_probs - old_log_probs, zeros).clamp(max=TOKEN_LOG_RATIO_BOUND).detach().exp()
    positive, negative = advantages > 0, advantages < 0
    bound = (positive & (ratio > 1 + clip_ratio_high)) | (negative & (ratio < 1 - clip_ratio_low))
    if clip_ratio_c is not None:
        bound |= negative & (ratio > clip_ratio_c)
    cov = token_covariance(log_probs, advantages, mask)
    candidates = mask & ~bound & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    count = max(int(clip_cov_ratio * int(mask.sum())), 1)
    detached = _first_by_key(candidates, token_draws(old_log_probs, advantages), count)
    loss = torch.where(detached, loss.detach(), loss)
    metrics["clip_cov_frac"] = masked_mean(detached.float(), mask).detach()
    return loss, metrics


def kl_cov(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token KL-Cov loss [B,R] (0 on padding) and metrics (arXiv 2505.22617): loss_t = -A_t r_t, plus
    ppo_kl_coef * |log r_t| on the max(1, int(kl_cov_ratio * N)) tokens of largest cov_t (ties: the earlier)."""
    if not (0 < kl_cov_ratio <= 1 and ppo_kl_coef >= 0):
        raise ValueError(f"KL-Cov needs 0 < kl_cov_ratio <= 1 and ppo_kl_coef >= 0, got {kl_cov_ratio}, {ppo_kl_coef}")
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    log_ratio = torch.where(mask, log_probs - old_log_probs, zeros).clamp(-TOKEN_LOG_RATIO_BOUND, TOKEN_LOG_RATIO_BOUND)
    cov = token_covariance(log_probs, advantages, mask)
    count = max(int(kl_cov_ratio * int(mask.sum())), 1)
    # The largest covariances first: sorting -cov ascending (stable) puts ties in token order.
    penalised = _first_by_key(mask, -cov, count)
    loss = -advantages * log_ratio.exp() + torch.where(penalised, ppo_kl_coef * log_ratio.abs(), zeros)
    loss = torch.where(mask, loss, zeros)
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "kl_cov_frac": masked_mean(penalised.float(), mask).detach(),
    }
    return loss, metrics
