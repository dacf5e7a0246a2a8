"""SAPO (rlkit/core/algos/sapo.py) by hand: a smooth gate of the token ratio, steeper for negative advantages."""

from __future__ import annotations

import math

import pytest
import torch
from test_algos_cispo import batch  # one row: ratios 1.5, 0.5, 1.0 and a padding slot; advantages 1, -1, 2

from rlkit.core.algos.losses import policy_loss
from rlkit.recipes.loader import load_config

LN = math.log


def test_sapo_gates_each_ratio_with_the_temperature_of_its_advantages_sign():
    log_probs, old, advantages, mask = batch()
    loss, metrics = policy_loss("sapo", log_probs, old, advantages, mask)  # tau_pos 1.0, tau_neg 1.05
    # f(r) = 4/tau sigmoid(tau (r - 1)), loss = -f A:
    #   r 1.5, A 1, tau 1:     4 sigmoid(.5) = 2.4898373                  -> -2.4898373
    #   r .5, A -1, tau 1.05:  4/1.05 sigmoid(-.525) = 1.4159383          -> +1.4159383
    #   r 1, A 2, tau 1:       4 sigmoid(0) = 2                           -> -4
    assert torch.allclose(loss, torch.tensor([[-2.4898373, 1.4159383, -4.0, 0.0]]), atol=1e-6)
    loss.sum().backward()
    # d loss / d log pi = -A w, w = 4 s (1 - s) r with s = sigmoid(tau (r - 1)): 1.4100223, .4670699, 1 (on-policy).
    assert torch.allclose(log_probs.grad, torch.tensor([[-1.4100223, 0.4670699, -2.0, 0.0]]), atol=1e-6)
    assert metrics["sapo_weight_mean"].item() == pytest.approx((1.4100223 + 0.4670699 + 1.0) / 3, abs=1e-6)
    assert metrics["ppo_kl"].item() == pytest.approx(-(LN(1.5) + LN(0.5)) / 3, abs=1e-6)


def test_on_policy_sapo_has_vanillas_gradient():
    # At ratio 1 the gate's slope is exactly 1 whatever tau: both are the policy gradient -A grad log pi.
    log_probs, _, advantages, mask = batch()
    old = log_probs.detach().clone()
    grads = {}
    for name in ("sapo", "vanilla"):
        log_probs.grad = None
        loss, metrics = policy_loss(name, log_probs, old, advantages, mask)
        loss.sum().backward()
        grads[name] = log_probs.grad.clone()
        if name == "sapo":
            # The value is not vanilla's -A: f(1) = 4/tau sigmoid(0) = 2/tau, so -2 A (tau 1) and -2/1.05 A (A -1);
            # w = 4 sigmoid(0) (1 - sigmoid(0)) 1 = 1 for either tau.
            assert torch.allclose(loss, torch.tensor([[-2.0, 2 / 1.05, -4.0, 0.0]]), atol=1e-6)
            assert metrics["sapo_weight_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(grads["sapo"], torch.tensor([[-1.0, 1.0, -2.0, 0.0]]), atol=1e-6)  # -A, 0 on padding
    assert torch.allclose(grads["sapo"], grads["vanilla"])


def test_the_sapo_recipe_and_its_options():
    config = load_config("sapo", ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"])
    assert config.actor.policy_loss == "sapo" and config.actor.loss_agg_mode == "seq-mean-token-mean"
    assert config.actor.policy_loss_options == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert config.actor.ppo_epochs == 1  # a second pass made it learn less than grpo (the yaml says why)
    log_probs, old, advantages, mask = batch()
    with pytest.raises(ValueError, match="SAPO needs tau_pos, tau_neg > 0"):
        policy_loss("sapo", log_probs, old, advantages, mask, tau_neg=0.0)
