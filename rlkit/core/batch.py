"""The container that travels between the controller and the workers.

Tensors share a leading batch dimension (one row per sampled sequence); `meta` holds
per-row Python values (data_source, ground truth, ...). Layout of a rollout batch:
  input_ids       [B, P+R]  prompt left-padded to P, response right-padded to R
  attention_mask  [B, P+R]
  position_ids    [B, P+R]
  responses       [B, R]    response token ids (pad after the end)
  response_mask   [B, R]    1 on real response tokens
  rollout_log_probs [B, R]  log-probs the engine sampled with (steps that ask for them)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlkit.core.data.dataset import PromptRow
    from rlkit.core.rollout.base import RolloutSample


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
        return Batch({k: v[idx] for k, v in self.tensors.items()},
                     {k: [v[i] for i in rows] for k, v in self.meta.items()})

    def chunk(self, parts: int) -> list[Batch]:
        """`parts` equal slices in order (the caller guarantees divisibility)."""
        size = len(self) // parts
        if size * parts != len(self):
            raise ValueError(f"cannot split {len(self)} rows into {parts} equal parts")
        return [self.select(list(range(i * size, (i + 1) * size))) for i in range(parts)]

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.meta)


def build_batch(samples: list[tuple[PromptRow, int, RolloutSample]], pad_id: int) -> Batch:
    """Pad prompts left and responses right into the Batch layout (see rlkit.core.batch)."""
    width_p = max(len(row.prompt_token_ids) for row, _, _ in samples)
    width_r = max(max(len(s.token_ids) for _, _, s in samples), 1)
    n = len(samples)
    input_ids = torch.full((n, width_p + width_r), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width_p + width_r), dtype=torch.long)
    rollout_lp = torch.zeros((n, width_r))
    with_log_probs = any(s.log_probs for _, _, s in samples)  # the engine was asked for them
    for i, (row, _, sample) in enumerate(samples):
        p, r = row.prompt_token_ids, sample.token_ids
        input_ids[i, width_p - len(p):width_p] = torch.tensor(p)
        input_ids[i, width_p:width_p + len(r)] = torch.tensor(r, dtype=torch.long)
        attention[i, width_p - len(p):width_p + len(r)] = 1
        if with_log_probs:
            rollout_lp[i, :len(r)] = torch.tensor(sample.log_probs)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        tensors={"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
                 "responses": input_ids[:, width_p:].clone(), "response_mask": attention[:, width_p:].float(),
                 **({"rollout_log_probs": rollout_lp} if with_log_probs else {}),
                 "group_ids": torch.tensor([index for _, index, _ in samples]),
                 "finished": torch.tensor([s.finished for _, _, s in samples])},
        meta={"row_index": [row.index for row, _, _ in samples],
              "data_source": [row.data_source for row, _, _ in samples],
              "ground_truth": [row.ground_truth for row, _, _ in samples],
              "extra_info": [row.extra_info for row, _, _ in samples]},
    )
