"""DAPO's reward shaping and batch filtering (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale")."""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.advantages import group_index


def overlong_penalty(
    response_lengths: Tensor,
    *,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """Soft overlong punishment ``[B]``, to be added to each sequence's score.

    With L = max_response_length and buffer b: 0 for len <= L - b, then linear from 0 down to
    -penalty_factor at len = L, and -penalty_factor beyond (the paper's third case). Truncated
    answers are then penalised gradually instead of by a cliff that also hits near-misses.
    """
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(
            f"buffer_length must be in (0, max_response_length={max_response_length}], got {buffer_length}"
        )
    excess = (response_lengths - (max_response_length - buffer_length)).clamp(0, buffer_length)
    return -penalty_factor * excess.to(torch.get_default_dtype()) / buffer_length


def groups_with_signal(scores: Tensor, group_ids: Tensor) -> Tensor:
    """``[B]`` bool: True where the sequence's group has scores that are not all equal.

    DAPO's dynamic sampling drops groups whose samples all scored the same: their group-relative
    advantages are all 0, so they add no gradient but still dilute the batch. A group of one
    sample is kept, as in verl: with no peers its advantage is its raw score (see grpo/rloo).
    """
    scores = scores.double()  # integer scores are fine too; -inf/inf fills need a float dtype
    index, counts = group_index(group_ids)
    num_groups = counts.numel()
    high = scores.new_full((num_groups,), float("-inf")).scatter_reduce(0, index, scores, "amax")
    low = scores.new_full((num_groups,), float("inf")).scatter_reduce(0, index, scores, "amin")
    keep = (high > low) | (counts == 1)
    return keep[index]
