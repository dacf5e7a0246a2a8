"""Supervised fine-tuning's loss: the negative log-likelihood of the trained (loss-mask 1) tokens.

The default aggregation is actor.loss_agg_mode=token-mean over the whole mini-batch: every
trained token weighs the same, whichever sequence it is in and however the mini-batch is split
into micro-batches and ranks (each micro-batch divides by the mini-batch's token count). That
is TRL's SFTTrainer default and verl's SFT trainer's; the sequence-mean modes weigh each
sequence the same instead (short answers count as much as long ones).
"""

from __future__ import annotations

import torch

from rlkit.core.algos.losses import aggregate_loss


def sft_loss(
    log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """-log p of each trained token [B, R], reduced by `mode` (rlkit.core.algos.losses.aggregate_loss);
    pass the whole mini-batch's counts when this is one micro-batch of it."""
    return aggregate_loss(
        -log_probs,
        loss_mask,
        mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        norm_length=norm_length,
    )
