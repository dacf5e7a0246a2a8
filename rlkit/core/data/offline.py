"""Rows of the offline objectives: how each reads its data files and lays rows out as a token batch.

The offline controller (rlkit.core.controller.offline) knows rows only through a `RowKind`:
`load` reads and tokenizes a data key's files (every bad row reported with its file and row),
`batch` lays a list of loaded rows out in the rollout batch layout (rlkit.core.batch) with the
loss mask on the trained tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from rlkit.core.batch import Batch
from rlkit.core.data.pairs import pair_batch, read_pair_rows, tokenize_pairs
from rlkit.core.data.sft import read_sft_file, sft_batch, tokenize_sft_rows
from rlkit.recipes.model_schema import DataConfig
from rlkit.recipes.trainer_schema import SFTConfig


def load_sft(data: DataConfig, sft: SFTConfig, files: list[str], key: str, tokenizer: Any) -> list[Any]:
    return tokenize_sft_rows(
        [(file, read_sft_file(file, key)) for file in files],
        tokenizer,
        max_length=data.max_prompt_length + data.max_response_length,
        completion_only=sft.completion_only_loss,
        overlong=data.overlong_prompts,
    )


def load_pairs(data: DataConfig, files: list[str], key: str, tokenizer: Any) -> list[Any]:
    return tokenize_pairs(
        [(file, read_pair_rows(file, key)) for file in files],
        tokenizer,
        max_prompt_length=data.max_prompt_length,
        max_response_length=data.max_response_length,
        overlong=data.overlong_prompts,
    )


@dataclass(frozen=True)
class RowKind:
    load: Callable[[list[str], str, Any], list[Any]]  # (files, data key, tokenizer) -> rows
    batch: Callable[[list[Any], int], Batch]  # (rows, pad id) -> token batch
    what: str  # rows, in words (preflight's summary)


def row_kind(objective: str, data: DataConfig, sft: SFTConfig) -> RowKind:
    """The rows of `objective` (sft, dpo), read within `data`'s lengths (and `sft`'s options)."""
    kinds = {
        "sft": RowKind(partial(load_sft, data, sft), sft_batch, "prompt + response / messages rows"),
        "dpo": RowKind(partial(load_pairs, data), pair_batch, "preference pairs (prompt, chosen, rejected)"),
    }
    return kinds[objective]
