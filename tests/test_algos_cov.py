"""Clip-Cov and KL-Cov (rlkit/core/algos/cov.py) by hand: which tokens each restrains, what their loss and
gradient become, that Clip-Cov's draw is reproducible, and that with no token restrained they are PPO."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.cov import token_covariance, token_draws
from rlkit.core.algos.losses import configured_loss_options, loss_options, policy_loss
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config

LN = math.log
TINY = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"]


def clip_cov_batch(ratio_2: float = 0.9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row, five tokens and a padding slot (garbage log-prob 50).

    log-probs -1, -2, -3, -2, -2 (mean -2); advantages 2, 1, -2, -1, 0 (mean 0), so
    cov_t = (logp_t + 2) * A_t = 2, 0, 2, 0, 0: tokens 0 and 2 lie inside (clip_cov_lb, clip_cov_ub) = (1, 5).
    Ratios 1.1, 1.5, ratio_2, 1.0, 1.0: token 1 is clipped by PPO (A > 0, r > 1.2).
    """
    log_probs = torch.tensor([[-1.0, -2.0, -3.0, -2.0, -2.0, 50.0]], requires_grad=True)
    ratios = torch.tensor([[1.1, 1.5, ratio_2, 1.0, 1.0, 1.0]])
    old = log_probs.detach() - ratios.log()
    old[0, 5] = 0.0
    advantages = torch.tensor([[2.0, 1.0, -2.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    return log_probs, old, advantages, mask


def gradient(name: str, log_probs, old, advantages, mask, **options) -> tuple[torch.Tensor, torch.Tensor, dict]:
    log_probs.grad = None
    loss, metrics = policy_loss(name, log_probs, old, advantages, mask, **options)
    loss.sum().backward()
    return loss.detach(), log_probs.grad.clone(), metrics


def test_the_covariance_is_centred_on_the_valid_tokens_only():
    log_probs, _, advantages, mask = clip_cov_batch()
    cov = token_covariance(log_probs, advantages, mask.bool())
    assert torch.allclose(cov, torch.tensor([[2.0, 0.0, 2.0, 0.0, 0.0, 0.0]]))  # the padding's 50 is not in the mean


def test_clip_cov_detaches_the_drawn_tokens_and_keeps_their_loss_value():
    log_probs, old, advantages, mask = clip_cov_batch()
    # clip_cov_ratio 0.4: max(1, int(0.4 * 5)) = 2 draws, and exactly tokens 0 and 2 are candidates.
    loss, grad, metrics = gradient("clip_cov", log_probs, old, advantages, mask, clip_cov_ratio=0.4)
    # PPO's loss (clip 0.2/0.2, dual clip 3): -2*1.1 = -2.2; max(-1.5, -1.2) = -1.2; -(-2)*.9 = 1.8; 1.0; 0
    assert torch.allclose(loss, torch.tensor([[-2.2, -1.2, 1.8, 1.0, 0.0, 0.0]]), atol=1e-6)
    # d/dlogp of -A r is -A r: -2.2 (token 0), 0 (clipped), 1.8 (token 2), 1.0 (token 3); 0 and 2 are detached.
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]), atol=1e-6)
    assert metrics["clip_cov_frac"].item() == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 5)


@pytest.mark.parametrize("ratio_2", [0.5, 4.0], ids=["ppo-clip", "dual-clip"])
def test_a_token_whose_gradient_the_clip_already_took_is_never_drawn(ratio_2):
    # Token 2 (A = -2): r = 0.5 < 0.8 is PPO-clipped; r = 4 > 3 is capped by the dual clip. Either way only
    # token 0 is left to draw, although two draws are allowed.
    log_probs, old, advantages, mask = clip_cov_batch(ratio_2)
    _, grad, metrics = gradient("clip_cov", log_probs, old, advantages, mask, clip_cov_ratio=0.4)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]), atol=1e-6)
    assert metrics["clip_cov_frac"].item() == pytest.approx(1 / 5)


