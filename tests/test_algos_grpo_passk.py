"""grpo_passk (rlkit/core/algos/grpo_passk.py) against hand-computed numbers (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch
from test_algos_advantages import CONSTANT_SCORES, groups_of_16, seq_inputs

from rlkit.core.algos.advantages import compute_advantages

EPS = 1e-6


def test_only_the_best_sample_of_each_group_gets_its_margin_over_the_runner_up() -> None:
    # Group 4 = seqs 0, 2, 3, 5 with scores 1, 0, 3, 2: best 3 (seq 3), runner-up 2 -> margin 1. Its unbiased
    # std: mean 1.5, squared deviations .25 + 2.25 + 2.25 + .25 = 5, var 5/3 -> margin / (sqrt(5/3) + eps).
    # Group 1 = seqs 1, 4 with scores 0.5, 2.5: best 2.5 (seq 4), margin 2; std = |2.5 - 0.5| / sqrt(2) = sqrt(2).
    inp = seq_inputs([1.0, 0.5, 0.0, 3.0, 2.5, 2.0], [2, 3, 1, 3, 2, 1], [4, 1, 4, 4, 1, 4])
    adv, ret = compute_advantages("grpo_passk", inp)
    expected = [0.0, 0.0, 0.0, 1 / (math.sqrt(5 / 3) + EPS), 2 / (math.sqrt(2) + EPS), 0.0]
    assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-6)
    # On every valid token of the credited sequence (seq 3: 3 tokens; seq 4: 2 of 3), 0 on padding.
    assert adv[3].tolist() == pytest.approx([expected[3]] * 3) and adv[4, 2] == 0.0
    assert torch.equal(ret, adv)


def test_without_the_std_the_margin_is_the_papers_leave_one_out_advantage() -> None:
    # max_j s_j - max_{j != i} s_j: for the best (seq 3) 3 - 2 = 1, for seq 4 2.5 - 0.5 = 2, every other 0.
    inp = seq_inputs([1.0, 0.5, 0.0, 3.0, 2.5, 2.0], [2, 3, 1, 3, 2, 1], [4, 1, 4, 4, 1, 4])
    adv, _ = compute_advantages("grpo_passk", inp, norm_adv_by_std=False)
    assert adv[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0, 2.0, 0.0]


def test_binary_rewards_credit_a_lone_solver_and_nothing_once_two_solve() -> None:
    # Group 0 = 1, 0, 0, 0: margin 1; mean .25, squared deviations .5625 + 3 x .0625 = .75, var .25, std .5.
    # Group 1 = 0, 1, 1, 0: two solvers, the runner-up also scores 1 -> margin 0 for every sample.
    # Group 2 = 0, 0, 0, 0: nothing solved -> 0.
    inp = seq_inputs([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1] * 12,
                     [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], r=1)
    adv, _ = compute_advantages("grpo_passk", inp)
    assert adv[:, 0].tolist() == pytest.approx([1 / (0.5 + EPS)] + [0.0] * 11)


def test_a_group_of_equal_scores_gets_exactly_zero() -> None:
    # The best ties with the runner-up: margin exactly 0, whatever float32 makes of the std.
    adv, _ = compute_advantages("grpo_passk", groups_of_16([[s] * 16 for s in CONSTANT_SCORES]))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_a_group_of_one_sample_has_no_runner_up() -> None:
    with pytest.raises(ValueError, match="at least 2 samples"):
        compute_advantages("grpo_passk", seq_inputs([1.0, 0.0, 2.0], [1, 1, 1], [0, 0, 5], r=1))
