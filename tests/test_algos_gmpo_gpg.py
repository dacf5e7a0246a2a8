"""GMPO (rlkit/core/algos/gmpo.py) and GPG (gpg.py) by hand: the geometric mean of per-token clipped ratios, one
loss a sequence; the plain policy gradient."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.losses import aggregate_loss, policy_loss
from rlkit.recipes.loader import load_config

LN = math.log


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row 0: ratios 1.5, 0.5, 1.0, advantage 1. Row 1: ratios 1.5, 0.5 and a padding slot, advantage -1."""
    log_probs = torch.tensor([[LN(0.6), LN(0.2), LN(0.5)], [LN(0.6), LN(0.2), 50.0]], requires_grad=True)
    old = torch.tensor([[LN(0.4), LN(0.4), LN(0.5)], [LN(0.4), LN(0.4), 0.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return log_probs, old, advantages, mask


def test_gmpo_clips_each_log_ratio_on_the_pessimistic_side_then_takes_the_geometric_mean():
    log_probs, old, advantages, mask = batch()
    loss, metrics = policy_loss("gmpo", log_probs, old, advantages, mask)  # log bounds 0.4, 0.4
    # Log-ratios ln 1.5 = .405465, ln .5 = -.693147, 0; clipped to [-.4, .4]: .4, -.4, 0.
    # Row 0 (A > 0, the smaller): .4, -.693147, 0 -> mean -.097716 -> r = .906907, loss -.906907 on each token.
    # Row 1 (A < 0, the larger): .405465, -.4 -> mean .0027326 -> r = 1.0027363, loss 1.0027363.
    assert torch.allclose(loss, torch.tensor([[-0.906907] * 3, [1.0027363, 1.0027363, 0.0]]), atol=1e-6)
    # seq-mean-token-mean: the mean of the two sequences' losses (verl's geo_mean).
    step_loss = aggregate_loss(loss, mask, "seq-mean-token-mean")
    assert step_loss.item() == pytest.approx((-0.906907 + 1.0027363) / 2, abs=1e-6)
    step_loss.backward()
    # d loss_i / d l_t = -A_i r_i / n_i where the unclipped log-ratio is used, 0 where the clip is taken; the step's
    # mean over 2 sequences halves it: row 0 (0, .906907/3/2 ...) with sign -, row 1 (1.0027363/2/2, 0).
    expected = torch.tensor([[0.0, -0.906907 / 6, -0.906907 / 6], [1.0027363 / 4, 0.0, 0.0]])
    assert torch.allclose(log_probs.grad, expected, atol=1e-6)
    # The clip is taken on row 0's first token (A > 0) and row 1's second (A < 0): 1 of 5 tokens each.
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 5)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    assert metrics["seq_ratio_mean"].item() == pytest.approx((3 * 0.906907 + 2 * 1.0027363) / 5, abs=1e-6)


def test_on_policy_gmpo_is_the_policy_gradient_of_each_sequences_mean_token():
    # At ratio 1 every r_i = 1 and d loss_i / d logp_t = -A_i / n_i: REINFORCE on the sequence's mean token.
    log_probs, _, advantages, mask = batch()
    old = log_probs.detach().clone()
    loss, _ = policy_loss("gmpo", log_probs, old, advantages, mask)
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    assert torch.allclose(log_probs.grad, torch.tensor([[-1 / 6] * 3, [1 / 4, 1 / 4, 0.0]]), atol=1e-6)


def test_the_gmpo_recipe_and_verls_name():
    config = load_config("gmpo", ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"])
    assert config.actor.policy_loss == "gmpo" and config.actor.loss_agg_mode == "seq-mean-token-mean"
    assert config.actor.policy_loss_options == {"log_clip_low": 0.4, "log_clip_high": 0.4}
    log_probs, old, advantages, mask = batch()
    assert torch.equal(policy_loss("geo_mean", log_probs, old, advantages, mask)[0],
                       policy_loss("gmpo", log_probs, old, advantages, mask)[0])
    with pytest.raises(ValueError, match="log_clip_low, log_clip_high >= 0"):
        policy_loss("gmpo", log_probs, old, advantages, mask, log_clip_low=-0.1)


def test_gpg_is_the_plain_policy_gradient_whatever_the_old_policy():
    # GPG (rlkit/core/algos/gpg.py): loss_t = -A_t log pi(y_t); row 0: -1 * ln .6 = .510826, -1 * ln .2 = 1.609438,
    # -1 * ln .5 = .693147; row 1: ln .6 = -.510826, ln .2 = -1.609438, padding 0. Gradient -A_t, no clip anywhere.
    log_probs, old, advantages, mask = batch()
    loss, metrics = policy_loss("gpg", log_probs, old, advantages, mask)
    expected = torch.tensor([[0.510826, 1.609438, 0.693147], [-0.510826, -1.609438, 0.0]])
    assert torch.allclose(loss, expected, atol=1e-6)
    loss.sum().backward()
    assert torch.equal(log_probs.grad, torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 0.0]]))
    # ppo_kl: mean of old - new over the 5 tokens: -(ln 1.5 + ln .5) x 2 / 5 = .115073
    assert metrics["ppo_kl"].item() == pytest.approx(-2 * (LN(1.5) + LN(0.5)) / 5, abs=1e-6)
