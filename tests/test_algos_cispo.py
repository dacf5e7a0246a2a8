"""CISPO (rlkit/core/algos/cispo.py) by hand, and the seam that lets a loss bring its own options."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.losses import POLICY_LOSSES, configured_loss_options, loss_options, policy_loss
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config

LN = math.log
TINY = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"]


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row, three tokens and a padding slot: ratios 1.5, 0.5, 1.0; advantages 1, -1, 2."""
    log_probs = torch.tensor([[LN(0.6), LN(0.2), LN(0.5), 50.0]], requires_grad=True)
    old = torch.tensor([[LN(0.4), LN(0.4), LN(0.5), 0.0]])
    advantages = torch.tensor([[1.0, -1.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    return log_probs, old, advantages, mask


def test_cispo_weights_each_tokens_log_prob_by_its_clipped_detached_ratio():
    log_probs, old, advantages, mask = batch()
    loss, metrics = policy_loss("cispo", log_probs, old, advantages, mask)  # is_clip_low 1.0, is_clip_high 0.28
    # weights: min(1.5, 1.28) = 1.28; 0.5 (no lower bound above 0); 1.0
    # loss_t = -w A log pi: -1.28 * 1 * ln .6 = .653857; -.5 * -1 * ln .2 = -.804719; -1 * 2 * ln .5 = 1.386294
    assert torch.allclose(loss, torch.tensor([[0.653857, -0.804719, 1.386294, 0.0]]), atol=1e-6)
    loss.sum().backward()
    # d loss / d log pi = -w A: the clipped token keeps its gradient (PPO's clip would give it 0).
    assert torch.allclose(log_probs.grad, torch.tensor([[-1.28, 0.5, -2.0, 0.0]]), atol=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    assert metrics["is_weight_mean"].item() == pytest.approx((1.28 + 0.5 + 1.0) / 3)
    assert metrics["ppo_kl"].item() == pytest.approx(-(LN(1.5) + LN(0.5)) / 3, abs=1e-6)  # mean(old - new)


def test_a_lower_bound_clips_small_weights_too():
    log_probs, old, advantages, mask = batch()
    loss, metrics = policy_loss("cispo", log_probs, old, advantages, mask, is_clip_low=0.2, is_clip_high=0.28)
    # The 0.5 ratio is lifted to 0.8: -.8 * -1 * ln .2 = -1.287550
    assert loss[0, 1].item() == pytest.approx(-1.287550, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)


def test_on_policy_cispo_has_vanillas_gradient():
    # At ratio 1 both are policy gradient, -A grad log pi, whatever their clip settings.
    log_probs, _, advantages, mask = batch()
    old = log_probs.detach().clone()
    grads = {}
    for name in ("cispo", "vanilla"):
        log_probs.grad = None
        policy_loss(name, log_probs, old, advantages, mask)[0].sum().backward()
        grads[name] = log_probs.grad.clone()
    assert torch.allclose(grads["cispo"], grads["vanilla"]) and grads["cispo"][0, 0].item() == -1.0


def test_each_loss_declares_its_options_and_nothing_else_reaches_it():
    assert POLICY_LOSSES.names() == ["cispo", "clip_cov", "dppo_kl", "dppo_tv", "geo_mean", "gmpo",
                                     "gpg", "gspo", "kl_cov", "sapo", "vanilla"]
    assert loss_options("cispo") == {"is_clip_low": 1.0, "is_clip_high": 0.28}
    assert loss_options("gmpo") == {"log_clip_low": 0.4, "log_clip_high": 0.4} and loss_options("gpg") == {}
    assert set(loss_options("vanilla")) == {"clip_ratio_low", "clip_ratio_high", "clip_ratio_c"}
    log_probs, old, advantages, mask = batch()
    with pytest.raises(TypeError, match="policy loss 'cispo' has no option clip_ratio_c"):
        policy_loss("cispo", log_probs, old, advantages, mask, clip_ratio_c=3.0)


def test_the_recipe_and_the_config_carry_the_options_to_the_loss():
    actor = load_config("cispo", [*TINY, "actor.policy_loss_options.is_clip_high=0.3"]).actor
    assert configured_loss_options("cispo", actor) == {"is_clip_low": 1.0, "is_clip_high": 0.3}
    grpo = load_config("grpo", [*TINY, "actor.clip_ratio_high=0.28"]).actor
    assert configured_loss_options("vanilla", grpo) == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                                         "clip_ratio_c": 3.0}
    # verl's cispo reads clip_ratio_high as its bound; rlkit's reads is_clip_high, so the PPO key is refused, not
    # silently ignored (the same for gmpo and sapo, which declare no PPO clip key either).
    with pytest.raises(ConfigError, match=r"policy loss 'cispo' does not read actor.clip_ratio_high \(PPO's clip\), "
                                          r"set to 0.3; its own options are actor.policy_loss_options.\{is_clip_low, "
                                          r"is_clip_high\}.*Leave actor.clip_ratio_high at 0.2"):
        load_config("cispo", [*TINY, "actor.clip_ratio_high=0.3"])


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor.policy_loss_options.is_clip_hi=0.3"], "policy loss 'cispo' has no option 'is_clip_hi' .*did you mean "
                                                   "'is_clip_high'"),
    (["actor.policy_loss_options.is_clip_low=2"], "CISPO needs 0 <= is_clip_low <= 1"),
    (["actor.policy_loss=vanilla"], "policy loss 'vanilla' has no option 'is_clip_low'"),
])
def test_options_a_loss_does_not_have_or_cannot_take_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=f"actor.policy_loss_options: {message}"):
        load_config("cispo", [*TINY, *overrides])


def test_an_actor_key_is_not_a_loss_option():
    with pytest.raises(ConfigError, match="'clip_ratio_low' is an actor key: set actor.clip_ratio_low"):
        load_config("grpo", [*TINY, "actor.policy_loss_options.clip_ratio_low=0.1"])
