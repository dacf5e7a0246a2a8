"""Preference losses on (chosen, rejected) pairs: sigmoid DPO, conservative and robust DPO with label smoothing, IPO
(per-token, as TRL; or on sequence sums) and length-normalised DPO.

Inputs are per-sequence *summed* response log-probs under the policy and under the frozen
reference, and each response's token count. With h the difference of log-ratios,

    h = [log pi(y_c|x) - log ref(y_c|x)] - [log pi(y_r|x) - log ref(y_r|x)]

  sigmoid            (Rafailov et al. 2023, *Direct Preference Optimization*): -log sigmoid(beta h). No label
                     smoothing: TRL's sigmoid loss ignores `label_smoothing` today, so here it is refused.
  cdpo               conservative DPO (Mitchell 2023, *A note on DPO with noisy preferences*), the meaning rlkit's
                     sigmoid gave label smoothing eps until 2026-12-03 (and older TRL):
                     -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
  robust             robust DPO (Chowdhury et al. 2024, arXiv 2403.00409; TRL's `robust`): unbiased under a
                     share eps of flipped labels:
                     [-(1 - eps) log sigmoid(beta h) + eps log sigmoid(-beta h)] / (1 - 2 eps)
  ipo                (Azar et al. 2023, *A General Theoretical Paradigm to Understand Learning from Human
                     Preferences*, eq. 17) as TRL computes it: each response's log-ratio averaged over its
                     tokens first, then (h - 1 / (2 beta))^2
  ipo_sum            the same on sequence sums (the paper's eq. 17 as written; rlkit's `ipo` until 2026-12-03):
                     beta does not carry over between the two
  length_normalized  the sigmoid loss on per-token log-ratios, each response's log-ratio divided by
                     its token count (Lambert et al. 2024, *Tulu 3*, "length-normalized DPO"); unlike
                     SimPO (Meng et al. 2024) it keeps the reference and adds no margin.

Implicit rewards (TRL's names): rewards/chosen = beta * the chosen log-ratio the loss uses (per token
for ipo and length_normalized), rewards/rejected likewise, rewards/margins = their difference,
rewards/accuracies = 1 where the chosen reward is strictly larger. All pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

PREFERENCE_LOSSES = ("sigmoid", "cdpo", "robust", "ipo", "ipo_sum", "length_normalized")
SMOOTHED_LOSSES = ("cdpo", "robust")  # the losses label smoothing applies to
PER_TOKEN_LOSSES = ("ipo", "length_normalized")  # the losses on log-ratios averaged over each response's tokens
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
    if label_smoothing and loss_type not in SMOOTHED_LOSSES:
        raise ValueError(f"label_smoothing applies to the losses {SMOOTHED_LOSSES}, not to {loss_type}")
    chosen_ratio = pairs.policy_chosen - pairs.reference_chosen
    rejected_ratio = pairs.policy_rejected - pairs.reference_rejected
    if loss_type in PER_TOKEN_LOSSES:
        chosen_ratio = chosen_ratio / pairs.chosen_tokens.clamp(min=1)
        rejected_ratio = rejected_ratio / pairs.rejected_tokens.clamp(min=1)
    h = chosen_ratio - rejected_ratio
    eps = label_smoothing
    if loss_type in ("ipo", "ipo_sum"):
        loss = (h - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "robust":
        loss = (-(1.0 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1.0 - 2.0 * eps)
    else:  # sigmoid and length_normalized (eps 0), cdpo
        loss = -(1.0 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
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
