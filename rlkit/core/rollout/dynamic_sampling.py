"""DAPO dynamic sampling, the controller's half: gather prompt groups with signal over rounds.

A group is the rollout.n samples of one prompt. Groups whose samples all got the same verifier
score have group-relative advantages of 0: they add no gradient, only dilute the batch. The
controller generates round after round and hands each round's groups here, until `target`
groups with signal are in (or algorithm.dynamic_sampling.max_gen_rounds runs out).
"""

from __future__ import annotations

from typing import Generic, Sequence, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class GroupCollector(Generic[T]):
    """Keeps whole groups: per-sequence items (anything) with per-sequence tensors."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.kept: list[tuple[list[T], dict[str, Tensor]]] = []
        self.dropped: list[tuple[list[T], dict[str, Tensor]]] = []
        self.rounds = 0

    def add(self, items: Sequence[T], group_ids: Tensor, tensors: dict[str, Tensor], signal: Tensor) -> None:
        """One round: `items[i]` and `tensors[k][i]` belong to sequence i; `signal[i]` says whether its
        group has scores that differ (rlkit.core.algos.dapo.groups_with_signal)."""
        self.rounds += 1
        for rows in group_rows(group_ids):
            group = ([items[i] for i in rows], {k: v[rows] for k, v in tensors.items()})
            (self.kept if bool(signal[rows[0]]) else self.dropped).append(group)

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.target

    def take(self) -> tuple[list[list[T]], dict[str, Tensor], dict[str, float]]:
        """Exactly `target` groups (items per group, tensors concatenated in the same order) and metrics.

        Groups with signal come first, in the order generated; surplus ones from the last round
        are left out. If rounds ran out before `target` groups had signal, dropped groups fill the
        rest, so the batch keeps its size (mini-batches and ranks divide it) rather than the run
        stopping; they add no gradient under group-relative estimators.
        """
        filled = max(0, self.target - len(self.kept))
        groups = self.kept[: self.target] + self.dropped[:filled]
        tensors = {k: torch.cat([g[1][k] for g in groups]) for k in groups[0][1]}
        metrics = {
            "dapo/gen_rounds": float(self.rounds),
            "dapo/groups_dropped": float(len(self.dropped) - filled),
            "dapo/groups_filled": float(filled),
        }
        return [g[0] for g in groups], tensors, metrics


def group_rows(group_ids: Tensor) -> list[list[int]]:
    """Row indices of each group, groups in order of first appearance."""
    rows: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids.tolist()):
        rows.setdefault(gid, []).append(i)
    return list(rows.values())
