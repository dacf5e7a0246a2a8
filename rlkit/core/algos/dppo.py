"""DPPO: a trust region on the policy's divergence, not on its ratio (Qi et al. 2026, "Rethinking the Trust
Region in LLM Reinforcement Learning", arXiv 2602.04879).

PPO's clip judges a token by its ratio r_t = pi(y_t) / pi_old(y_t), one sample of the divergence between the
two policies: a rare token is clipped after a tiny change of probability, while a likely token may move a
lot within [1 - eps, 1 + eps]. DPPO judges it by a divergence of the two distributions, approximated on the
binary split {the sampled token, every other token} ("Binary" in the paper), with p = pi(y_t), q = pi_old(y_t):

    dppo_tv:  D_t = p - q                                      (binary total variation, signed)
    dppo_kl:  D_t = q log(q / p) + (1 - q) log((1 - q) / (1 - p))  (binary KL(pi_old || pi), eps 1e-8 in the logs)

A token keeps its gradient unless the update already moved it past the threshold in the direction its
advantage pushes (m_t = 0 then, as PPO's clip on the pessimistic side):

    A_t > 0:  m_t = 1 unless p - q > clip_divergence_high   (kl: D_t > clip_divergence_high and p > q)
    A_t <= 0: m_t = 1 unless q - p > clip_divergence_low    (kl: D_t > clip_divergence_low and p < q)

    loss_t = -A_t * sg(min(r_t, ratio_cap)) * m_t * log pi(y_t)

so a kept token's gradient is A_t * min(r_t, ratio_cap) * grad log pi(y_t), PPO's A_t grad r_t below the cap.
The cap truncates the importance weight (TIS) where PPO would dual-clip; the paper recommends a large one, as
truncation biases the gradient. Options (`actor.policy_loss_options`), with verl's names in parentheses:
- clip_divergence_low, clip_divergence_high (actor.clip_ratio_low/high, which verl's dppo losses read as the
  divergence thresholds): 0.15 for dppo_tv, 0.05 for dppo_kl (verl's DPPO example, after the paper);
- ratio_cap (actor.clip_ratio_c): 20.0, verl's value when clip_ratio_c is not set.
Metrics: pg_clipfrac (share of tokens masked), pg_clipfrac_lower (kept tokens whose ratio was truncated),
ppo_kl (mean of old - new log-prob).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.tensor_math import TOKEN_LOG_RATIO_BOUND, masked_mean

_BINARY_KL_EPS = 1e-8  # keeps log(1 - p) finite where a probability reaches 1, as verl's


def _dppo_loss(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, keep: Tensor, ratio_cap: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """The shared surrogate: -A * sg(min(r, ratio_cap)) * keep * log pi on valid tokens, and the metrics."""
    zeros = torch.zeros_like(log_probs)
    log_ratio = torch.where(mask, log_probs - old_log_probs, zeros).clamp(-TOKEN_LOG_RATIO_BOUND, TOKEN_LOG_RATIO_BOUND)
    ratio = log_ratio.exp().detach()
    weight = ratio.clamp(max=ratio_cap)
    keep = keep & mask
    loss = torch.where(keep, -advantages * weight * log_probs, zeros)
    metrics = {
        "pg_clipfrac": masked_mean((~keep).float(), mask).detach(),
        "pg_clipfrac_lower": masked_mean((keep & (ratio > ratio_cap)).float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return loss, metrics


def _check(name: str, clip_divergence_low: float, clip_divergence_high: float, ratio_cap: float) -> None:
    """ValueError unless the thresholds and the cap are positive (a threshold of 0 would mask every move)."""
    if clip_divergence_low <= 0 or clip_divergence_high <= 0 or ratio_cap <= 0:
        raise ValueError(
            f"{name} needs clip_divergence_low, clip_divergence_high, ratio_cap > 0, got {clip_divergence_low}, "
            f"{clip_divergence_high}, {ratio_cap}"
        )


def dppo_tv(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_divergence_low: float = 0.15,
    clip_divergence_high: float = 0.15,
    ratio_cap: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token DPPO-Binary-TV loss [B,R] (0 on padding) and metrics (arXiv 2602.04879):
    -A sg(min(r, ratio_cap)) m log pi, m = 0 where p - q > clip_divergence_high (A > 0) or q - p >
    clip_divergence_low (A <= 0), p and q the sampled token's new and old probabilities."""
    _check("DPPO-TV", clip_divergence_low, clip_divergence_high, ratio_cap)
    mask = response_mask.bool()
    log_probs = torch.where(mask, log_probs, torch.zeros_like(log_probs))  # padding may hold garbage (even inf)
    change = (log_probs.exp() - old_log_probs.exp()).detach()
    keep = torch.where(advantages > 0, change <= clip_divergence_high, change >= -clip_divergence_low)
    return _dppo_loss(log_probs, old_log_probs, advantages, mask, keep, ratio_cap)


def dppo_kl(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_divergence_low: float = 0.05,
    clip_divergence_high: float = 0.05,
    ratio_cap: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token DPPO-Binary-KL loss [B,R] (0 on padding) and metrics (arXiv 2602.04879):
    -A sg(min(r, ratio_cap)) m log pi, m = 0 where D = KL(Bern(q) || Bern(p)) exceeds clip_divergence_high with
    p > q (A > 0), or clip_divergence_low with p < q (A <= 0)."""
    _check("DPPO-KL", clip_divergence_low, clip_divergence_high, ratio_cap)
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    old_log_probs = torch.where(mask, old_log_probs, zeros)
    new, old = log_probs.detach(), old_log_probs.detach()
    p, q = new.exp(), old.exp()
    rest = torch.log(1 - q + _BINARY_KL_EPS) - torch.log(1 - p + _BINARY_KL_EPS)
    divergence = q * (old - new) + (1 - q) * rest
    keep = torch.where(
        advantages > 0,
        (divergence <= clip_divergence_high) | (p <= q),
        (divergence <= clip_divergence_low) | (p >= q),
    )
    return _dppo_loss(log_probs, old_log_probs, advantages, mask, keep, ratio_cap)
