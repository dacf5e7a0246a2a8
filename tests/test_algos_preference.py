"""DPO / cDPO / robust DPO / IPO (per token and on sums) / length-normalised DPO losses and implicit rewards against
hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.preference import PREFERENCE_METRICS, PairLogProbs, pair_log_probs, preference_loss

# Two pairs.
#   pair 0: chosen  log-ratio  -10 - (-12) = +2,  rejected log-ratio -15 - (-14) = -1,  h = 2 - (-1) = 3
#   pair 1: chosen  log-ratio   -5 - (-4)  = -1,  rejected log-ratio  -6 - (-7)  = +1,  h = -1 - 1 = -2
# token counts: chosen 4 and 5, rejected 2 and 1.


def pairs(requires_grad: bool = False) -> PairLogProbs:
    policy_chosen = torch.tensor([-10.0, -5.0], dtype=torch.float64, requires_grad=requires_grad)
    return PairLogProbs(
        policy_chosen=policy_chosen,
        policy_rejected=torch.tensor([-15.0, -6.0], dtype=torch.float64),
        reference_chosen=torch.tensor([-12.0, -4.0], dtype=torch.float64),
        reference_rejected=torch.tensor([-14.0, -7.0], dtype=torch.float64),
        chosen_tokens=torch.tensor([4.0, 5.0], dtype=torch.float64),
        rejected_tokens=torch.tensor([2.0, 1.0], dtype=torch.float64),
    )


def test_sigmoid_dpo_loss_and_rewards() -> None:
    # beta = 0.1: loss = -log sigmoid(beta h) = log(1 + exp(-beta h))
    #   pair 0: beta h = 0.3  -> log(1 + e^-0.3) = log(1.7408182) = 0.5543552
    #   pair 1: beta h = -0.2 -> log(1 + e^0.2)  = log(2.2214028) = 0.7981389
    # rewards = beta * log-ratio: chosen (0.2, -0.1), rejected (-0.1, 0.1), margins (0.3, -0.2), accuracies (1, 0)
    loss, metrics = preference_loss(pairs(), "sigmoid", beta=0.1)
    assert loss.tolist() == pytest.approx([0.5543552, 0.7981389], abs=1e-7)
    assert tuple(metrics) == PREFERENCE_METRICS
    assert metrics["loss"].tolist() == pytest.approx([0.5543552, 0.7981389], abs=1e-7)
    assert metrics["rewards/chosen"].tolist() == pytest.approx([0.2, -0.1])
    assert metrics["rewards/rejected"].tolist() == pytest.approx([-0.1, 0.1])
    assert metrics["rewards/margins"].tolist() == pytest.approx([0.3, -0.2])
    assert metrics["rewards/accuracies"].tolist() == [1.0, 0.0]


def test_sigmoid_dpo_gradient() -> None:
    # d/d logpi(y_c) of -log sigmoid(beta h) = -beta sigmoid(-beta h)
    #   pair 0: -0.1 * sigmoid(-0.3) = -0.1 * 0.4255575 = -0.04255575
    #   pair 1: -0.1 * sigmoid(0.2)  = -0.1 * 0.5498340 = -0.05498340
    data = pairs(requires_grad=True)
    loss, _ = preference_loss(data, "sigmoid", beta=0.1)
    loss.sum().backward()
    assert data.policy_chosen.grad.tolist() == pytest.approx([-0.04255575, -0.05498340], abs=1e-8)


def test_label_smoothing_is_cdpo() -> None:
    # eps = 0.1: 0.9 * -log sigmoid(beta h) + 0.1 * -log sigmoid(-beta h); -log sigmoid(-x) = x - log sigmoid(x)
    #   pair 0: 0.9 * 0.5543552 + 0.1 * (0.3 + 0.5543552)  = 0.4989197 + 0.0854355 = 0.5843552
    #   pair 1: 0.9 * 0.7981389 + 0.1 * (-0.2 + 0.7981389) = 0.7183250 + 0.0598139 = 0.7781389
    loss, metrics = preference_loss(pairs(), "cdpo", beta=0.1, label_smoothing=0.1)
    assert loss.tolist() == pytest.approx([0.5843552, 0.7781389], abs=1e-7)
    assert metrics["rewards/margins"].tolist() == pytest.approx([0.3, -0.2])  # smoothing leaves the rewards
    # Without smoothing cdpo is sigmoid DPO.
    assert preference_loss(pairs(), "cdpo", beta=0.1)[0].tolist() == pytest.approx([0.5543552, 0.7981389], abs=1e-7)


def test_robust_dpo() -> None:
    # eps = 0.1: [0.9 * -log sigmoid(beta h) + 0.1 * log sigmoid(-beta h)] / 0.8
    #   pair 0: log sigmoid(-0.3) = -0.8543552: (0.4989197 - 0.0854355) / 0.8 = 0.5168552
    #   pair 1: log sigmoid(0.2)  = -0.5981389: (0.7183250 - 0.0598139) / 0.8 = 0.8231389
    loss, metrics = preference_loss(pairs(), "robust", beta=0.1, label_smoothing=0.1)
    assert loss.tolist() == pytest.approx([0.5168552, 0.8231389], abs=1e-7)
    assert metrics["rewards/margins"].tolist() == pytest.approx([0.3, -0.2])


def test_ipo_loss_on_per_token_log_ratios_as_trl() -> None:
    # Per-token log-ratios (as in test_length_normalized_dpo): h = 0.5 - (-0.5) = 1 and -0.2 - 1 = -1.2;
    # beta = 0.1, target 1/(2 beta) = 5: (1 - 5)^2 = 16, (-1.2 - 5)^2 = 38.44; rewards 0.1 x the per-token ratios.
    loss, metrics = preference_loss(pairs(), "ipo", beta=0.1)
    assert loss.tolist() == pytest.approx([16.0, 38.44])
    assert metrics["rewards/chosen"].tolist() == pytest.approx([0.05, -0.02])


def test_ipo_sum_loss_on_sequence_sums() -> None:
    # (h - 1/(2 beta))^2 with beta = 0.1, target 5: pair 0 (3 - 5)^2 = 4, pair 1 (-2 - 5)^2 = 49
    loss, metrics = preference_loss(pairs(), "ipo_sum", beta=0.1)
    assert loss.tolist() == pytest.approx([4.0, 49.0])
    assert metrics["rewards/chosen"].tolist() == pytest.approx([0.2, -0.1])


def test_length_normalized_dpo() -> None:
    # per-token log-ratios: pair 0 chosen 2/4 = 0.5, rejected -1/2 = -0.5, h = 1
    #                       pair 1 chosen -1/5 = -0.2, rejected 1/1 = 1, h = -1.2
    # beta = 0.5: pair 0 log(1 + e^-0.5) = log(1.6065307) = 0.4740770
    #             pair 1 log(1 + e^0.6)  = log(2.8221188) = 1.0374879
    # rewards: chosen 0.5 * (0.5, -0.2) = (0.25, -0.1), rejected 0.5 * (-0.5, 1) = (-0.25, 0.5)
    loss, metrics = preference_loss(pairs(), "length_normalized", beta=0.5)
    assert loss.tolist() == pytest.approx([0.4740770, 1.0374879], abs=1e-7)
    assert metrics["rewards/chosen"].tolist() == pytest.approx([0.25, -0.1])
    assert metrics["rewards/rejected"].tolist() == pytest.approx([-0.25, 0.5])
    assert metrics["rewards/accuracies"].tolist() == [1.0, 0.0]


def test_policy_equal_to_reference() -> None:
    # At the start of training the policy is the reference: h = 0, loss = log 2, rewards 0, and a tie
    # is not an accurate pair (accuracy 0, as TRL counts it).
    same = torch.tensor([-3.0, -7.0])
    loss, metrics = preference_loss(PairLogProbs(same, same, same, same, torch.ones(2), torch.ones(2)),
                                    "sigmoid", beta=0.1)
    assert loss.tolist() == pytest.approx([math.log(2)] * 2)
    assert metrics["rewards/accuracies"].tolist() == [0.0, 0.0]


def test_pair_log_probs_deinterleaves() -> None:
    # rows: chosen 0, rejected 0, chosen 1, rejected 1
    data = pair_log_probs(torch.tensor([-10.0, -15.0, -5.0, -6.0]), torch.tensor([-12.0, -14.0, -4.0, -7.0]),
                          torch.tensor([4, 2, 5, 1]))
    assert data.policy_chosen.tolist() == [-10.0, -5.0] and data.reference_rejected.tolist() == [-14.0, -7.0]
    assert data.chosen_tokens.tolist() == [4.0, 5.0] and data.rejected_tokens.tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="odd"):
        pair_log_probs(torch.zeros(3), torch.zeros(3), torch.ones(3))


@pytest.mark.parametrize("kwargs, message", [
    (dict(loss_type="hinge", beta=0.1), "unknown preference loss"),
    (dict(loss_type="sigmoid", beta=0.0), "beta must be > 0"),
    (dict(loss_type="cdpo", beta=0.1, label_smoothing=0.5), r"\[0, 0.5\)"),
    (dict(loss_type="ipo", beta=0.1, label_smoothing=0.1), "not to ipo"),
    (dict(loss_type="sigmoid", beta=0.1, label_smoothing=0.1),
     r"applies to the losses \('cdpo', 'robust'\), not to sigmoid"),
])
def test_bad_options(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        preference_loss(pairs(), **kwargs)
