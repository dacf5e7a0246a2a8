"""The pass@k advantage: credit only the best sample of each group, by how much it beats the runner-up.

Registered as ``grpo_passk`` (verl's name) in ``ADV_ESTIMATORS``; docs/algorithms.md gives the formula.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs, group_centred, group_index


def grpo_passk(inputs: AdvantageInputs, *, norm_adv_by_std: bool, eps: float, **_: object) -> tuple[Tensor, Tensor]:
    """Pass@k policy gradient with a leave-one-out baseline (Tang et al. 2025, *Optimizing Language Models for
    Inference Time Objectives using Reinforcement Learning*, arXiv 2503.19595), with k the group's size.

    The objective is the expected best score of the group, E[max_j s_j]. Its leave-one-out estimator gives
    sample i the advantage max_j s_j - max_{j != i} s_j: zero for every sample but the group's best, which gets
    A = s_max - s_second (the best and second-best scores; 0 when the best is tied). With ``norm_adv_by_std``
    (verl's ``norm_adv_by_std_in_grpo``, GRPO-style and verl's default) A is divided by (group std + ``eps``),
    the std unbiased; ``norm_adv_by_std=False`` keeps the paper's plain difference. The value goes on every
    valid token of the best sample; returns = advantages.

    Among tied best samples the first in batch order is the one credited (its advantage is 0 either way).
    A group of one sample has no runner-up: ValueError, as verl raises (the config asks for rollout.n >= 2).
    """
    mask = inputs.response_mask.to(inputs.token_rewards.dtype)
    scores = (inputs.token_rewards * mask).sum(-1).to(torch.float64)
    index, counts = group_index(inputs.group_ids)
    if bool((counts < 2).any()):
        raise ValueError("advantage estimator 'grpo_passk' needs at least 2 samples in every group (rollout.n >= 2)")
    lowest = torch.full((len(counts),), -torch.inf, dtype=scores.dtype, device=scores.device)
    best = lowest.clone().scatter_reduce_(0, index, scores, "amax")
    positions = torch.arange(len(scores), device=scores.device)
    at_best = torch.where(scores == best[index], positions, len(scores))
    best_position = torch.full_like(counts, len(scores)).scatter_reduce_(0, index, at_best, "amin")
    others = scores.clone()
    others[best_position] = -torch.inf  # the runner-up: the best of the group once its best sample is left out
    second = lowest.clone().scatter_reduce_(0, index, others, "amax")
    margin = best - second
    if norm_adv_by_std:
        _, std, _ = group_centred(scores, inputs.group_ids)
        margin = margin / (std[best_position] + eps)
    seq_adv = torch.zeros_like(scores)
    seq_adv[best_position] = margin
    adv = seq_adv.to(mask.dtype).unsqueeze(-1) * mask
    return adv, adv
