"""GPG's policy loss (Chu et al. 2025, *GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning*, arXiv 2504.02546): the plain policy gradient, no ratio, no clip, no KL.

    loss_t = -A_t * log pi(y_t)

Its gradient is -A_t grad log pi(y_t) whatever pi_old is: the samples are treated as on-policy (the paper
updates once per batch; with several mini-batches the later ones are off-policy without a correction).
No options. Metrics: ppo_kl (mean of old - new log-prob, how far the update has moved from the sampling
policy). The paper's advantage (a group-centred score with a batch correction factor) is not built: use
GRPO's (`algorithm.adv_estimator=grpo`, `norm_adv_by_std=false` for Dr.GRPO's centring only).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.tensor_math import masked_mean


def gpg(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token GPG loss [B,R] (0 on padding) and its metric."""
    mask = response_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold garbage (even inf)
    loss = torch.where(mask, -advantages * log_probs, zeros)
    return loss, {"ppo_kl": masked_mean(torch.where(mask, old_log_probs - log_probs, zeros), mask).detach()}
