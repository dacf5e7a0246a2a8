"""KL estimators, KL controllers and the in-reward KL penalty against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
)

# logp - ref = d = [.5, -1.0]
LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("k1", "kl"), [0.5, -1.0]),  # d
        (("k2", "mse"), [0.125, 0.5]),  # .5 d^2 = .5*.25, .5*1
        # ref - logp = [-.5, 1]: exp(-.5) + .5 - 1 = .606531 - .5 = .106531; exp(1) - 1 - 1 = .718282
        (("k3", "low_var_kl"), [math.exp(-0.5) - 0.5, math.e - 2.0]),
        (("abs",), [0.5, 1.0]),  # |d|
    ],
)
def test_estimators(kinds: tuple[str, ...], expected: list[float]) -> None:
    for kind in kinds:
        assert torch.allclose(kl_estimate(LOGP, REF, kind), torch.tensor([expected]), atol=1e-6)


def test_k3_is_clamped() -> None:
    # ref - logp = 30: clamped to 20 before exp, exp(20) - 21 ~ 4.9e8 is then clamped to 10.
    # ref - logp = -30: clamped to -20: exp(-20) + 20 - 1 ~ 19, clamped to 10.
    out = kl_estimate(torch.tensor([-31.0, 0.0]), torch.tensor([-1.0, -30.0]), "k3")
    assert torch.equal(out, torch.tensor([10.0, 10.0]))


@pytest.mark.parametrize(("kind", "value"), [
    ("k1+", [0.5, -1.0]),
    ("k3+", [math.exp(-0.5) - 0.5, math.e - 2.0]),
    ("low_var_kl+", [math.exp(-0.5) - 0.5, math.e - 2.0]),
])
def test_straight_through_estimators_keep_the_value_and_take_k2s_gradient(kind: str, value: list[float]) -> None:
    # Forward: k1's or k3's value (above). Backward: d(.5 d^2)/d logp = d = [.5, -1] (k1's would be 1, k3's
    # 1 - exp(ref - logp) = [.393469, -1.718282]).
    log_probs = LOGP.clone().requires_grad_(True)
    out = kl_estimate(log_probs, REF, kind)
    assert torch.allclose(out, torch.tensor([value]), atol=1e-6)
    out.sum().backward()
    assert torch.allclose(log_probs.grad, torch.tensor([[0.5, -1.0]]), atol=1e-6)


def test_registry_names_and_unknown() -> None:
    assert KL_ESTIMATORS.names() == sorted(["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs", "k1+", "k3+",
                                            "low_var_kl+"])
    with pytest.raises(KeyError, match="did you mean 'low_var_kl'"):
        kl_estimate(LOGP, REF, "low_var")


def test_fixed_controller_never_moves() -> None:
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=100.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_clips_error() -> None:
    # target 6, horizon 10000.
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    # KL 9: error 9/6 - 1 = .5 -> clipped .2; coef *= 1 + .2 * 256/10000 = 1.00512 -> .100512
    ctrl.update(current_kl=9.0, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512)
    # KL 3: error -.5 -> -.2; coef *= 1 - .2 * 1000/10000 = .98 -> .09850176
    ctrl.update(current_kl=3.0, n_steps=1000)
    assert ctrl.value == pytest.approx(0.09850176)
    # KL 6.6: error .1 (inside the clip); coef *= 1 + .1 * 5000/10000 = 1.05 -> .103426848
    ctrl.update(current_kl=6.6, n_steps=5000)
    assert ctrl.value == pytest.approx(0.103426848)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


def test_apply_kl_penalty() -> None:
    # Seq 0 (2 tokens): d = [.5, -1], rewards [0, 1]; seq 1 (1 token + padding with garbage d = 5):
    # d = [.2], rewards [2, 0]. coef .1, k1:
    #   new rewards: [0 - .05, 1 + .1] = [-.05, 1.1]; [2 - .02, 0 untouched]
    #   mean kl: seq 0 token-mean (.5 - 1)/2 = -.25, seq 1 .2 -> (-.25 + .2)/2 = -.025
    logp = torch.tensor([[-1.0, -2.0], [-0.8, 4.0]])
    ref = torch.tensor([[-1.5, -1.0], [-1.0, -1.0]])
    rewards = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    new, mean_kl = apply_kl_penalty(rewards, logp, ref, mask, coef=0.1, kind="k1")
    assert torch.allclose(new, torch.tensor([[-0.05, 1.1], [1.98, 0.0]]), atol=1e-6)
    assert new[1, 1].item() == 0.0
    assert mean_kl.item() == pytest.approx(-0.025, abs=1e-6)
