"""GSM8K (openai/gsm8k, MIT): grade-school word problems; the answer is the number after '####'."""

from __future__ import annotations

import re
from typing import Any

from rlkit.core.data.builders import (
    Dropped,
    Row,
    make_row,
    read_source,
)
from rlkit.core.rewards.gsm8k import to_number
from rlkit.errors import UserError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
FORMATS = ("rl", "sft")
# GSM8K's calculator annotations, "48/2 = <<48/2=24>>24": traces of how the solutions were written,
# not text a model should learn to write.
CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")


def build_gsm8k(
    source: str | None = None, *, instruction: str = INSTRUCTION, format: str = "rl"
) -> dict[str, list[Row | Dropped]]:
    """GSM8K math word problems (7,473 train / 1,319 test); ground truth = the number after '####'.

    `instruction` is appended to each question ('' for none); records need 'question' and 'answer'.
    `format` sft adds a `response` column: the reference solution, ending in '#### N', without
    its calculator annotations (<<48/2=24>>), for `rlkit train sft`.
    """
    if format not in FORMATS:
        raise UserError(f"gsm8k: format={format!r}; choose one of {', '.join(FORMATS)}")
    return {
        split: [_row(record, split, index, instruction, format) for index, record in enumerate(records)]
        for split, records in read_source(source, DATA_SOURCE, "main").items()
    }


def _row(record: dict[str, Any], split: str, index: int, instruction: str, format: str) -> Row | Dropped:
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip():
        return Dropped("no 'question' text")
    if not isinstance(answer, str) or "####" not in answer:
        return Dropped("no '####' in 'answer'")
    ground_truth = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if to_number(ground_truth) is None:
        return Dropped("the text after '####' is not a number")
    content = f"{question} {instruction}" if instruction else question
    row = make_row(
        DATA_SOURCE, content, ground_truth, split=split, index=index, ability="math", question=question, answer=answer
    )
    if format == "sft":
        row["response"] = CALCULATOR_ANNOTATION.sub("", answer).strip()
    return row
