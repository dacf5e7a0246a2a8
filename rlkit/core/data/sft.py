"""Supervised fine-tuning rows: parquet -> token ids with a loss mask, checked row by row.

Two row formats (`rlkit prep-data gsm8k --format sft` writes the first):
  prompt + response  `prompt` as RL rows have it (chat messages, or a plain string) and
                     `response` (str). Tokens: the prompt through the chat template with the
                     generation prompt, then the response's own tokens and the tokenizer's EOS.
  messages           a whole chat (list of {role, content}); every assistant turn is trained.
                     Tokens: the chat template, cut at turn boundaries (each prefix of the chat
                     rendered on its own must start the next one), never the joined text re-tokenized.
Either may carry `tools`: the function schemas (a list, or that list as a JSON string) the chat
template shows (`tools=`), as rlkit's tool loop shows `rollout.agent.tools` to the policy: a warm
start for `rollout.agent.loop=tool` (`rlkit prep-data tool-arithmetic --format sft`) trains on the
prompts the tool loop will give it, and its tool results (messages with role "tool") are context.
An example is a prompt (context only) and a response whose loss mask is 1 on trained tokens,
the layout of a rollout batch (rlkit.core.batch), so packing and the optimize loop are RL's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from rlkit.core.batch import Batch, padded_tensors
from rlkit.core.data.dataset import (
    messages_problem,
    open_parquet,
    prompt_problem,
    response_token_ids,
    tokenize_prompt,
)
from rlkit.errors import UserError

FORMATS = (("prompt", "response"), ("messages",))  # the columns of each row format
SHOWN_PROBLEMS = 5  # bad rows named in the error; the rest are counted
logger = logging.getLogger(__name__)


@dataclass
class SFTExample:
    """One training sequence: context tokens, then tokens whose loss mask says which are trained."""

    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]


def read_sft_file(path: str, key: str) -> list[dict[str, Any]]:
    """The rows of one parquet file with prompt + response or messages columns."""
    file = open_parquet(path, required=())
    names = file.schema_arrow.names
    if not any(all(c in names for c in columns) for columns in FORMATS):
        raise UserError(
            f"data file {path} ({key}) has columns {names}; SFT rows need 'prompt' + 'response' "
            "or 'messages' (see `rlkit prep-data gsm8k --format sft`)"
        )
    return file.read().to_pylist()


def tokenize_sft_rows(
    sources: list[tuple[str, list[dict[str, Any]]]],
    tokenizer: Any,
    *,
    max_length: int,
    completion_only: bool = True,
    overlong: str = "error",
) -> list[SFTExample]:
    """(file name, rows) per source -> examples; every bad row is collected and reported with its file
    and row (UserError): no response, nothing to train, or longer than `max_length` tokens (which
    `overlong="filter"` drops instead, with a warning)."""
    examples: list[SFTExample] = []
    problems: list[str] = []
    dropped = 0
    for name, rows in sources:
        for i, row in enumerate(rows):
            try:
                prompt, response, mask = tokenize_sft_row(row, tokenizer)
            except ValueError as exc:
                problems.append(f"{name}, row {i}: {exc}")
                continue
            if len(prompt) + len(response) > max_length:
                if overlong == "filter":
                    dropped += 1
                    continue
                problems.append(
                    f"{name}, row {i}: {len(prompt)} prompt + {len(response)} response tokens > "
                    f"data.max_prompt_length + data.max_response_length = {max_length}"
                )
                continue
            if not completion_only:  # every token but the first is a target
                full = prompt + response
                prompt, response, mask = full[:1], full[1:], [1] * (len(full) - 1)
            examples.append(SFTExample(len(examples), prompt, response, mask))
    if problems:
        more = f" (the first {SHOWN_PROBLEMS} shown)" if len(problems) > SHOWN_PROBLEMS else ""
        raise UserError(
            f"{len(problems)} bad SFT row(s){more}: "
            + "; ".join(problems[:SHOWN_PROBLEMS])
            + ". Fix or drop them; for long rows raise data.max_response_length or set "
            "data.overlong_prompts=filter"
        )
    if not examples:
        raise UserError(
            f"no usable rows in {[name for name, _ in sources]} ({dropped} longer than "
            f"data.max_prompt_length + data.max_response_length = {max_length} dropped)"
        )
    if dropped:
        logger.warning(
            "dropped %d of %d SFT rows longer than data.max_prompt_length + data.max_response_length = %d "
            "(data.overlong_prompts=filter)",
            dropped,
            dropped + len(examples),
            max_length,
        )
    return examples


def tokenize_sft_row(row: dict[str, Any], tokenizer: Any) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, loss mask) of one row; ValueError says what is wrong with it."""
    tools = row_tools(row)
    if row.get("messages") is not None and row.get("response") is None:
        problem = messages_problem(row["messages"], "messages")
        if problem:
            raise ValueError(problem)
        return _tokenize_messages(row["messages"], tokenizer, tools)
    prompt, response = row.get("prompt"), row.get("response")
    problem = prompt_problem(prompt)
    if problem:
        raise ValueError(problem)
    if not isinstance(response, str) or not response.strip():
        raise ValueError("column 'response' is missing or empty")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token to end the response with")
    response_ids = response_token_ids(tokenizer, response)
    return tokenize_prompt(tokenizer, prompt, tools), response_ids, [1] * len(response_ids)


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A row's `tools` column: None, a list of function schemas, or that list as JSON (parquet keeps a JSON
    string as written; a list of schemas whose parameters differ would be widened with null fields)."""
    tools = row.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ValueError(f"column 'tools' is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("column 'tools' must be a list of function schemas (or that list as a JSON string)")
    return tools or None


def _tokenize_messages(
    messages: list[dict[str, Any]], tokenizer: Any, tools: list[dict[str, Any]] | None
) -> tuple[list[int], list[int], list[int]]:
    """A chat cut at its assistant turns: tokens before the first one are the prompt; each assistant
    turn is trained up to and including its first EOS (what the template writes after it is context)."""
    if not tokenizer.chat_template:
        raise ValueError("'messages' needs a chat template, and the tokenizer has none")
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise ValueError("'messages' has no assistant message to train on")
    if turns[0] == 0:
        raise ValueError(
            "'messages' starts with an assistant message; put the system or user message it answers before it"
        )
    if any(not (m.get("content") or "").strip() for m in messages if m.get("role") == "assistant"):
        raise ValueError("'messages' has an empty assistant message")
    ids: list[int] = []
    mask: list[int] = []

    def extend(rendered: list[int], trained: bool) -> None:
        if rendered[: len(ids)] != ids:
            raise ValueError(
                "the chat template renders an earlier part of this chat differently once later "
                "messages follow, so its turns cannot be cut token-exactly"
            )
        new = rendered[len(ids) :]
        if trained:
            end = new.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in new else len(new)
            mask.extend([1] * end + [0] * (len(new) - end))
        else:
            mask.extend([0] * len(new))
        ids.extend(new)

    for turn in turns:
        extend(_render(tokenizer, messages[:turn], tools, generation_prompt=True), trained=False)
        extend(_render(tokenizer, messages[: turn + 1], tools, generation_prompt=False), trained=True)
    if turns[-1] + 1 < len(messages):
        extend(_render(tokenizer, messages, tools, generation_prompt=False), trained=False)
    prompt_end = mask.index(1)  # the first assistant token: everything before it is context
    return ids[:prompt_end], ids[prompt_end:], mask[prompt_end:]


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, generation_prompt: bool
) -> list[int]:
    if not messages:
        return []
    return list(
        tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
    )


def sft_batch(examples: list[SFTExample], pad_id: int) -> Batch:
    """The examples in the rollout batch layout: context left of the response, the loss mask on it."""
    tensors = padded_tensors(
        [e.prompt_ids for e in examples], [e.response_ids for e in examples], [e.loss_mask for e in examples], pad_id
    )
    return Batch(tensors, {"row_index": [e.index for e in examples]})
