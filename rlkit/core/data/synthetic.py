"""Synthetic tasks with verifiable answers, small enough for a tiny model to learn on 2 cores.

Prompts and answers use only the tiny tokenizer's characters (rlkit.core.tiny). The
reward is exact match of the stripped response; GRPO alone moves a 0.3M-parameter model
on `echo` from chance (~0.1) to > 0.9 within ~100 steps (measured on the tiny model).
`lookup` is the tool-calling demo (grpo-agent-demo): its tool and reward are defined here too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from rlkit.core.data.builders import Row, make_row

# name -> fn(rng) -> (prompt text, answer)
# Where a run directory keeps the prompts a synthetic task generated for it.
SYNTHETIC_TRAIN_FILE = Path("data") / "train.parquet"
TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {}


def _task(name: str):
    def decorator(fn):
        TASKS[name] = fn
        return fn

    return decorator


@_task("echo")
def _echo(rng: random.Random) -> tuple[str, str]:
    d = rng.randrange(10)
    return f"echo {d}", str(d)


@_task("succ")
def _succ(rng: random.Random) -> tuple[str, str]:
    d = rng.randrange(10)
    return f"{d}+1=", str((d + 1) % 10)


@_task("add")
def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"{a}+{b}=", str((a + b) % 10)


@_task("lookup")
def _lookup(rng: random.Random) -> tuple[str, str]:
    """The tool-calling demo: the answer is a random digit that only the `lookup` tool knows."""
    return "secret?", str(rng.randrange(10))


def build_synthetic(
    source: str | None = None, *, task: str = "echo", n_train: int = 1024, n_test: int = 128, seed: int = 0, **_: Any
) -> dict[str, list[Row]]:
    """Rows for `task` ("echo", "succ", "add" or "lookup"); deterministic in `seed`."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; choose one of {sorted(TASKS)}")
    rng = random.Random(seed)
    splits: dict[str, list[Row]] = {}
    for split, count in (("train", n_train), ("test", n_test)):
        rows = []
        for index in range(count):
            content, answer = TASKS[task](rng)
            rows.append(make_row(f"synthetic/{task}", content, answer, split=split, index=index, ability="synthetic"))
        splits[split] = rows
    return splits


def exact_match_reward(response: str, ground_truth: str, extra_info: dict[str, Any]) -> float:
    return 1.0 if response.strip() == ground_truth.strip() else 0.0


def synthetic_answer(response: str) -> str | None:
    """The whole stripped response is the answer (what exact match grades)."""
    return response.strip() or None


def lookup_reward(response: str, ground_truth: str, extra_info: dict[str, Any]) -> float:
    """1 for the secret digit answered after a `lookup` call; 0.2 for a call and a wrong digit;
    0 without a call (an answer without it is a guess) or without a digit after the last call."""
    answer = lookup_answer(response)
    if answer is None:
        return 0.0
    if answer == ground_truth.strip():
        return 1.0
    return 0.2 if answer.isdigit() else 0.0


def lookup_answer(response: str) -> str | None:
    """What follows the last tool call (None without a call, an answer without it being a guess, or
    without anything after it)."""
    if "</tool_call>" not in response:
        return None
    return response.rsplit("</tool_call>", 1)[1].strip() or None


def lookup_tool(config: Any) -> Callable[..., Any]:
    return lookup


def lookup(row: dict[str, Any]) -> str:
    """Look up the secret digit of this task."""
    return row["ground_truth"]
