"""Advantage estimators against hand-computed numbers (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.advantages import ADV_ESTIMATORS, AdvantageInputs, compute_advantages

EPS = 1e-6


def seq_inputs(scores: list[float], lengths: list[int], group_ids: list[int], r: int = 3) -> AdvantageInputs:
    """Each score on the last valid token; 9.0 on every padding slot, which must be ignored."""
    rewards = torch.full((len(scores), r), 9.0)
    mask = torch.zeros(len(scores), r)
    for i, (score, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, :n] = 0.0
        rewards[i, n - 1] = score
        mask[i, :n] = 1.0
    return AdvantageInputs(rewards, mask, torch.tensor(group_ids))


def per_seq(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sequence-level advantage: the value on the first token; also checks it is broadcast."""
    for row, m in zip(adv, mask, strict=True):
        assert torch.allclose(row[m.bool()], row[0].expand(int(m.sum())))
    return adv[:, 0]


def test_grpo_groups_by_id_with_unbiased_std() -> None:
    # Ids 7 and 3, interleaved. Group 7 = seqs 0,2,4, scores 1,0,2: mean 1,
    # var = (0 + 1 + 1) / (3-1) = 1, std 1 -> advantages 0, -1, 1.
    # Group 3 = seqs 1,3, scores 3,1: mean 2, var = (1 + 1) / 1 = 2 -> +-1/sqrt(2).
    inp = seq_inputs([1.0, 3.0, 0.0, 1.0, 2.0], [3, 1, 2, 3, 1], [7, 3, 7, 3, 7])
    adv, ret = compute_advantages("grpo", inp)
    s2 = math.sqrt(2.0)
    expected = torch.tensor([0.0, 1 / (s2 + EPS), -1 / (1 + EPS), -1 / (s2 + EPS), 1 / (1 + EPS)])
    assert torch.allclose(per_seq(adv, inp.response_mask), expected, atol=1e-6)
    assert torch.equal(ret, adv)


def test_dr_grpo_skips_std() -> None:
    # Same groups as above without the std division: group 7 -> 0, -1, 1; group 3 -> 3-2, 1-2.
    inp = seq_inputs([1.0, 3.0, 0.0, 1.0, 2.0], [3, 1, 2, 3, 1], [7, 3, 7, 3, 7])
    adv, _ = compute_advantages("grpo", inp, norm_adv_by_std=False)
    assert torch.allclose(per_seq(adv, inp.response_mask), torch.tensor([0.0, 1.0, -1.0, -1.0, 1.0]))


def test_grpo_singleton_group_keeps_its_score() -> None:
    # Group 0 = scores 1,3: mean 2, std sqrt(2). Group 5 is alone: mean 0, std 1 -> 4/(1+eps).
    inp = seq_inputs([1.0, 3.0, 4.0], [2, 2, 1], [0, 0, 5])
    adv, _ = compute_advantages("grpo", inp)
    s2 = math.sqrt(2.0)
    expected = torch.tensor([-1 / (s2 + EPS), 1 / (s2 + EPS), 4 / (1 + EPS)])
    assert torch.allclose(per_seq(adv, inp.response_mask), expected, atol=1e-6)


def test_rloo_leave_one_out_baseline() -> None:
    # Group 1 = scores 1,0,2: baselines (0+2)/2=1, (1+2)/2=1.5, (1+0)/2=0.5 -> 0, -1.5, 1.5
    # (= 3/2 * (s - mean 1)). Group 2 = scores 3,1 -> 3-1=2, 1-3=-2. Group 8 alone -> raw 5.
    inp = seq_inputs([1.0, 3.0, 0.0, 2.0, 1.0, 5.0], [1, 2, 3, 1, 2, 3], [1, 2, 1, 1, 2, 8])
    adv, ret = compute_advantages("rloo", inp)
    expected = torch.tensor([0.0, 2.0, -1.5, 1.5, -2.0, 5.0])
    assert torch.allclose(per_seq(adv, inp.response_mask), expected)
    assert torch.equal(ret, adv)


