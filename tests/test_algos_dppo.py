"""DPPO-Binary-TV and DPPO-Binary-KL (rlkit/core/algos/dppo.py) by hand: which tokens each masks, the
truncated weight, and that inside the trust region they are PPO's gradient."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.losses import loss_options, policy_loss

LN = math.log


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row, six tokens and a padding slot (garbage log-prob 50), as (A, pi_old, pi):
    0: (+1, .5, .6)   r 1.2   TV +.1                     KL .020411   kept by both
    1: (+1, .5, .7)   r 1.4   TV +.2 > .15               KL .087177   masked by both (grew past the region)
    2: (+1, .01, .1)  r 10    TV +.09 (PPO would clip)   KL .071332   TV keeps it, KL masks it (> .05, grew)
    3: (-1, .9, .7)   r .778  TV -.2 < -.15              KL .116321   masked by both (shrank past the region)
    4: (-1, .5, .4)   r .8    TV -.1                     KL .020411   kept by both
    5: (-1, .2, .6)   r 3     TV +.4: moved against A    KL .334795   kept by both: the mask is one-sided
    KL = q ln(q/p) + (1-q) ln((1-q)/(1-p)), e.g. token 2: .01 ln .1 + .99 ln(.99/.9) = -.023026 + .094357.
    """
    log_probs = torch.tensor([[LN(0.6), LN(0.7), LN(0.1), LN(0.7), LN(0.4), LN(0.6), 50.0]], requires_grad=True)
    old = torch.tensor([[LN(0.5), LN(0.5), LN(0.01), LN(0.9), LN(0.5), LN(0.2), 0.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0] * 6 + [0.0]])
    return log_probs, old, advantages, mask


def run(name: str, log_probs, old, advantages, mask, **options) -> tuple[torch.Tensor, torch.Tensor, dict]:
    log_probs.grad = None
    loss, metrics = policy_loss(name, log_probs, old, advantages, mask, **options)
    loss.sum().backward()
    return loss.detach(), log_probs.grad.clone(), metrics


def test_binary_tv_masks_the_tokens_whose_probability_moved_past_the_threshold_with_their_advantage():
    loss, grad, metrics = run("dppo_tv", *batch())  # thresholds 0.15, ratio cap 20
    # loss_t = -A sg(r) log pi: -1.2 ln .6 = .612991; 0; -10 ln .1 = 23.025851; 0; .8 ln .4 = -.733033;
    # 3 ln .6 = -1.532477
    assert torch.allclose(loss, torch.tensor([[0.612991, 0.0, 23.025851, 0.0, -0.733033, -1.532477, 0.0]]),
                          atol=1e-5)
    # d/dlog pi = -A r on the kept tokens: the rare token 2 keeps its gradient at r = 10.
    assert torch.allclose(grad, torch.tensor([[-1.2, 0.0, -10.0, 0.0, 0.8, 3.0, 0.0]]), atol=1e-5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 6)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    assert metrics["ppo_kl"].item() == pytest.approx(-(LN(1.2) + LN(1.4) + LN(10) + LN(7 / 9) + LN(0.8) + LN(3)) / 6,
                                                     abs=1e-5)


def test_binary_kl_masks_by_the_divergence_of_the_two_bernoullis():
    loss, grad, metrics = run("dppo_kl", *batch())  # thresholds 0.05
    # As TV, but token 2 (KL .071332 > .05, its probability grew with A > 0) is masked too.
    assert torch.allclose(loss, torch.tensor([[0.612991, 0.0, 0.0, 0.0, -0.733033, -1.532477, 0.0]]), atol=1e-5)
    assert torch.allclose(grad, torch.tensor([[-1.2, 0.0, 0.0, 0.0, 0.8, 3.0, 0.0]]), atol=1e-5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(3 / 6)
    # A threshold of 0.08 keeps token 2 (.071332) and still masks token 1 (.087177).
    _, grad, _ = run("dppo_kl", *batch(), clip_divergence_high=0.08)
    assert grad[0, 1].item() == 0.0 and grad[0, 2].item() == pytest.approx(-10.0, rel=1e-5)


def test_the_ratio_cap_truncates_the_weight_of_kept_tokens():
    loss, grad, metrics = run("dppo_tv", *batch(), ratio_cap=2.5)
    # Tokens 2 (r 10) and 5 (r 3) weigh 2.5: -2.5 ln .1 = 5.756463, 2.5 ln .6 = -1.277064.
    assert loss[0, 2].item() == pytest.approx(5.756463, abs=1e-5) and loss[0, 5].item() == pytest.approx(-1.277064,
                                                                                                          abs=1e-5)
    assert torch.allclose(grad, torch.tensor([[-1.2, 0.0, -2.5, 0.0, 0.8, 2.5, 0.0]]), atol=1e-5)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(2 / 6)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_inside_the_trust_region_dppo_is_ppos_gradient(name):
    # Small moves (p .5 -> .55 and .5 -> .45: TV .05, KL .005) keep every token, and ratios 1.1 and .9 lie inside
    # PPO's clip: both give -A r grad log pi.
    log_probs = torch.tensor([[LN(0.55), LN(0.45), LN(0.3)]], requires_grad=True)
    old = torch.tensor([[LN(0.5), LN(0.5), LN(0.3)]])
    advantages, mask = torch.tensor([[1.0, -2.0, 0.5]]), torch.ones(1, 3)
    _, grad, metrics = run(name, log_probs, old, advantages, mask)
    _, ppo_grad, _ = run("vanilla", log_probs, old, advantages, mask)
    assert torch.allclose(grad, ppo_grad) and torch.allclose(grad, torch.tensor([[-1.1, 1.8, -0.5]]))
    assert metrics["pg_clipfrac"].item() == 0.0


def test_the_options_and_their_checks():
    assert loss_options("dppo_tv") == {"clip_divergence_low": 0.15, "clip_divergence_high": 0.15, "ratio_cap": 20.0}
    assert loss_options("dppo_kl") == {"clip_divergence_low": 0.05, "clip_divergence_high": 0.05, "ratio_cap": 20.0}
    for name in ("dppo_tv", "dppo_kl"):
        with pytest.raises(ValueError, match="needs clip_divergence_low, clip_divergence_high, ratio_cap > 0"):
            policy_loss(name, *batch(), clip_divergence_low=0.0)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_equal_advantages_and_an_all_padding_batch(name):
    # A = 0 (a group of equal scores): no token pushes, loss and gradient 0 everywhere. A <= 0 is judged by the
    # lower threshold, so only token 3 (pi .9 -> .7) counts as masked: 1 of 6.
    log_probs, old, advantages, mask = batch()
    loss, grad, metrics = run(name, log_probs, old, torch.zeros_like(advantages), mask)
    assert not loss.any() and not grad.any() and metrics["pg_clipfrac"].item() == pytest.approx(1 / 6)
    loss, grad, metrics = run(name, log_probs, old, advantages, torch.zeros_like(mask))
    assert not loss.any() and not grad.any() and all(v.item() == 0.0 for v in metrics.values())
