"""Arithmetic whose answer needs the `calculator` tool: one operation on multi-digit numbers ('What is 4837*2916?').

A small model cannot multiply four-digit numbers in its head; with `rollout.agent.tools=[calculator]` it only has
to copy the numbers into a call and the tool's result after '####'. The same problems make both sides of the
comparison (`tool`):
  calculator  `--format sft` rows are chats (`messages`) with a `tools` column (the calculator's schema, as JSON):
              the user's question, the assistant's call
              `<tool_call>{"name": "calculator", "arguments": {"expression": "4837*2916"}}</tool_call>`, the
              tool's answer, the assistant's '#### 14104692': the format a warm start for
              `rollout.agent.loop=tool` learns, in the tokenizer's chat template (tools=, tool calls, results).
  none        `--format sft` rows are prompt + response '#### 14104692': the no-tool baseline, taught the answer.
`--format rl` rows (the default) are prompt + ground truth, scored by the GSM8K reward (data_source
`gsm8k/tool_arithmetic`), the same for both: the tool loop shows the tools (`rollout.agent.tools`), a single-turn
run shows none. Seeded; the test split holds none of the train split's questions. The builder lives with the
agents (as `prep-data verifiers` does): its rows carry the calculator's own schema (rlkit.core.agents.tools).
"""

from __future__ import annotations

import json
import random

from rlkit.core.agents.builtin_tools import calculator
from rlkit.core.agents.tools import function_schema
from rlkit.core.data.builders import Row, make_row
from rlkit.core.data.gsm8k import FORMATS
from rlkit.errors import UserError

DATA_SOURCE = "gsm8k/tool_arithmetic"
INSTRUCTION = "Give the answer after '####'."
TOOLS = ("calculator", "none")
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def build_tool_arithmetic(
    source: str | None = None,
    *,
    n_train: int = 20000,
    n_test: int = 256,
    min_digits: int = 3,
    max_digits: int = 4,
    ops: str = "*",
    tool: str = "calculator",
    format: str = "rl",
    instruction: str = INSTRUCTION,
    seed: int = 0,
) -> dict[str, list[Row]]:
    """'What is A op B?' with A and B of `min_digits`..`max_digits` digits and op one of `ops` (+ - *); seeded.

    `tool`: "calculator" (SFT rows call the calculator and copy its answer) or "none" (SFT rows give the answer);
    `format`: "rl" (prompt + ground truth, the same for both tools) or "sft".
    """
    if format not in FORMATS:
        raise UserError(f"tool-arithmetic: format={format!r}; choose one of {', '.join(FORMATS)}")
    if tool not in TOOLS:
        raise UserError(f"-o tool={tool!r}: use 'calculator' (SFT rows call it) or 'none' (SFT rows answer without it)")
    if not 1 <= min_digits <= max_digits:
        raise UserError(f"-o min_digits={min_digits} -o max_digits={max_digits}: need 1 <= min_digits <= max_digits")
    if not ops or set(ops) - set(OPERATIONS):
        raise UserError(f"-o ops={ops!r}: give one or more of {''.join(OPERATIONS)}, e.g. -o ops='*' or -o ops='+*'")
    rng, seen = random.Random(seed), set()
    schema = json.dumps([function_schema(calculator)])
    splits: dict[str, list[Row]] = {}
    for split, count in (("train", n_train), ("test", n_test)):
        rows: list[Row] = []
        for _ in range(50 * count):
            if len(rows) == count:
                break
            a, b = (_number(rng, rng.randint(min_digits, max_digits)) for _ in range(2))
            expression = f"{a}{rng.choice(ops)}{b}"
            if expression in seen:  # a held-out test question is never a train question
                continue
            seen.add(expression)
            rows.append(_row(expression, split, len(rows), instruction, tool, format, schema))
        if len(rows) < count:
            raise UserError(
                f"only {len(rows)} different {split} problems at these settings (asked {count}); "
                "raise max_digits or ask fewer"
            )
        splits[split] = rows
    return splits


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def _row(expression: str, split: str, index: int, instruction: str, tool: str, format: str, schema: str) -> Row:
    answer = str(int(calculator(expression)))
    content = f"What is {expression}? {instruction}" if instruction else f"What is {expression}?"
    row = make_row(DATA_SOURCE, content, answer, split=split, index=index, ability="math", expression=expression)
    if format == "rl":
        return row
    if tool == "none":
        return {**row, "response": f"#### {answer}"}
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    messages = [
        *row["prompt"],
        {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": f"#### {answer}"},
    ]
    return {**row, "messages": messages, "tools": schema}  # SFT reads `messages` where a row has no `response`
