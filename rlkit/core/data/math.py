"""MATH competition problems (DigitalLearningGmbH/MATH-lighteval): ground truth from `\\boxed{}`."""

from __future__ import annotations

from typing import Any

from rlkit.core.data.builders import (
    Dropped,
    Row,
    make_row,
    read_source,
)
from rlkit.core.rewards.math import last_boxed

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def build_math(source: str | None = None, *, instruction: str = INSTRUCTION) -> dict[str, list[Row | Dropped]]:
    """MATH problems (7,500 train / 5,000 test); ground truth = the last \\boxed{} of the solution.

    `instruction` is appended to each problem ('' for none); records need 'problem' and
    'solution' ('level' and 'type' are kept in extra_info when present).
    """
    return {
        split: [_row(record, split, index, instruction) for index, record in enumerate(records)]
        for split, records in read_source(source, DATA_SOURCE).items()
    }


def _row(record: dict[str, Any], split: str, index: int, instruction: str) -> Row | Dropped:
    problem, solution = record.get("problem"), record.get("solution")
    if not isinstance(problem, str) or not problem.strip():
        return Dropped("no 'problem' text")
    if not isinstance(solution, str):
        return Dropped("no 'solution' text")
    ground_truth = last_boxed(solution)
    if not ground_truth:
        return Dropped("no \\boxed{} answer in 'solution'")
    content = f"{problem} {instruction}" if instruction else problem
    extra = {key: record[key] for key in ("level", "type") if key in record}
    return make_row(
        DATA_SOURCE,
        content,
        ground_truth,
        split=split,
        index=index,
        ability="math",
        question=problem,
        answer=solution,
        **extra,
    )
