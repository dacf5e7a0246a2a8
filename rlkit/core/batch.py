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
from typing import Any

import torch


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