def test_with_no_token_inside_the_bounds_clip_cov_is_ppo():
    # cov 2 is above clip_cov_ub = 1.5: nothing is drawn, so loss and gradient are vanilla PPO's.
    log_probs, old, advantages, mask = clip_cov_batch()
    loss, grad, metrics = gradient("clip_cov", log_probs, old, advantages, mask, clip_cov_ub=1.5)
    ppo_loss, ppo_grad, ppo_metrics = gradient("vanilla", log_probs, old, advantages, mask)
    assert torch.equal(loss, ppo_loss) and torch.equal(grad, ppo_grad)
    assert grad[0, 0].item() == pytest.approx(-2.2) and metrics["clip_cov_frac"].item() == 0.0
    assert {k: v for k, v in metrics.items() if k != "clip_cov_frac"} == ppo_metrics


def test_the_draw_is_the_same_every_time_whatever_the_rng_and_the_row_order():
    # One draw (the default clip_cov_ratio 2e-4 gives max(1, int(1e-3)) = 1) between tokens 0 and 2.
    log_probs, old, advantages, mask = clip_cov_batch()
    drawn = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        drawn.append(gradient("clip_cov", log_probs, old, advantages, mask)[1][0, [0, 2]] == 0)
    assert torch.equal(drawn[0], drawn[1]) and drawn[0].sum().item() == 1
    # A token's draw depends on the token alone (position, old log-prob, advantage): a row moved in the batch
    # draws the same. Two rows, each with one candidate: the candidate with the smaller draw is detached.
    # log-probs -1, -2 / -2, -3 (mean -2), advantages 2, 0 / 0, -2 (mean 0): cov 2, 0 / 0, 2.
    rows = torch.tensor([[-1.0, -2.0], [-2.0, -3.0]])
    adv = torch.tensor([[2.0, 0.0], [0.0, -2.0]])
    old_rows, mask_rows = rows - 0.05, torch.ones(2, 2)  # ratios e^0.05: inside PPO's clip
    draws = token_draws(old_rows, adv)
    first = bool(draws[0, 0] < draws[1, 1])
    for order in ([0, 1], [1, 0]):
        log_probs_rows = rows[order].clone().requires_grad_(True)
        _, grad, _ = gradient("clip_cov", log_probs_rows, old_rows[order], adv[order], mask_rows)
        detached = (bool(grad[order.index(0), 0] == 0), bool(grad[order.index(1), 1] == 0))
        assert detached == (first, not first)


