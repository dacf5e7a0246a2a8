"""Masked means and ratio bounds shared by the losses (a module of its own, so a loss module can use them)."""

from __future__ import annotations

from torch import Tensor

# exp() of a log-ratio beyond these would overflow or dominate the batch; verl uses the same bounds.
TOKEN_LOG_RATIO_BOUND = 20.0
SEQ_LOG_RATIO_MAX = 10.0


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over positions where ``mask`` is set; 0 (not NaN) when nothing is set."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
