"""Preference losses on (chosen, rejected) pairs: sigmoid DPO (with cDPO label smoothing), IPO and
length-normalised DPO.

Inputs are per-sequence *summed* response log-probs under the policy and under the frozen
reference, and each response's token count. With h the difference of log-ratios,

    h = [log pi(y_c|x) - log ref(y_c|x)] - [log pi(y_r|x) - log ref(y_r|x)]

  sigmoid            (Rafailov et al. 2023, *Direct Preference Optimization*), with label smoothing
                     eps (Mitchell 2023, *A note on DPO with noisy preferences*, "cDPO"; TRL's
                     `label_smoothing`):  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
  ipo                (Azar et al. 2023, *A General Theoretical Paradigm to Understand Learning from
                     Human Preferences*, eq. 17, on sequence log-probs as in the paper):
                     (h - 1 / (2 beta))^2
  length_normalized  the sigmoid loss on per-token log-ratios, each response's log-ratio divided by
                     its token count (Lambert et al. 2024, *Tulu 3*, "length-normalized DPO"); unlike
                     SimPO (Meng et al. 2024) it keeps the reference and adds no margin.

Implicit rewards (TRL's names): rewards/chosen = beta * the chosen log-ratio the loss uses (per token
for length_normalized), rewards/rejected likewise, rewards/margins = their difference,
rewards/accuracies = 1 where the chosen reward is strictly larger. All pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

PREFERENCE_LOSSES = ("sigmoid", "ipo", "length_normalized")
# The per-pair metrics `preference_loss` returns, in this order (TRL's names, plus the loss).
PREFERENCE_METRICS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


@dataclass(frozen=True)
class PairLogProbs:
    """One entry per pair, shape [P]: summed response log-probs and response token counts."""

    policy_chosen: Tensor
    policy_rejected: Tensor
    reference_chosen: Tensor
    reference_rejected: Tensor
    chosen_tokens: Tensor
    rejected_tokens: Tensor


def preference_loss(
    pairs: PairLogProbs, loss_type: str, *, beta: float, label_smoothing: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair loss [P] (differentiable through the policy log-probs) and per-pair metrics [P]
    (detached, keys PREFERENCE_METRICS)."""
    if loss_type not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {loss_type!r}; choose one of {PREFERENCE_LOSSES}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type == "ipo":
        raise ValueError("label_smoothing applies to the sigmoid losses, not to ipo")
    chosen_ratio = pairs.policy_chosen - pairs.reference_chosen
    rejected_ratio = pairs.policy_rejected - pairs.reference_rejected
    if loss_type == "length_normalized":
        chosen_ratio = chosen_ratio / pairs.chosen_tokens.clamp(min=1)
        rejected_ratio = rejected_ratio / pairs.rejected_tokens.clamp(min=1)
    h = chosen_ratio - rejected_ratio
    if loss_type == "ipo":
        loss = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        loss = -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    chosen_reward = beta * chosen_ratio.detach()
    rejected_reward = beta * rejected_ratio.detach()
    metrics = {
        "loss": loss.detach(),
        "rewards/chosen": chosen_reward,
        "rewards/rejected": rejected_reward,
        "rewards/margins": chosen_reward - rejected_reward,
        "rewards/accuracies": (chosen_reward > rejected_reward).to(chosen_reward.dtype),
    }
    return loss, metrics


def split_pairs(values: Tensor) -> tuple[Tensor, Tensor]:
    """A per-sequence tensor laid out chosen, rejected, chosen, rejected, ... -> (chosen [P], rejected [P])."""
    if values.shape[0] % 2:
        raise ValueError(f"pairs are laid out as (chosen, rejected) rows; got an odd count {values.shape[0]}")
    return values[0::2], values[1::2]


def pair_log_probs(policy: Tensor, reference: Tensor, tokens: Tensor) -> PairLogProbs:
    """Per-sequence summed log-probs [2P] of the policy and the reference and token counts [2P],
    rows interleaved chosen/rejected, as PairLogProbs."""
    (pc, pr), (rc, rr), (tc, tr) = split_pairs(policy), split_pairs(reference), split_pairs(tokens.to(policy.dtype))
    return PairLogProbs(pc, pr, rc, rr, tc, tr)
