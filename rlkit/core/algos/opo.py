"""OPO's advantage: each score minus its group's length-weighted mean score.

Registered as ``opo`` (verl's name) in ``ADV_ESTIMATORS``; docs/algorithms.md gives the formula.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs, group_index, shift_by_group_first


def opo(inputs: AdvantageInputs, **_: object) -> tuple[Tensor, Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, *On-Policy RL with Optimal Reward Baseline*,
    arXiv 2505.23585): A_i = s_i - b_G with b_G = sum_{j in G} l_j s_j / sum_{j in G} l_j, l_j the number of
    valid tokens of sample j.

    The variance-minimising baseline of a sequence-level reward is E[|grad log pi(y)|^2 s] / E[|grad log pi(y)|^2];
    the paper takes the squared gradient norm to grow with the response's length, so longer samples weigh more
    in the baseline. No hyper-parameters. Returns = advantages; the value goes on every valid token.

    As verl: a group of one sample has baseline 0 (its advantage is its score). The weighted mean is taken of
    the scores less the group's first score, in float64, so a group of equal scores gets exactly 0. A group
    whose samples have no valid token at all gets baseline 0 (verl divides 0 by 0); none of its tokens is valid.
    """
    mask = inputs.response_mask.to(inputs.token_rewards.dtype)
    scores = (inputs.token_rewards * mask).sum(-1).to(torch.float64)
    lengths = mask.sum(-1).to(torch.float64)
    index, counts = group_index(inputs.group_ids)
    shifted = shift_by_group_first(scores, index, counts)
    per_group = torch.zeros(len(counts), dtype=torch.float64, device=scores.device)
    weighted = per_group.clone().index_add_(0, index, lengths * shifted)
    total_length = per_group.clone().index_add_(0, index, lengths)
    shifted_baseline = weighted / total_length.clamp(min=1)  # 0 / 1 for a group without a valid token
    seq_adv = torch.where(counts[index] > 1, shifted - shifted_baseline[index], scores)
    adv = seq_adv.to(mask.dtype).unsqueeze(-1) * mask
    return adv, adv
