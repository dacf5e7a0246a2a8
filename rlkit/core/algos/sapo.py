"""SAPO: soft adaptive policy optimisation (Gao et al. 2025, Qwen, arXiv 2511.20347).

PPO's hard clip drops a token's gradient the moment its ratio leaves [1 - eps, 1 + eps]. SAPO replaces the
clip by a smooth gate of the ratio r_t = pi(y_t) / pi_old(y_t):

    f(r) = (4 / tau) * sigmoid(tau * (r - 1)),      loss_t = -f(r_t) * A_t
    tau  = tau_pos where A_t > 0, tau_neg where A_t <= 0

Its gradient is -A_t * w_t * grad log pi(y_t) with w_t = 4 sigmoid(x)(1 - sigmoid(x)) r_t, x = tau (r_t - 1):
1 on-policy (r = 1, the policy gradient), shrinking smoothly as the ratio drifts, faster for negative
advantages (tau_neg > tau_pos: their tokens destabilise training more, the paper argues). The paper averages
per sequence, then over the group: the `sapo` recipe sets loss_agg_mode=seq-mean-token-mean.
Options (`actor.policy_loss_options`), the names verl and AReaL use: tau_pos 1.0, tau_neg 1.05.
Metrics: ppo_kl (mean of old - new log-prob), sapo_weight_mean (w_t over tokens: 1 on-policy).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.tensor_math import TOKEN_LOG_RATIO_BOUND, masked_mean


def sapo(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token SAPO loss [B,R] (0 on padding) and its metrics."""
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO needs tau_pos, tau_neg > 0, got {tau_pos}, {tau_neg}")
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_ratio = torch.where(mask, log_probs - old_log_probs, zeros).clamp(-TOKEN_LOG_RATIO_BOUND, TOKEN_LOG_RATIO_BOUND)
    ratio = log_ratio.exp()
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = torch.where(mask, -(4.0 / tau) * gate * advantages, zeros)
    weight = 4.0 * gate * (1.0 - gate) * ratio  # d f / d log pi
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "sapo_weight_mean": masked_mean(weight, mask).detach(),
    }
    return loss, metrics
