"""GDPO's advantage: each reward component normalised within its group on its own, then weighted, summed and
whitened over the batch.

Registered as ``gdpo`` (verl's name) in ``ADV_ESTIMATORS``; docs/algorithms.md gives the formula. Its input is
each sample's reward components (``AdvantageInputs.reward_components``): the keys of the dict the reward function
returns that ``algorithm.gdpo_reward_keys`` names, which the run's Algorithm asks the scoring stage for
(rlkit.core.algos.needs: ``reward_components``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs, group_centred, masked_whiten


def gdpo(
    inputs: AdvantageInputs,
    *,
    norm_adv_by_std: bool,
    gdpo_reward_weights: Sequence[float] | None,
    eps: float,
    **_: object,
) -> tuple[Tensor, Tensor]:
    """Group reward-Decoupled normalisation Policy Optimization (Liu et al. 2026, *GDPO: Group reward-Decoupled
    Normalization Policy Optimization for Multi-reward RL Optimization*, arXiv 2601.05242).

    With r_i^k the k-th reward component of sample i (K components, weights w_k):
        a_i^k = (r_i^k - mean_G(r^k)) / (std_G(r^k) + eps)      (norm_adv_by_std=False: r_i^k - mean_G(r^k))
        A_i = whiten(sum_k w_k a_i^k)                           on every valid token; returns = A.
    GRPO normalises the sum of the components, so a component with a large spread drowns the others and
    different combinations of component values collapse into one advantage; GDPO normalises each one first.
    std is unbiased; whiten is over the batch's valid tokens (token-weighted, as the other estimators' whitening).
    Options (verl's names): `gdpo_reward_keys` (which components, read by the scoring stage),
    `gdpo_reward_weights` (w, default 1 each), `norm_adv_by_std` (verl: `norm_adv_by_std_in_grpo`).

    As verl's ``compute_gdpo_outcome_advantage``: a group of one sample has mean 0 and std 1. Differences: each
    component is centred exactly (float64, less the group's first value, as rlkit's grpo), so a component that
    is constant within a group contributes exactly 0 there, where verl's float32 statistics leave a residue.
    """
    if inputs.reward_components is None:
        raise ValueError(
            "advantage estimator 'gdpo' needs each sample's reward components (AdvantageInputs."
            "reward_components, the keys algorithm.gdpo_reward_keys names)"
        )
    components = inputs.reward_components.to(torch.float64)
    count = components.shape[-1]
    weights = list(gdpo_reward_weights) if gdpo_reward_weights is not None else [1.0] * count
    if len(weights) != count:
        raise ValueError(f"gdpo has {count} reward components but {len(weights)} weights (gdpo_reward_weights)")
    total = torch.zeros(len(components), dtype=torch.float64, device=components.device)
    for k, weight in enumerate(weights):
        centred, std, _ = group_centred(components[:, k], inputs.group_ids)
        total += weight * (centred / (std + eps) if norm_adv_by_std else centred)
    mask = inputs.response_mask.to(torch.float64)
    advantages = masked_whiten(total.unsqueeze(-1) * mask, mask).to(inputs.token_rewards.dtype)
    return advantages, advantages
