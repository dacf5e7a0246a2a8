"""opo (rlkit/core/algos/opo.py) against hand-computed numbers (arithmetic in the comments)."""

from __future__ import annotations

import pytest
import torch
from test_algos_advantages import CONSTANT_SCORES, seq_inputs

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages


def test_the_baseline_is_the_length_weighted_mean_score_of_the_group() -> None:
    # Group 0 = seqs 0, 2, 4: scores 1, 0, 1 with 2, 3, 1 tokens: b = (2x1 + 3x0 + 1x1) / 6 = 0.5
    #   -> 0.5, -0.5, 0.5 (the plain group mean would be 2/3).
    # Group 5 = seqs 1, 3: scores 2, 4 with 3, 1 tokens: b = (3x2 + 1x4) / 4 = 2.5 -> -0.5, 1.5.
    # Group 9 = seq 5 alone: baseline 0, advantage its score 3.
    inp = seq_inputs([1.0, 2.0, 0.0, 4.0, 1.0, 3.0], [2, 3, 3, 1, 1, 2], [0, 5, 0, 5, 0, 9])
    adv, ret = compute_advantages("opo", inp)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, -0.5, 1.5, 0.5, 3.0])
    # The same value on every valid token, 0 on padding (9.0 garbage there is not read).
    expected_rows = [[0.5, 0.5, 0.0], [-0.5] * 3, [-0.5] * 3, [1.5, 0.0, 0.0], [0.5, 0.0, 0.0], [3.0, 3.0, 0.0]]
    assert torch.allclose(adv, torch.tensor(expected_rows))
    assert torch.equal(ret, adv)


def test_equal_lengths_give_the_group_mean_baseline() -> None:
    # Scores 1, 0, 0, 3, all 2 tokens long: b = mean = 1 -> 0, -1, -1, 2 (Dr.GRPO's advantage).
    inp = seq_inputs([1.0, 0.0, 0.0, 3.0], [2, 2, 2, 2], [7, 7, 7, 7])
    adv, _ = compute_advantages("opo", inp)
    assert adv[:, 0].tolist() == [0.0, -1.0, -1.0, 2.0]


def test_a_group_of_equal_scores_gets_exactly_zero_whatever_the_lengths() -> None:
    # 16 samples of one fractional score, lengths 1..3: sum(l s) / sum(l) is not s in float32, but the
    # weighted mean is taken of s - s_first = 0.
    scores = [s for s in CONSTANT_SCORES for _ in range(16)]
    lengths = [1 + i % 3 for i in range(len(scores))]
    groups = [g for g in range(len(CONSTANT_SCORES)) for _ in range(16)]
    adv, _ = compute_advantages("opo", seq_inputs(scores, lengths, groups))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_a_response_without_a_valid_token_weighs_nothing() -> None:
    # Group 0: seq 0 has no valid token (length 0: weight 0, its 5.0s are not read), seq 1 scores 2 on
    # 2 tokens, seq 2 scores 0 on 1 token: b = (0 + 2x2 + 1x0) / 3 = 4/3 -> seq 1: 2/3, seq 2: -4/3.
    # Group 1: both responses empty: baseline 0, and no valid token to carry an advantage.
    rewards = torch.tensor([[5.0, 5.0], [0.0, 2.0], [0.0, 7.0], [1.0, 1.0], [1.0, 1.0]])
    mask = torch.tensor([[0, 0], [1, 1], [1, 0], [0, 0], [0, 0]])
    adv, _ = compute_advantages("opo", AdvantageInputs(rewards, mask, torch.tensor([0, 0, 0, 1, 1])))
    assert torch.allclose(adv, torch.tensor([[0.0, 0.0], [2 / 3, 2 / 3], [-4 / 3, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    assert torch.isfinite(adv).all()
