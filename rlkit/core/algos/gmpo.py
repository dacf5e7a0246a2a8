"""GMPO: geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673).

GRPO's token-mean of ratios lets one token with an extreme ratio dominate a sequence's update. GMPO
optimises the geometric mean of the token ratios instead, clipped per token in log space. For sequence
i with token log-ratios l_t = log pi(y_t) - log pi_old(y_t) and advantage A_i (its tokens' mean):

    c_t   = clip(l_t, -log_clip_low, log_clip_high)
    l'_t  = min(l_t, c_t) if A_i > 0, max(l_t, c_t) if A_i < 0     (the pessimistic side, as PPO's clip)
    r_i   = exp(mean_t l'_t)                                     (geometric mean of the clipped ratios)
    loss_i = -A_i r_i

Every token of sequence i carries loss_i: with loss_agg_mode=seq-mean-token-mean (the `gmpo` recipe) the
step's loss is the mean of loss_i over sequences, as verl's `geo_mean` loss; a token whose clipped side
is taken gets no gradient. Options (`actor.policy_loss_options`), verl's names in parentheses:
- log_clip_low  (clip_ratio_low, which verl's geo_mean reads in log space): 0.4;
- log_clip_high (clip_ratio_high): 0.4 — the paper's ratio range (e^-0.4, e^0.4).
Metrics: pg_clipfrac / pg_clipfrac_lower (share of tokens whose clipped log-ratio is the one used, with a
positive / negative advantage), ppo_kl (mean of old - new log-prob), seq_ratio_mean (r_i over tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.tensor_math import TOKEN_LOG_RATIO_BOUND, masked_mean


def gmpo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    log_clip_low: float = 0.4,
    log_clip_high: float = 0.4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token GMPO loss [B,R] (each sequence's loss on its tokens, 0 on padding) and its metrics."""
    if log_clip_low < 0 or log_clip_high < 0:
        raise ValueError(f"GMPO needs log_clip_low, log_clip_high >= 0, got {log_clip_low}, {log_clip_high}")
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    log_ratio = torch.where(mask, log_probs - old_log_probs, zeros).clamp(-TOKEN_LOG_RATIO_BOUND, TOKEN_LOG_RATIO_BOUND)
    lengths = mask.sum(-1).clamp(min=1)
    seq_advantage = torch.where(mask, advantages, zeros).sum(-1) / lengths
    clipped = log_ratio.clamp(-log_clip_low, log_clip_high)
    positive = (seq_advantage > 0).unsqueeze(-1)
    pessimistic = torch.where(positive, torch.minimum(log_ratio, clipped), torch.maximum(log_ratio, clipped))
    seq_ratio = (torch.where(mask, pessimistic, zeros).sum(-1) / lengths).exp()
    seq_loss = -seq_advantage * seq_ratio
    loss = torch.where(mask, seq_loss.unsqueeze(-1).expand_as(log_probs), zeros)
    active = (pessimistic != log_ratio) & mask
    negative = (seq_advantage < 0).unsqueeze(-1)
    metrics = {
        "pg_clipfrac": masked_mean((active & positive).float(), mask).detach(),
        "pg_clipfrac_lower": masked_mean((active & negative).float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "seq_ratio_mean": masked_mean(seq_ratio.unsqueeze(-1).expand_as(log_probs), mask).detach(),
    }
    return loss, metrics
