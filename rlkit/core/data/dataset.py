"""Prompt datasets for training: parquet rows -> token ids, and a sampler that resumes exactly."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from rlkit.errors import UserError

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
logger = logging.getLogger(__name__)


@dataclass
class PromptRow:
    """One training prompt, tokenized once at load time (tokens in, tokens out)."""

    index: int
    prompt_token_ids: list[int]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)


def open_parquet(path: str | Path, required: tuple[str, ...] = REQUIRED_COLUMNS) -> pq.ParquetFile:
    """The file, opened (footer and schema read); UserError if it is missing, not parquet, or lacks
    `required` columns (an RL prompt row's by default)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"data file {path} does not exist (run `rlkit prep-data ...` or fix data.train_files)")
    try:
        file = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for "not parquet"
        raise UserError(f"data file {path} is not a readable parquet file: {exc}") from None
    missing = [c for c in required if c not in file.schema_arrow.names]
    if missing:
        raise UserError(f"data file {path} lacks column(s) {missing}; rows need {list(required)} "
                        "(see `rlkit prep-data --help` for the schema)")
    return file


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return open_parquet(path).read().to_pylist()


def tokenize_prompt(tokenizer, messages: Any, tools: list[dict[str, Any]] | None = None) -> list[int]:
    """A prompt's token ids; chat messages through the chat template, with `tools` (function schemas) where given."""
    if isinstance(messages, str):
        return tokenizer(messages, add_special_tokens=False)["input_ids"]
    if not tokenizer.chat_template:
        raise UserError("the tokenizer has no chat template, but the prompts are chat messages; "
                        "use a model with a chat template or store prompts as plain strings")
    return list(tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def response_token_ids(tokenizer, text: str) -> list[int]:
    """A response's tokens, then EOS: what SFT and preference rows train on after the prompt (tokenized
    alone, never joined to the prompt's text and re-tokenized)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def load_prompt_dataset(files: list[str], tokenizer, *, max_prompt_length: int,
                        overlong: str = "error", tools: list[dict[str, Any]] | None = None) -> list[PromptRow]:
    """All rows of `files`, tokenized (with the tools the policy may call); prompts longer than
    max_prompt_length error or are dropped."""
    return tokenize_rows([(file, read_rows(file)) for file in files], tokenizer,
                         max_prompt_length=max_prompt_length, overlong=overlong, tools=tools)


def tokenize_rows(sources: list[tuple[str, list[dict[str, Any]]]], tokenizer, *, max_prompt_length: int,
                  overlong: str = "error", tools: list[dict[str, Any]] | None = None) -> list[PromptRow]:
    """(name, raw rows) per source -> PromptRows (chat prompts with the `tools` the policy may call);
    errors name the source and the row."""
    rows: list[PromptRow] = []
    dropped = 0
    for name, raw_rows in sources:
        for i, raw in enumerate(raw_rows):
            where = f"{name}, row {i}"
            messages = raw["prompt"]
            if not messages or (not isinstance(messages, str) and not any(m.get("content") for m in messages)):
                raise UserError(f"{where}: column 'prompt' is empty")
            ids = tokenize_prompt(tokenizer, messages, tools)
            if len(ids) > max_prompt_length:
                if overlong == "filter":
                    dropped += 1
                    continue
                raise UserError(f"{where}: prompt has {len(ids)} tokens > data.max_prompt_length="
                                f"{max_prompt_length}; raise it or set data.overlong_prompts=filter")
            reward_info = raw.get("reward_model") or {}
            rows.append(PromptRow(
                index=len(rows),
                prompt_token_ids=ids,
                data_source=str(raw["data_source"]),
                ground_truth=str(reward_info.get("ground_truth", "")),
                extra_info=dict(raw.get("extra_info") or {}),
            ))
    if not rows:
        raise UserError(f"no usable rows in {[name for name, _ in sources]} ({dropped} dropped as too long)")
    if dropped:
        logger.warning("dropped %d of %d prompts longer than data.max_prompt_length=%d (data.overlong_prompts=filter)",
                       dropped, dropped + len(rows), max_prompt_length)
    return rows


class PromptSampler:
    """Yields batches of row indices, epoch after epoch; its state is two integers.

    Each epoch's order is a permutation seeded by (seed, epoch), so resuming from
    {epoch, position} reproduces exactly the batches an uninterrupted run would see.
    A tail shorter than a batch is dropped (every step sees the same number of prompts).
    """

    def __init__(self, num_rows: int, batch_size: int, *, seed: int, shuffle: bool = True) -> None:
        self.check_size(num_rows, batch_size)
        self.num_rows, self.batch_size, self.seed, self.shuffle = num_rows, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0

    @staticmethod
    def check_size(num_rows: int, batch_size: int) -> None:
        if batch_size > num_rows:
            raise UserError(f"data.train_batch_size={batch_size} is larger than the dataset ({num_rows} rows)")

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.num_rows, generator=gen).tolist()

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.num_rows:
            self.epoch, self.position = self.epoch + 1, 0
        batch = self._order()[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
