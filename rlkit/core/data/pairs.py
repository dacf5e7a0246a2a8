"""Preference pairs for `rlkit train dpo`: parquet rows -> token ids, checked row by row.

A row (one parquet record):
  prompt    list[{role, content}]   chat messages, exactly as an RL prompt row (or a plain string)
  chosen    str                     the preferred response
  rejected  str                     the dispreferred response
Other columns (data_source, extra_info, ...) are kept out of training and may be anything.

Tokenisation never re-tokenises joined text: the prompt goes through the chat template with the
generation prompt, each response is tokenised on its own and ends with the tokenizer's EOS (for a
chat model, the end-of-turn token), so the model learns where an answer stops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.core.batch import Batch, padded_tensors
from rlkit.core.data.dataset import open_parquet, prompt_problem, response_token_ids, tokenize_prompt
from rlkit.errors import UserError

PAIR_COLUMNS = ("prompt", "chosen", "rejected")
SHOWN_PROBLEMS = 5  # bad pairs named in the error; the rest are counted
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairRow:
    """One preference pair, tokenised once at load time."""

    index: int
    prompt_token_ids: list[int]
    chosen_token_ids: list[int]  # the response's tokens + EOS
    rejected_token_ids: list[int]


def read_pair_rows(path: str | Path, key: str) -> list[dict[str, Any]]:
    """Every row of a pair file; UserError if it is missing, not parquet, empty or lacks a column."""
    file = open_parquet(path, required=PAIR_COLUMNS)
    if file.metadata.num_rows == 0:
        raise UserError(f"data file {path} ({key}) has no rows")
    return file.read(columns=list(PAIR_COLUMNS)).to_pylist()


def pair_problem(raw: dict[str, Any]) -> str | None:
    """What makes a row unusable before tokenising it, or None."""
    for column in ("chosen", "rejected"):
        if not isinstance(raw[column], str):
            return f"'{column}' is {type(raw[column]).__name__}, not text"
        if not raw[column].strip():
            return f"'{column}' is empty"
    if raw["chosen"] == raw["rejected"]:
        return "'chosen' and 'rejected' are the same text: the pair teaches nothing"
    return prompt_problem(raw["prompt"])


def tokenize_pairs(
    sources: list[tuple[str, list[dict[str, Any]]]],
    tokenizer: Any,
    *,
    max_prompt_length: int,
    max_response_length: int,
    overlong: str = "error",
) -> list[PairRow]:
    """(file, raw rows) per source -> PairRows. Every bad pair is collected and reported with its file and
    row (UserError, the first SHOWN_PROBLEMS named, the rest counted); a pair whose prompt + longer
    response is over max_prompt_length + max_response_length tokens is one, or with overlong="filter"
    is dropped (and counted in a warning)."""
    budget = max_prompt_length + max_response_length
    pairs: list[PairRow] = []
    problems: list[str] = []
    dropped = 0
    for name, raw_rows in sources:
        for i, raw in enumerate(raw_rows):
            problem = pair_problem(raw)
            if problem:
                problems.append(f"{name}, row {i}: {problem}")
                continue
            prompt = tokenize_prompt(tokenizer, raw["prompt"])
            chosen = response_token_ids(tokenizer, raw["chosen"])
            rejected = response_token_ids(tokenizer, raw["rejected"])
            longest = len(prompt) + max(len(chosen), len(rejected))
            if longest > budget:
                if overlong == "filter":
                    dropped += 1
                else:
                    problems.append(
                        f"{name}, row {i}: prompt ({len(prompt)} tokens) + the longer response "
                        f"({longest - len(prompt)} tokens with EOS) is {longest} tokens > "
                        f"data.max_prompt_length + data.max_response_length = {budget}"
                    )
                continue
            pairs.append(PairRow(len(pairs), prompt, chosen, rejected))
    if problems:
        more = f" (the first {SHOWN_PROBLEMS} shown)" if len(problems) > SHOWN_PROBLEMS else ""
        raise UserError(
            f"{len(problems)} bad pair(s){more}: "
            + "; ".join(problems[:SHOWN_PROBLEMS])
            + ". Fix or remove them; for long pairs raise the lengths or set data.overlong_prompts=filter"
        )
    if not pairs:
        raise UserError(f"no usable pairs in {[name for name, _ in sources]} ({dropped} dropped as too long)")
    if dropped:
        logger.warning(
            "dropped %d of %d pairs longer than data.max_prompt_length + data.max_response_length = %d "
            "(data.overlong_prompts=filter)",
            dropped,
            dropped + len(pairs),
            budget,
        )
    return pairs


def pair_batch(pairs: list[PairRow], pad_id: int) -> Batch:
    """The pairs in the rollout batch layout, rows interleaved chosen, rejected, chosen, ...: the
    prompt as context, the loss mask on each response and its EOS."""
    prompts = [p.prompt_token_ids for p in pairs for _ in range(2)]
    responses = [ids for p in pairs for ids in (p.chosen_token_ids, p.rejected_token_ids)]
    tensors = padded_tensors(prompts, responses, [[1] * len(ids) for ids in responses], pad_id)
    return Batch(tensors, {"row_index": [p.index for p in pairs for _ in range(2)]})
