"""CISPO: clip the importance weight, never the token (Chen et al. 2025, MiniMax-M1, arXiv 2506.13585).

    loss_t = -sg(clip(r_t, 1 - is_clip_low, 1 + is_clip_high)) * A_t * log pi(y_t),   r_t = pi(y_t) / pi_old(y_t)

PPO's clip zeroes the gradient of a token whose ratio left the trust region, and the tokens that leave it
first are rare ones ("However", "Wait") whose probability the update raised: their signal is lost after
the first mini-batch. CISPO keeps every token's gradient, A_t * grad log pi(y_t), and bounds only its
weight. The weight is detached, so the gradient is that of REINFORCE with a truncated importance weight.
The paper sets no lower bound (is_clip_low large: with 1.0 the weight is only kept >= 0) and tunes
is_clip_high. Options (`actor.policy_loss_options`), with verl/trinity's names in parentheses:
- is_clip_low  (clip_ratio_low for verl's cispo): 1.0, the weight's lower bound is 1 - is_clip_low;
- is_clip_high (clip_ratio_high): 0.28, DAPO's clip-higher bound as a starting point (the paper tunes it).
Metrics: pg_clipfrac (share of tokens whose weight was clipped), ppo_kl, pg_clipfrac_lower (clipped from
below), and is_weight_mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.tensor_math import TOKEN_LOG_RATIO_BOUND, masked_mean


def cispo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    is_clip_low: float = 1.0,
    is_clip_high: float = 0.28,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token CISPO loss [B,R] (0 on padding) and its metrics."""
    if not (0 <= is_clip_low <= 1 and is_clip_high >= 0):
        raise ValueError(f"CISPO needs 0 <= is_clip_low <= 1 and is_clip_high >= 0, got {is_clip_low}, {is_clip_high}")
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    log_ratio = torch.where(mask, log_probs - old_log_probs, zeros).clamp(-TOKEN_LOG_RATIO_BOUND, TOKEN_LOG_RATIO_BOUND)
    ratio = log_ratio.exp().detach()
    weight = ratio.clamp(1.0 - is_clip_low, 1.0 + is_clip_high)
    loss = torch.where(mask, -weight * advantages * log_probs, zeros)
    metrics = {
        "pg_clipfrac": masked_mean((weight != ratio).float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": masked_mean((ratio < 1.0 - is_clip_low).float(), mask).detach(),
        "is_weight_mean": masked_mean(weight, mask).detach(),
    }
    return loss, metrics
