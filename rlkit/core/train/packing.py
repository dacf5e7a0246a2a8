"""Sequence packing: micro-batches by real-token budget, laid end to end with no padding.

A rollout batch is padded (prompts left, responses right). The training passes instead
concatenate the real tokens of several sequences into one row, restart position ids at
each sequence, and let the attention kernel see the sequence boundaries (`cu_seq_lens`),
so no FLOP is spent on padding. Results at response positions are scattered back into
the padded [b, R] layout, where the loss code works unchanged.

FSDP2 makes every forward/backward a collective, so all ranks must run the same number
of micro-batches: `plan_micro_batches` agrees on that number across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlkit.core.batch import Batch, to_device


def _pack_bins(lengths: list[int], bins: int) -> list[list[int]]:
    """Longest first, each into the lightest bin: near-equal token counts per bin."""
    loads, members = [0] * bins, [[] for _ in range(bins)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        lightest = min(range(bins), key=loads.__getitem__)
        loads[lightest] += lengths[i]
        members[lightest].append(i)
    return members


def _fewest_bins(lengths: list[int], budget: int) -> list[list[int]]:
    """The fewest balanced bins whose token counts all fit `budget` (a sequence alone always 'fits')."""
    bins = max(1, -(-sum(lengths) // budget))
    while True:
        members = _pack_bins(lengths, bins)
        if all(len(m) == 1 or sum(lengths[i] for i in m) <= budget for m in members):
            return members
        bins += 1


def plan_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices of each micro-batch: at most `budget` real tokens each, the same count on every rank.

    A rank that needs fewer micro-batches than the agreed count splits its fullest one in
    two until the counts match; splitting never breaks the budget. Every rank holds the
    same number of sequences (checked at config time), so the agreed count is reachable.
    """
    members = [m for m in _fewest_bins(lengths, budget) if m]
    agreed = torch.tensor([len(members)], dtype=torch.long, device=collective_device())
    if dist.is_initialized():
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return [sorted(m) for m in split_to_count(members, lengths, int(agreed.item()))]


def collective_device() -> torch.device:
    """Where a tensor must live for the process group's collectives (NCCL: the current GPU)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def split_to_count(members: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """Split the fullest splittable bin in two until there are `count` bins (budgets stay kept)."""
    members = [list(m) for m in members]
    while len(members) < count:
        fullest = max((m for m in members if len(m) > 1), key=lambda m: sum(lengths[i] for i in m))
        members.remove(fullest)
        halves = _pack_bins([lengths[i] for i in fullest], 2)
        members += [[fullest[j] for j in half] for half in halves]
    return members


@dataclass
class PackedBatch:
    """Several sequences as one row of real tokens, plus where their responses sit."""

    input_ids: torch.Tensor  # [1, T] every sequence's prompt + response tokens, end to end
    position_ids: torch.Tensor  # [1, T] restarting at 0 for each sequence
    cu_seq_lens: torch.Tensor  # [N + 1] int32 sequence boundaries (attention kernels' layout)
    max_len: int  # longest sequence
    predict_index: torch.Tensor  # [K] positions in T whose output predicts a response token
    targets: torch.Tensor  # [K] the response tokens themselves
    rows: torch.Tensor  # [K] row in the padded [b, R] layout of each response token
    cols: torch.Tensor  # [K] column in that layout
    shape: tuple[int, int]  # (b, R) of the padded layout

    def to(self, device: torch.device) -> PackedBatch:
        """On `device`, copied without waiting from the host to a GPU (rlkit.core.batch.to_device)."""
        moved = {k: to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return PackedBatch(**moved)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def scatter(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """[K] values at response tokens -> [b, R] padded layout (differentiable)."""
        out = values.new_full(self.shape, fill)
        return out.index_put((self.rows, self.cols), values)

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """[b, R] padded layout -> [K] values at response tokens."""
        return padded[self.rows, self.cols]


def pack(mb: Batch) -> PackedBatch:
    """Lay the real tokens of a padded rollout micro-batch (see rlkit.core.batch) end to end."""
    ids, mask, response_mask = mb["input_ids"], mb["attention_mask"].bool(), mb["response_mask"].bool()
    prompt_width = ids.shape[1] - mb["responses"].shape[1]
    lengths = mask.sum(-1)
    # Tokens are kept in row order; inside a row, left padding precedes the prompt and right
    # padding follows the response, so the kept tokens of a row are contiguous and in order.
    flat_ids = ids[mask]
    starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    positions = torch.arange(int(starts[-1]), device=ids.device) - torch.repeat_interleave(starts[:-1], lengths)
    rows, cols = response_mask.nonzero(as_tuple=True)
    prompt_lengths = mask[:, :prompt_width].sum(-1)
    # Response token (r, c) sits at packed position start_r + prompt_len_r + c; the output
    # one position earlier predicts it.
    predict_index = starts[rows] + prompt_lengths[rows] + cols - 1
    return PackedBatch(
        input_ids=flat_ids.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        cu_seq_lens=starts.to(torch.int32),
        max_len=int(lengths.max()),
        predict_index=predict_index,
        targets=mb["responses"][rows, cols],
        rows=rows,
        cols=cols,
        shape=tuple(response_mask.shape),
    )
