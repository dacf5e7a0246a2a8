"""The container that travels between the controller and the workers.

Tensors share a leading batch dimension (one row per sampled sequence); `meta` holds
per-row Python values (data_source, ground truth, ...). Layout of a rollout batch:
  input_ids       [B, P+R]  prompt left-padded to P, response right-padded to R
  attention_mask  [B, P+R]
  position_ids    [B, P+R]
  responses       [B, R]    response token ids (pad after the end): policy and environment tokens
  response_mask   [B, R]    the loss mask: 1 on tokens the policy generated (0 on padding and on
                            tool/environment tokens, which attention_mask still covers)
  rollout_log_probs [B, R]  log-probs the engine sampled with (steps that ask for them)
  rollout_log_prob_rows [B] the rows that have them (all but on a check step: a share, rlkit.core.rollout.stages)
  group_ids [B], finished [B], policy_version [B]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlkit.core.rollout.trajectory import Trajectory


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        for t in self.tensors.values():
            return t.shape[0]
        for v in self.meta.values():
            return len(v)
        return 0

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if self.tensors and value.shape[0] != len(self):
            raise ValueError(f"{key} has {value.shape[0]} rows, batch has {len(self)}")
        self.tensors[key] = value

    def update(self, tensors: dict[str, torch.Tensor]) -> Batch:
        for key, value in tensors.items():
            self[key] = value
        return self

    def select(self, index: list[int] | torch.Tensor) -> Batch:
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        return Batch(
            {k: v[idx] for k, v in self.tensors.items()}, {k: [v[i] for i in rows] for k, v in self.meta.items()}
        )

    def chunk(self, parts: int) -> list[Batch]:
        """`parts` equal slices in order (the caller guarantees divisibility)."""
        size = len(self) // parts
        if size * parts != len(self):
            raise ValueError(f"cannot split {len(self)} rows into {parts} equal parts")
        return [self.select(list(range(i * size, (i + 1) * size))) for i in range(parts)]

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: to_device(v, device) for k, v in self.tensors.items()}, self.meta)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`. From the host to a GPU the copy is queued without waiting for it (pinned memory,
    non_blocking): a copy from pageable memory first waits for every kernel queued before it, so each
    micro-batch's inputs left the GPU idle while the host packed and launched the next one."""
    if torch.device(device).type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def shard_minibatches(
    batch: Batch, rows_per_minibatch: int, world: int, epochs: int = 1
) -> list[tuple[list[Batch], list[dict[str, float]]]]:
    """Per rank: (its equal share of each mini-batch, every mini-batch's global loss-token and
    sequence counts). Mini-batches are consecutive `rows_per_minibatch` rows, `epochs` times over."""
    shards: list[list[Batch]] = [[] for _ in range(world)]
    norms = []
    for _ in range(epochs):
        for mb in batch.chunk(len(batch) // rows_per_minibatch):
            mask = mb["response_mask"]
            norms.append({"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum())})
            for rank, shard in enumerate(mb.chunk(world)):
                shards[rank].append(shard)
    return [(shards[r], norms) for r in range(world)]


def pad_to_ranks(batch: Batch, world: int) -> Batch:
    """`batch` (tensors only) with rows added until every rank gets as many: copies of its first rows
    whose loss mask is 0, so they count for nothing (a held-out pass over a set of any size)."""
    short = -len(batch) % world
    if not short:
        return batch
    filler = batch.select([i % len(batch) for i in range(short)])
    filler["response_mask"] = torch.zeros_like(filler["response_mask"])
    return Batch({k: torch.cat([batch[k], filler[k]]) for k in batch.tensors})


def padded_tensors(
    prompts: list[list[int]], responses: list[list[int]], loss_masks: list[list[float]], pad_id: int
) -> dict[str, torch.Tensor]:
    """Prompts left-padded and responses right-padded into the layout above: input_ids,
    attention_mask, position_ids, responses, response_mask (the loss mask)."""
    width_p = max(len(p) for p in prompts)
    width_r = max(max(len(r) for r in responses), 1)
    n = len(prompts)
    input_ids = torch.full((n, width_p + width_r), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width_p + width_r), dtype=torch.long)
    loss_mask = torch.zeros((n, width_r))
    for i, (p, r, m) in enumerate(zip(prompts, responses, loss_masks)):
        input_ids[i, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
        input_ids[i, width_p : width_p + len(r)] = torch.tensor(r, dtype=torch.long)
        attention[i, width_p - len(p) : width_p + len(r)] = 1
        loss_mask[i, : len(r)] = torch.tensor(m, dtype=torch.float32)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": position_ids,
        "responses": input_ids[:, width_p:].clone(),
        "response_mask": loss_mask,
    }


def build_batch(trajectories: list[Trajectory], pad_id: int) -> Batch:
    """Pad prompts left and responses right into the Batch layout (see rlkit.core.batch).

    The loss mask comes from each trajectory: attention covers every real token, the loss only
    the policy's own.
    """
    tensors = padded_tensors(
        [t.prompt_ids for t in trajectories],
        [t.response_ids for t in trajectories],
        [t.loss_mask for t in trajectories],
        pad_id,
    )
    loss_mask = tensors["response_mask"]
    with_log_probs = any(t.log_probs for t in trajectories)  # the engine was asked for them
    if with_log_probs:
        rollout_lp = torch.zeros_like(loss_mask)
        for i, t in enumerate(trajectories):
            rollout_lp[i, : len(t.log_probs)] = torch.tensor(t.log_probs)
        tensors["rollout_log_probs"] = rollout_lp * loss_mask
        tensors["rollout_log_prob_rows"] = torch.tensor([bool(t.log_probs) for t in trajectories])
    return Batch(
        tensors={
            **tensors,
            "group_ids": torch.tensor([t.group for t in trajectories]),
            "finished": torch.tensor([t.finished for t in trajectories]),
            "policy_version": torch.tensor([t.policy_version for t in trajectories]),
        },
        meta={
            "row_index": [t.row.index for t in trajectories],
            "data_source": [t.row.data_source for t in trajectories],
            "ground_truth": [t.row.ground_truth for t in trajectories],
            "extra_info": [t.row.extra_info for t in trajectories],
            "env_reward": [t.reward for t in trajectories],
        },
    )
