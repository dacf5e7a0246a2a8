"""The DPO micro-step a policy worker runs inside `learner.optimize` (objective: dpo).

A preference batch uses the rollout Batch layout (rlkit.core.batch) with rows interleaved
chosen, rejected, chosen, rejected, ...; `response_mask` covers each response and its EOS, and
`ref_log_probs` holds the frozen reference's per-token log-probs, computed once per batch before
the update (the `ref` phase, no gradient). The optimizer keeps each pair's two rows in one
micro-batch (`optimize(..., group=2)`), so the pair's loss sees both.
"""

from __future__ import annotations

import torch

from rlkit.core.algos.preference import pair_log_probs, preference_loss
from rlkit.core.batch import Batch
from rlkit.core.train import fsdp, packing

PAIR_ROWS = 2  # rows per pair: chosen, then rejected


def sequence_log_probs(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, R] per-token log-probs -> [B] summed over each response's masked tokens."""
    return (per_token * mask).sum(-1)


def preference_micro_step(
    module: torch.nn.Module,
    mb: Batch,
    norm: dict[str, float],
    *,
    device: torch.device,
    loss_type: str,
    beta: float,
    label_smoothing: float,
    fused_head: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch of whole pairs and metric sums: `tokens` and the preference metrics
    (rlkit.core.algos.preference). `fused_head`: actor.fused_lm_head (fsdp.packed_log_probs).

    Loss and metrics are the pairs' sums divided by the whole mini-batch's pair count, so a
    mini-batch's micro-batches (and ranks) add up to its mean: `optimize` takes them as
    `per_update` keys and averages them over the optimizer steps.
    """
    packed = packing.pack(mb).to(device)
    mb = mb.to(device)
    flat_log_probs, _ = fsdp.packed_log_probs(
        module, packed, temperature=1.0, with_entropy=False, fused_head=fused_head
    )
    mask = mb["response_mask"].float()
    policy = sequence_log_probs(packed.scatter(flat_log_probs), mask)
    reference = sequence_log_probs(mb["ref_log_probs"], mask)
    losses, metrics = preference_loss(
        pair_log_probs(policy, reference, mask.sum(-1)), loss_type, beta=beta, label_smoothing=label_smoothing
    )
    # Validation pads its pairs to whole ranks with filler pairs whose loss mask is 0: they count nothing.
    real = (mask.sum(-1)[0::PAIR_ROWS] > 0).to(losses.dtype)
    pairs_in_minibatch = norm["num_seqs"] / PAIR_ROWS
    sums = {key: ((value * real).sum() / pairs_in_minibatch).detach().cpu() for key, value in metrics.items()}
    sums["tokens"] = mask.sum().detach().cpu()
    return (losses * real).sum() / pairs_in_minibatch, sums