def test_remax_subtracts_greedy_baseline() -> None:
    # Scores 1, 0 on the last token with greedy scores 0.5, 0.5 -> 0.5, -0.5 on every token; returns are the
    # reward-to-go, the score itself.
    inp = seq_inputs([1.0, 0.0], [3, 2], [0, 1])
    inp.baseline_scores = torch.tensor([0.5, 0.5])
    adv, ret = compute_advantages("remax", inp)
    assert torch.allclose(per_seq(adv, inp.response_mask), torch.tensor([0.5, -0.5]))
    assert torch.equal(ret, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_remax_with_kl_in_the_reward_uses_each_tokens_reward_to_go() -> None:
    # Token rewards: sequence 0 = KL penalties -0.1, -0.2 then score 1 - 0.3 on its last token; sequence 1 =
    # -0.1 then 0.5 - 0.2, one padding token. Reward-to-go: [0.4, 0.5, 0.7] and [0.2, 0.3, 0]; greedy scores
    # 0.25, 0.5 -> advantages [0.15, 0.25, 0.45] and [-0.3, -0.2, 0] (verl's compute_remax_outcome_advantage).
    inp = AdvantageInputs(
        token_rewards=torch.tensor([[-0.1, -0.2, 0.7], [-0.1, 0.3, 0.0]], dtype=torch.float64),
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
        group_ids=torch.tensor([0, 1]),
        baseline_scores=torch.tensor([0.25, 0.5]),
    )
    adv, ret = compute_advantages("remax", inp)
    assert torch.allclose(ret, torch.tensor([[0.4, 0.5, 0.7], [0.2, 0.3, 0.0]], dtype=torch.float64))
    assert torch.allclose(adv, torch.tensor([[0.15, 0.25, 0.45], [-0.3, -0.2, 0.0]], dtype=torch.float64))


def test_reinforce_plus_plus_discounts_then_whitens_batch() -> None:
    # gamma = 0.5. Seq 0 rewards [1, 0, 2]: G = [1 + .5*1, 0 + .5*2, 2] = [1.5, 1, 2].
    # Seq 1 rewards [0, 4 | pad]: G = [0 + .5*4, 4] = [2, 4].
    # Valid G: 1.5, 1, 2, 2, 4: mean 10.5/5 = 2.1; deviations -.6, -1.1, -.1, -.1, 1.9;
    # squares sum .36 + 1.21 + .01 + .01 + 3.61 = 5.2; unbiased var 5.2/4 = 1.3.
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = compute_advantages(
        "reinforce_plus_plus", AdvantageInputs(rewards, mask, torch.tensor([0, 0])), gamma=0.5
    )
    assert torch.allclose(ret, torch.tensor([[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]]))
    sd = math.sqrt(1.3)
    expected = torch.tensor([[-0.6 / sd, -1.1 / sd, -0.1 / sd], [-0.1 / sd, 1.9 / sd, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_reinforce_plus_plus_baseline_group_mean_then_batch_whiten() -> None:
    # Group 1 = scores 2 (2 tokens), 0 (1 token): mean 1 -> 1, -1. Group 2 alone: mean 0 -> 5 (2 tokens).
    # Tokens 1, 1, -1, 5, 5: mean 11/5 = 2.2; deviations -1.2, -1.2, -3.2, 2.8, 2.8;
    # squares 1.44 + 1.44 + 10.24 + 7.84 + 7.84 = 28.8; unbiased var 28.8/4 = 7.2.
    inp = seq_inputs([2.0, 0.0, 5.0], [2, 1, 2], [1, 1, 2])
    adv, ret = compute_advantages("reinforce_plus_plus_baseline", inp)
    sd = math.sqrt(7.2)
    expected = torch.tensor([[-1.2, -1.2, 0.0], [-3.2, 0.0, 0.0], [2.8, 2.8, 0.0]]) / sd
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.equal(ret, adv)


def test_gae_recursion_and_whitening() -> None:
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72); V and A are 0 after the last valid token.
    # Seq 0: r [0, 0, 1], V [.5, .4, .6]
    #   t2: delta = 1 - .6 = .4;              A2 = .4
    #   t1: delta = .9*.6 - .4 = .14;          A1 = .14 + .72*.4 = .428
    #   t0: delta = .9*.4 - .5 = -.14;         A0 = -.14 + .72*.428 = .16816
    #   returns = A + V = [.66816, .828, 1.0]
    # Seq 1: r [0, 2 | pad], V [1, .5 | 7 garbage]
    #   t1: delta = 2 - .5 = 1.5;              A1 = 1.5
    #   t0: delta = .9*.5 - 1 = -.55;          A0 = -.55 + .72*1.5 = .53
    #   returns = [1.53, 2.0, 0]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.6], [1.0, 0.5, 7.0]])
    inp = AdvantageInputs(rewards, mask, torch.tensor([0, 1]), values=values)
    adv, ret = compute_advantages("gae", inp, gamma=0.9, lam=0.8)
    assert torch.allclose(ret, torch.tensor([[0.66816, 0.828, 1.0], [1.53, 2.0, 0.0]]), atol=1e-6)
    # Whitening over the 5 valid raw advantages (unbiased std, like torch.std).
    raw = torch.tensor([0.16816, 0.428, 0.4, 0.53, 1.5])
    white = (raw - raw.mean()) / raw.std()
    expected = torch.tensor([[white[0], white[1], white[2]], [white[3], white[4], 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def full_inputs() -> AdvantageInputs:
    """A batch every estimator accepts, with garbage (1e3) in every padding slot."""
    rewards = torch.tensor([[0.0, 1.0, 1e3], [0.5, 1e3, 1e3], [0.0, 0.0, 2.0], [1.0, 1e3, 1e3]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    values = torch.where(mask, torch.tensor(0.3), torch.tensor(1e3))
    old_log_probs = torch.where(mask, torch.tensor(-0.5), torch.tensor(1e3))  # exp(1e3) = inf on padding
    sum_pi_squared = torch.where(mask, torch.tensor(0.6), torch.tensor(1e3))
    components = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]])  # per sequence: no padding
    return AdvantageInputs(
        rewards, mask, torch.tensor([5, 5, 2, 2]), values, torch.tensor([0.2, 0.2, 1.0, 1.0]),
        old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, reward_components=components,
    )


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_padding_is_exactly_zero(name: str) -> None:
    inp = full_inputs()
    adv, ret = compute_advantages(name, inp, gamma=0.9, lam=0.95)
    pad = ~inp.response_mask
    assert torch.all(adv[pad] == 0) and torch.all(ret[pad] == 0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


def test_registry_names() -> None:
    assert ADV_ESTIMATORS.names() == sorted(
        ["gae", "grpo", "rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk", "opo",
         "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"]
    )


def test_missing_inputs_raise_value_error() -> None:
    inp = full_inputs()
    inp.values = None
    inp.baseline_scores = None
    inp.old_log_probs = None
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", inp)
    with pytest.raises(ValueError, match="baseline_scores"):
        compute_advantages("remax", inp)
    with pytest.raises(ValueError, match="old_log_probs"):
        compute_advantages("optimal_token_baseline", inp)


def test_unknown_estimator_suggests_closest() -> None:
    with pytest.raises(KeyError, match="did you mean 'grpo'"):
        compute_advantages("grp0", full_inputs())


# Fractional scores that float32 cannot sum exactly: 16 copies of each do not add up to 16x.
CONSTANT_SCORES = [0.1, 0.7, 1 / 3, 0.123456, 2.2, -0.9]


def groups_of_16(scores_per_group: list[list[float]]) -> AdvantageInputs:
    """One group of 16 one-token samples per list, group ids 0, 1, ..."""
    flat = [s for group in scores_per_group for s in group]
    ids = [g for g, group in enumerate(scores_per_group) for _ in group]
    return seq_inputs(flat, [1] * len(flat), ids, r=1)


@pytest.mark.parametrize(
    ("name", "norm_adv_by_std", "mixed_expected"),
    [
        # Mixed group: 0.1 x15 and 0.9: mean .15, deviations -.05 (x15) and .75,
        # unbiased var (15 * .0025 + .5625) / 15 = .04, std .2.
        ("grpo", True, [-0.05 / (0.2 + EPS), 0.75 / (0.2 + EPS)]),
        ("grpo", False, [-0.05, 0.75]),  # Dr.GRPO: no std division
        ("rloo", True, [-0.05 * 16 / 15, 0.75 * 16 / 15]),  # n/(n-1) (s - mean)
    ],
)
def test_group_of_equal_fractional_scores_gets_exactly_zero(
    name: str, norm_adv_by_std: bool, mixed_expected: list[float]
) -> None:
    # A group whose 16 scores are all equal carries no signal: its advantage must be exactly 0,
    # not the +-0.1 that float32 rounding of (s - mean) / (std + eps) with std ~1e-8 makes.
    groups = [[s] * 16 for s in CONSTANT_SCORES] + [[0.1] * 15 + [0.9]]
    adv, _ = compute_advantages(name, groups_of_16(groups), norm_adv_by_std=norm_adv_by_std)
    constant = adv[: 16 * len(CONSTANT_SCORES), 0]
    assert torch.equal(constant, torch.zeros_like(constant))
    mixed = adv[16 * len(CONSTANT_SCORES) :, 0]
    expected = torch.tensor([mixed_expected[0]] * 15 + [mixed_expected[1]])
    assert torch.allclose(mixed, expected, atol=1e-6)


def test_reinforce_plus_plus_baseline_equal_fractional_scores_are_zero() -> None:
    # Every group constant: the group-centred scores are exactly 0, and whitening keeps 0.
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", groups_of_16([[s] * 16 for s in CONSTANT_SCORES]))
    assert torch.equal(adv, torch.zeros_like(adv))
