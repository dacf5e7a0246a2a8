"""tir_optimal_token_baseline (rlkit/core/algos/tir_optimal_token_baseline.py) against hand-computed numbers: the
Optimal Token Baseline with a group's samples compared at the policy's k-th own token, across the holes a
multi-turn episode's tool tokens leave in the mask."""

from __future__ import annotations

import torch
from test_algos_advantages import CONSTANT_SCORES
from test_algos_optimal_token_baseline import otb_inputs

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages
from rlkit.core.algos.algorithm import Algorithm
from rlkit.recipes.loader import load_config

G = 1e3  # garbage in every masked slot (padding and tool tokens): never read


def tir_inputs() -> AdvantageInputs:
    """R = 4; a 0 in the mask before a 1 is a tool token. Per valid token pi_t and sum_v pi_v^2, so
    w_t = 1 - 2 pi_t + sum pi^2, and W its running sum over the sample's own tokens:
      group 0: seq 0 mask [1, 0, 0, 1], pi .5 .5 with sum .5 -> w .5 .5 -> W .5, 1; scores 1 on position 3.
               seq 1 mask [1, 1, 0, 0], pi .25 .25 with sum .25 -> w .75 .75 -> W .75, 1.5; scores 0.
      group 5: seq 2 mask [1, 1, 1, 0], pi .5 x3 with sum .5 -> W .5, 1, 1.5; scores 2 on position 2.
               seq 3 mask [1, 0, 1, 0], pi .5 .25 with sums .5 .25 -> w .5 .75 -> W .5, 1.25; scores 1 on position 2.
      group 9: seq 4 mask [0, 1, 1, 0], rewards -.1 then .5 (in-reward KL); seq 5 has no valid token.
    """
    pi = torch.tensor([[0.5, G, G, 0.5], [0.25, 0.25, G, G], [0.5, 0.5, 0.5, G], [0.5, G, 0.25, G],
                       [G, 0.5, 0.5, G], [G, G, G, G]])
    sum_sq = pi.clone()  # in this batch each valid token's sum of squared probabilities equals its pi_t
    rewards = torch.tensor([[0.0, G, G, 1.0], [0.0, 0.0, G, G], [0.0, 0.0, 2.0, G], [0.0, G, 1.0, G],
                            [G, -0.1, 0.5, G], [G, G, G, G]])
    mask = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]])
    return AdvantageInputs(rewards, mask, torch.tensor([0, 0, 5, 5, 9, 9]), old_log_probs=pi.log(),
                           sum_pi_squared=sum_sq)


def test_the_samples_are_compared_at_their_kth_own_token() -> None:
    # Returns (reward-to-go over valid tokens, 0 on masked slots): seq 0 [1, 0, 0, 1], seq 1 0, seq 2 [2, 2, 2, 0],
    # seq 3 [1, 0, 1, 0], seq 4 [0, .4, .5, 0], seq 5 0.
    # Group 0, own tokens k = 0, 1 (seq 0 at positions 0, 3; seq 1 at 0, 1):
    #   B_0 = (1 x .5 + 0 x .75) / 1.25 = .4 ; B_1 = (1 x 1 + 0 x 1.5) / 2.5 = .4
    #   -> seq 0 [.6, 0, 0, .6], seq 1 [-.4, -.4, 0, 0].
    # Group 5 (seq 2 at 0, 1, 2; seq 3 at 0, 2): B_0 = (2 x .5 + 1 x .5) / 1 = 1.5 ; B_1 = (2 x 1 + 1 x 1.25) / 2.25
    #   = 13/9 ; k = 2 only seq 2 (the unique longest's tail): B = 0 -> seq 2 [.5, 5/9, 2, 0], seq 3 [-.5, 0, -4/9, 0].
    # Group 9: seq 5 has no token, so seq 4 is alone: B = 0 -> its returns.
    adv, ret = compute_advantages("tir_optimal_token_baseline", tir_inputs())
    expected_returns = [[1.0, 0, 0, 1], [0, 0, 0, 0], [2, 2, 2, 0], [1, 0, 1, 0], [0, 0.4, 0.5, 0], [0, 0, 0, 0]]
    assert torch.allclose(ret, torch.tensor(expected_returns))
    expected = [[0.6, 0, 0, 0.6], [-0.4, -0.4, 0, 0], [0.5, 5 / 9, 2, 0], [-0.5, 0, -4 / 9, 0], [0, 0.4, 0.5, 0],
                [0, 0, 0, 0]]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-6)


def test_by_position_the_same_batch_compares_a_tool_turn_with_the_other_samples_tokens() -> None:
    # optimal_token_baseline on it: position 1 holds only seq 1's token in group 0 (B = 0 -> 0), position 3 only
    # seq 0's (B = 0 -> its return 1); in group 5, position 1 holds only seq 2's (B = 0 -> 2), position 2 both:
    # B = (2 x 1.5 + 1 x 1.25) / 2.75 = 17/11 -> seq 2 5/11, seq 3 -6/11.
    adv, _ = compute_advantages("optimal_token_baseline", tir_inputs())
    assert torch.allclose(adv[:4], torch.tensor([[0.6, 0, 0, 1], [-0.4, 0, 0, 0], [0.5, 2, 5 / 11, 0],
                                                 [-0.5, 0, -6 / 11, 0]]), atol=1e-6)


def test_without_holes_it_is_the_optimal_token_baseline() -> None:
    tir, tir_returns = compute_advantages("tir_optimal_token_baseline", otb_inputs())
    otb, otb_returns = compute_advantages("optimal_token_baseline", otb_inputs())
    assert torch.equal(tir, otb) and torch.equal(tir_returns, otb_returns)


def test_a_group_of_equal_returns_gets_exactly_zero_whatever_its_holes() -> None:
    # 16 two-token samples of one fractional score per group, each with its tool token in one of 3 places, path
    # energies differing by sample: the weighted mean of G - max G is 0.
    scores = torch.tensor([s for s in CONSTANT_SCORES for _ in range(16)])
    masks = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1]])[torch.arange(len(scores)) % 3]
    last = masks.cumsum(-1).argmax(-1)
    rewards = torch.zeros(len(scores), 3)
    rewards[torch.arange(len(scores)), last] = scores
    groups = torch.tensor([g for g in range(len(CONSTANT_SCORES)) for _ in range(16)])
    pi = torch.full_like(rewards, 0.3)
    sum_sq = 2 * pi - 1 + (torch.arange(len(scores)) % 16 + 1).unsqueeze(-1) / 10  # w = i / 10
    inp = AdvantageInputs(rewards, masks, groups, old_log_probs=pi.log(), sum_pi_squared=sum_sq)
    adv, _ = compute_advantages("tir_optimal_token_baseline", inp)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_the_algorithm_asks_for_the_old_log_prob_pass_statistics() -> None:
    config = load_config("grpo-demo", ["model.path=some/model", "data.synthetic_task=echo",
                                       "algorithm.adv_estimator=tir_optimal_token_baseline"])
    algorithm = Algorithm.from_config(config)
    assert (algorithm.token_stats, algorithm.old_log_probs, algorithm.groups) == (True, "trainer", True)
