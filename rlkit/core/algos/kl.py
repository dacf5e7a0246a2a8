"""Per-token KL estimators against the reference policy, and the KL coefficient controllers.

Only per-token log-probs of the sampled tokens are available (not full distributions), so KL
is estimated from the log-ratio d = logp - ref_logp of the sampled token (Schulman, "Approximating
KL divergence", 2020). Estimators are named in ``KL_ESTIMATORS`` (rlkit.core.registrations).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.registrations import KL_ESTIMATORS

# k3 bounds, as verl's low_var_kl: exp() input is kept finite, the estimate itself bounded.
K3_LOG_RATIO_BOUND = 20.0
K3_VALUE_BOUND = 10.0


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: str) -> Tensor:
    """Per-token KL(pi || ref) estimate ``[B,R]`` with estimator ``kind``."""
    return KL_ESTIMATORS.get(kind)(log_probs, ref_log_probs)


def k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = logp - ref: unbiased for KL(pi || ref) under samples from pi, but high variance
    and negative on individual tokens."""
    return log_probs - ref_log_probs


def k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = 0.5 * (logp - ref)^2: biased but non-negative and low variance."""
    return 0.5 * (log_probs - ref_log_probs) ** 2


def k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1: unbiased, always >= 0, lower variance than k1.

    The log-ratio is clamped to +-20 before exp and the result to [-10, 10], as in verl, so
    one token the policy has moved far from the reference cannot dominate the batch.
    """
    log_ratio = (ref_log_probs - log_probs).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (log_ratio.exp() - log_ratio - 1).clamp(-K3_VALUE_BOUND, K3_VALUE_BOUND)


def abs_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """abs = |logp - ref|: non-negative, linear in the log-ratio."""
    return (log_probs - ref_log_probs).abs()


def straight_through(value: Tensor, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """`value` forward, k2's gradient backward: k1 and k3 estimate KL's value without bias, but their gradients
    are not KL's; k2's is (Schulman 2020). verl's `k1+` / `k3+`."""
    gradient = k2(log_probs, ref_log_probs)
    return gradient - gradient.detach() + value.detach()


def k1_plus(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1's value, k2's gradient (verl's `k1+`)."""
    return straight_through(k1(log_probs, ref_log_probs), log_probs, ref_log_probs)


def k3_plus(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3's value, k2's gradient (verl's `k3+`, `low_var_kl+`): the low-variance estimate, KL's gradient."""
    return straight_through(k3(log_probs, ref_log_probs), log_probs, ref_log_probs)


class FixedKLController:
    """A constant KL coefficient; ``update`` exists so both controllers are interchangeable."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient never changes."""


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl`` (Ziegler et al. 2019).

    e = clip(KL / target - 1, -0.2, 0.2);  coef *= 1 + e * n_steps / horizon.
    The clip keeps a single noisy KL measurement from changing the coefficient by more than
    20% of ``n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be > 0, got {target_kl} and {horizon}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient after observing ``current_kl`` over ``n_steps`` samples."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def apply_kl_penalty(
    token_rewards: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    *,
    coef: float,
    kind: str,
) -> tuple[Tensor, Tensor]:
    """In-reward KL penalty: ``rewards - coef * kl`` on valid tokens (padding untouched).

    Also returns the batch KL as the mean over sequences of each sequence's token-mean KL, the
    quantity an :class:`AdaptiveKLController` is updated with.
    """
    mask = response_mask.bool()
    kl = torch.where(mask, kl_estimate(log_probs, ref_log_probs, kind), torch.zeros_like(log_probs))
    mask_f = mask.to(kl.dtype)
    seq_kl = kl.sum(-1) / mask_f.sum(-1).clamp(min=1)
    return token_rewards - coef * kl, seq_kl.mean()
