"""The Optimal Token Baseline: a per-token group baseline weighted by each sample's accumulated gradient energy.

Registered as ``optimal_token_baseline`` (verl's name) in ``ADV_ESTIMATORS``; docs/algorithms.md gives the
formula. It reads per-token statistics of the old-log-prob pass (``AdvantageInputs.old_log_probs`` and
``sum_pi_squared``), which the run's Algorithm asks the trainer for (rlkit.core.algos.needs: ``token_stats``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs, group_index


def optimal_token_baseline(inputs: AdvantageInputs, **_: object) -> tuple[Tensor, Tensor]:
    """Optimal Token Baseline (Li et al. 2026, *The Optimal Token Baseline: Variance Reduction for Long-Horizon
    LLM-RL*, arXiv 2602.07078).

    G_t = sum_{k >= t} r_k, the reward-to-go. w_t = 1 - 2 pi_t + sum_v pi_v^2 is |e_{y_t} - pi|^2, the squared
    norm of the gradient of log pi(y_t) with respect to the logits (the paper's logit-gradient proxy; pi_t =
    exp(old_log_probs_t), sum_v pi_v^2 = ``sum_pi_squared``), times rho_t^2 when rollout importance weights rho
    are on. W_t = sum_{j <= t} w_j over valid tokens: the energy the sample's path accumulated up to t. Per
    group G and position t, over the samples with a valid token there:
        B_t = sum_i G_i,t W_i,t / sum_i W_i,t ;   A_i,t = G_i,t - B_t ;   returns = G.
    No hyper-parameters.

    As verl's ``compute_optimal_token_baseline_advantage``: a group of one sample gets B = 0 (A = G), and where
    only one sample of a group has a valid token (the tail of a group's single longest response) B = 0 too,
    since that sample's own return as its baseline would leave the tail no signal. Differences from verl:
    verl adds 1e-8 to the denominator, rlkit divides exactly and takes B = 0 only where sum_i W_i,t is 0 (every
    gradient there is 0 too); the weighted mean is taken of G less the position's largest G in the group, in
    float64, so a group of equal returns gets exactly 0.
    """
    if inputs.old_log_probs is None or inputs.sum_pi_squared is None:
        raise ValueError(
            "advantage estimator 'optimal_token_baseline' needs the old-log-prob pass's per-token statistics "
            "(AdvantageInputs.old_log_probs and sum_pi_squared)"
        )
    returns, path_energy, valid = returns_and_path_energy(inputs)
    baseline = group_baseline(returns, path_energy, valid, inputs.group_ids)
    dtype = inputs.token_rewards.dtype
    return ((returns - baseline) * valid).to(dtype), returns.to(dtype)


def returns_and_path_energy(inputs: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor]:
    """(G, W, valid) [B,R] in float64: each token's reward-to-go and its path's accumulated gradient energy,
    0 on padding, and the valid tokens (read from the old-log-prob pass's statistics)."""
    if inputs.old_log_probs is None or inputs.sum_pi_squared is None:
        raise ValueError(
            "advantage estimators 'optimal_token_baseline' and 'tir_optimal_token_baseline' need the old-log-prob "
            "pass's per-token statistics (AdvantageInputs.old_log_probs and sum_pi_squared)"
        )
    valid = inputs.response_mask.bool()
    mask = valid.to(torch.float64)
    rewards = torch.where(valid, inputs.token_rewards.to(torch.float64), 0.0)
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    energy = 1 - 2 * inputs.old_log_probs.to(torch.float64).exp() + inputs.sum_pi_squared.to(torch.float64)
    if inputs.rollout_is_weights is not None:
        energy = energy * inputs.rollout_is_weights.to(torch.float64) ** 2
    path_energy = torch.where(valid, energy, 0.0).cumsum(-1) * mask  # padding may hold anything, even inf
    return returns, path_energy, valid


def group_baseline(returns: Tensor, path_energy: Tensor, valid: Tensor, group_ids: Tensor) -> Tensor:
    """B [B,R]: per group and column, sum_i G_i W_i / sum_i W_i over the group's samples valid in that column;
    0 where fewer than two are valid or no path has energy."""
    mask = valid.to(torch.float64)
    index, counts = group_index(group_ids)
    rows = index.unsqueeze(-1).expand_as(returns)
    per_group = torch.zeros(len(counts), returns.shape[1], dtype=torch.float64, device=returns.device)
    # Centre on the group's largest return at each position: equal returns then give a baseline of exactly it.
    top = torch.full_like(per_group, -torch.inf).scatter_reduce_(
        0, rows, torch.where(valid, returns, -torch.inf), "amax"
    )
    above_top = torch.where(valid, returns - top[index], 0.0)
    weighted = per_group.clone().index_add_(0, index, above_top * path_energy)
    total_energy = per_group.clone().index_add_(0, index, path_energy)
    samples_here = per_group.clone().index_add_(0, index, mask)
    spread = weighted / torch.where(total_energy > 0, total_energy, 1.0)
    return torch.where((samples_here > 1) & (total_energy > 0), top + spread, 0.0)[index]
