"""Prompt datasets for training: parquet rows -> token ids, and a sampler that resumes exactly."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from rlkit.errors import UserError, shown

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
    prompt_text: str | None = None  # the text the ids were encoded from (the rendered chat); None: built from ids
    prompt: Any = None  # the row's `prompt` as the data holds it (chat messages or a string), for agents and envs


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
        raise UserError(
            f"data file {path} lacks column(s) {missing}; rows need {list(required)} "
            "(see `rlkit prep-data --help` for the schema)"
        )
    return file


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return open_parquet(path).read().to_pylist()


MESSAGES_EXPECTED = 'a list of {"role", "content"} messages whose role and content are strings'
PROMPT_EXPECTED = f"a string or {MESSAGES_EXPECTED}"


def messages_problem(messages: Any, column: str) -> str | None:
    """What keeps `messages` (a row's `column`) from being chat messages, or None."""
    if not isinstance(messages, list):
        return f"column {column!r} holds {shown(messages)}; expected {MESSAGES_EXPECTED}"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"column {column!r}, message {i} is {shown(message)}; expected a {{'role', 'content'}} dict"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"column {column!r}, message {i} has {key} {shown(message.get(key))}; expected a string"
    return None


def prompt_problem(prompt: Any) -> str | None:
    """What keeps a row's `prompt` from being tokenized (not text or chat messages, or empty), or None."""
    if isinstance(prompt, str):
        return None if prompt else "column 'prompt' is empty"
    if not isinstance(prompt, list):
        return f"column 'prompt' holds {shown(prompt)}; expected {PROMPT_EXPECTED}"
    problem = messages_problem(prompt, "prompt")
    if problem is None and not any(m["content"] for m in prompt):
        return "column 'prompt' is empty"
    return problem


def row_problem(raw: dict[str, Any]) -> str | None:
    """What keeps an RL prompt row from loading (its prompt, data_source, reward_model, extra_info), or None."""
    problem = prompt_problem(raw["prompt"])
    if problem:
        return problem
    if not isinstance(raw["data_source"], str):
        return f"column 'data_source' holds {shown(raw['data_source'])}; expected a string (it picks the reward rule)"
    reward_info = raw.get("reward_model")
    if reward_info is not None and not isinstance(reward_info, dict):
        return f"column 'reward_model' holds {shown(reward_info)}; expected a struct with a 'ground_truth' string"
    truth = (reward_info or {}).get("ground_truth")
    if truth is not None and (isinstance(truth, bool) or not isinstance(truth, (str, int, float))):
        return (
            f"column 'reward_model.ground_truth' holds {shown(truth)}; expected a string (encode structured "
            "answers as JSON text, or put them in 'extra_info')"
        )
    extra = raw.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        return f"column 'extra_info' holds {shown(extra)}; expected a struct (a dict) or nothing"
    return None


def render_prompt(tokenizer, messages: Any, tools: list[dict[str, Any]] | None = None) -> str:
    """The text a prompt is tokenized from: a string as it is, chat messages through the chat template (with
    `tools`, function schemas, where given) and the generation prompt."""
    if isinstance(messages, str):
        return messages
    if not tokenizer.chat_template:
        raise UserError(
            "the tokenizer has no chat template, but the prompts are chat messages; "
            "use a model with a chat template or store prompts as plain strings"
        )
    return tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=False)


def encode_rendered(tokenizer, text: str) -> list[int]:
    """A rendered prompt's token ids, no special tokens added (what apply_chat_template(tokenize=True) does)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_prompt(tokenizer, messages: Any, tools: list[dict[str, Any]] | None = None) -> list[int]:
    """A prompt's token ids (see render_prompt)."""
    return encode_rendered(tokenizer, render_prompt(tokenizer, messages, tools))


def response_token_ids(tokenizer, text: str) -> list[int]:
    """A response's tokens, then EOS: what SFT and preference rows train on after the prompt (tokenized
    alone, never joined to the prompt's text and re-tokenized)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def load_prompt_dataset(
    files: list[str],
    tokenizer,
    *,
    max_prompt_length: int,
    overlong: str = "error",
    tools: list[dict[str, Any]] | None = None,
) -> list[PromptRow]:
    """All rows of `files`, tokenized (with the tools the policy may call); prompts longer than
    max_prompt_length error or are dropped."""
    return tokenize_rows(
        [(file, read_rows(file)) for file in files],
        tokenizer,
        max_prompt_length=max_prompt_length,
        overlong=overlong,
        tools=tools,
    )


def tokenize_rows(
    sources: list[tuple[str, list[dict[str, Any]]]],
    tokenizer,
    *,
    max_prompt_length: int,
    overlong: str = "error",
    tools: list[dict[str, Any]] | None = None,
) -> list[PromptRow]:
    """(name, raw rows) per source -> PromptRows (chat prompts with the `tools` the policy may call);
    errors name the source and the row."""
    rows: list[PromptRow] = []
    dropped = 0
    for name, raw_rows in sources:
        for i, raw in enumerate(raw_rows):
            where = f"{name}, row {i}"
            problem = row_problem(raw)
            if problem:
                raise UserError(f"{where}: {problem}")
            text = render_prompt(tokenizer, raw["prompt"], tools)
            ids = encode_rendered(tokenizer, text)
            if len(ids) > max_prompt_length:
                if overlong == "filter":
                    dropped += 1
                    continue
                raise UserError(
                    f"{where}: prompt has {len(ids)} tokens > data.max_prompt_length="
                    f"{max_prompt_length}; raise it or set data.overlong_prompts=filter"
                )
            truth = (raw.get("reward_model") or {}).get("ground_truth")
            rows.append(
                PromptRow(
                    index=len(rows),
                    prompt_token_ids=ids,
                    data_source=raw["data_source"],
                    ground_truth="" if truth is None else str(truth),
                    extra_info=dict(raw.get("extra_info") or {}),
                    prompt_text=text,
                    prompt=raw["prompt"],
                )
            )
    if not rows:
        raise UserError(f"no usable rows in {[name for name, _ in sources]} ({dropped} dropped as too long)")
    if dropped:
        logger.warning(
            "dropped %d of %d prompts longer than data.max_prompt_length=%d (data.overlong_prompts=filter)",
            dropped,
            dropped + len(rows),
            max_prompt_length,
        )
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
        batch = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