def kl_cov_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row, four tokens and a padding slot: log-probs -1, -2, -3, -2 (mean -2), advantages 2, 1, -1, -2
    (mean 0), so cov_t = 2, 0, 1, 0. Log-ratios ln 1.25, ln 0.8, ln 1.5, 0."""
    log_probs = torch.tensor([[-1.0, -2.0, -3.0, -2.0, 50.0]], requires_grad=True)
    log_ratios = torch.tensor([[LN(1.25), LN(0.8), LN(1.5), 0.0, 0.0]])
    old = log_probs.detach() - log_ratios
    advantages = torch.tensor([[2.0, 1.0, -1.0, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    return log_probs, old, advantages, mask


def test_kl_cov_penalises_the_top_covariance_tokens():
    log_probs, old, advantages, mask = kl_cov_batch()
    # kl_cov_ratio 0.5: int(0.5 * 4) = 2 tokens, the two largest cov (tokens 0 and 2), + 1.0 * |log r|.
    loss, grad, metrics = gradient("kl_cov", log_probs, old, advantages, mask, kl_cov_ratio=0.5)
    # -A r (no clip) + |log r|: -2*1.25 + ln 1.25 = -2.276856; -0.8; 1.5 + ln 1.5 = 1.905465; 2.0
    assert torch.allclose(loss, torch.tensor([[-2.276856, -0.8, 1.905465, 2.0, 0.0]]), atol=1e-5)
    # -A r + sign(log r): -2.5 + 1 = -1.5; -0.8; 1.5 + 1 = 2.5; 2.0; the padding 0
    assert torch.allclose(grad, torch.tensor([[-1.5, -0.8, 2.5, 2.0, 0.0]]), atol=1e-5)
    assert metrics["kl_cov_frac"].item() == pytest.approx(0.5)
    assert metrics["ppo_kl"].item() == pytest.approx(-LN(1.5) / 4, abs=1e-6)  # mean(old - new)
    # The default share (2e-4) penalises one token at least: the largest cov, token 0 only.
    loss, grad, _ = gradient("kl_cov", log_probs, old, advantages, mask, ppo_kl_coef=0.5)
    assert torch.allclose(grad, torch.tensor([[-2.0, -0.8, 1.5, 2.0, 0.0]]), atol=1e-5)  # -2.5 + 0.5


def test_on_policy_kl_cov_is_the_policy_gradient_as_vanilla():
    # At r = 1 the penalty |log r| is 0 with gradient 0: KL-Cov is -A grad logp, as PPO on-policy.
    log_probs, _, advantages, mask = kl_cov_batch()
    old = log_probs.detach().clone()
    _, grad, _ = gradient("kl_cov", log_probs, old, advantages, mask, kl_cov_ratio=1.0)
    _, ppo_grad, _ = gradient("vanilla", log_probs, old, advantages, mask)
    assert torch.equal(grad, ppo_grad) and grad[0, :4].tolist() == [-2.0, -1.0, 1.0, 2.0]


def test_equal_advantages_and_an_all_padding_batch():
    # A group whose scores are all equal: A = 0 everywhere, so every cov_t is 0. Clip-Cov finds nothing inside
    # (1, 5) and is PPO (no gradient at all); KL-Cov still penalises its one token, the first of the ties
    # (token 0, |ln 1.25| = .223144, gradient sign(ln 1.25) = 1), pulling that ratio back to 1.
    log_probs, old, advantages, mask = kl_cov_batch()
    zero = torch.zeros_like(advantages)
    loss, grad, metrics = gradient("clip_cov", log_probs, old, zero, mask)
    assert not grad.any() and metrics["clip_cov_frac"].item() == 0.0
    loss, grad, _ = gradient("kl_cov", log_probs, old, zero, mask)
    assert torch.allclose(loss, torch.tensor([[0.223144, 0.0, 0.0, 0.0, 0.0]]), atol=1e-6)
    assert grad.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    # No valid token: nothing is chosen, every loss is 0.
    for name in ("clip_cov", "kl_cov"):
        loss, grad, metrics = gradient(name, log_probs, old, advantages, torch.zeros_like(mask))
        assert not loss.any() and not grad.any() and all(v.item() == 0.0 for v in metrics.values())


def test_the_options_and_their_checks():
    assert loss_options("clip_cov") == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                                        "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}
    assert loss_options("kl_cov") == {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 1.0}
    log_probs, old, advantages, mask = kl_cov_batch()
    for name, options in (("clip_cov", {"clip_cov_ratio": 0.0}), ("clip_cov", {"clip_cov_lb": 5.0}),
                          ("kl_cov", {"kl_cov_ratio": 1.5}), ("kl_cov", {"ppo_kl_coef": -1.0})):
        with pytest.raises(ValueError, match="Cov needs"):
            policy_loss(name, log_probs, old, advantages, mask, **options)


def test_the_recipes_carry_the_papers_settings_to_the_losses():
    clip = load_config("clip_cov", TINY).actor
    assert configured_loss_options("clip_cov", clip) == {"clip_ratio_low": 1.0, "clip_ratio_high": 1.0,
                                                         "clip_ratio_c": None, "clip_cov_ratio": 2e-4,
                                                         "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}
    kl = load_config("kl_cov", [*TINY, "actor.policy_loss_options.kl_cov_ratio=0.0002"]).actor
    assert configured_loss_options("kl_cov", kl) == {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 1.0}
    with pytest.raises(ConfigError, match="actor.policy_loss_options: KL-Cov needs 0 < kl_cov_ratio <= 1"):
        load_config("kl_cov", [*TINY, "actor.policy_loss_options.kl_cov_ratio=0"])
