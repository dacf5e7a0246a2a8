"""GSM8K-format synthetic word problems: multi-step arithmetic with worked solutions ending in '#### N'.

A problem is a chain of 2-4 (`min_steps`..`max_steps`) calculations on one quantity: someone has
some items, buys more, gives some away, gets boxes of them, shares them out. The solution has one
line per calculation, plain ("12+5=17") or annotated as GSM8K writes it ("12+5=<<12+5=17>>17"),
and the final answer after '####', so rlkit's GSM8K reward scores it (data_source
`gsm8k/arithmetic` falls back to the `gsm8k` reward). Difficulty knobs: the number of steps,
`max_number` (starting amounts and operands), `max_factor` (multipliers and divisors) and
`max_value` (no intermediate result above it). Every generated question is different; the test
split holds none of the train split's questions.

Rows are RL rows (prompt + ground truth) with `format="rl"` (`rlkit prep-data arithmetic --format rl`, the
default), and SFT rows (the same, plus the worked solution as `response`) with `--format sft`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from rlkit.core.data.builders import Row, make_row
from rlkit.core.data.gsm8k import FORMATS, INSTRUCTION
from rlkit.errors import UserError

DATA_SOURCE = "gsm8k/arithmetic"
NAMES = ["Mia", "Leo", "Ava", "Sam", "Noah", "Emma", "Liam", "Zoe", "Omar", "Lena", "Ivan", "Rosa"]
PRONOUN = {"Mia": "She", "Ava": "She", "Emma": "She", "Zoe": "She", "Lena": "She", "Rosa": "She"}
ITEMS = ["apples", "marbles", "stickers", "cookies", "books", "coins", "pencils", "cards", "shells", "eggs"]
CONTAINERS = ["boxes", "bags", "packs", "jars"]


@dataclass(frozen=True)
class Step:
    """One calculation: the question's sentence, the solution's words before it, and the operation."""

    sentence: str
    words: str
    op: str  # one of + - * /
    operand: int


def _step(
    rng: random.Random,
    value: int,
    person: str,
    pron: str,
    item: str,
    *,
    max_number: int,
    max_factor: int,
    max_value: int,
    last: bool,
) -> Step | None:
    """A random next calculation on `value`, or None when no operation keeps the numbers in range."""
    friend = rng.choice([n for n in NAMES if n != person])
    box = rng.choice(CONTAINERS)
    options = []
    if value < max_value:
        b = rng.randint(1, min(max_number, max_value - value))
        options += [
            rng.choice(
                [
                    Step(f"{pron} buys {b} more {item}.", f"After buying more, {pron.lower()} has", "+", b),
                    Step(f"{friend} gives {person} {b} {item}.", f"With {friend}'s {item}, {pron.lower()} has", "+", b),
                    Step(f"{pron} finds {b} more {item}.", f"After finding more, {pron.lower()} has", "+", b),
                ]
            )
        ]
    if value > 1:
        b = rng.randint(1, min(max_number, value - 1))
        options += [
            rng.choice(
                [
                    Step(
                        f"{pron} gives {b} {item} to {friend}.",
                        f"After giving some to {friend}, {pron.lower()} has",
                        "-",
                        b,
                    ),
                    Step(f"{pron} loses {b} {item}.", f"After losing some, {pron.lower()} has", "-", b),
                    Step(f"{pron} uses {b} {item}.", f"After using some, {pron.lower()} has", "-", b),
                ]
            )
        ]
    if max_factor >= 2 and value * 2 <= max_value:
        k = rng.randint(2, min(max_factor, max_value // value))
        options += [
            rng.choice(
                [
                    Step(
                        f"{pron} fills {k} {box} with that many {item} each.",
                        f"In {k} {box}, {pron.lower()} has",
                        "*",
                        k,
                    ),
                    Step(f"{pron} ends up with {k} times as many {item}.", f"{k} times as many is", "*", k),
                ]
            )
        ]
    divisors = [k for k in range(2, max_factor + 1) if value % k == 0]
    if last and divisors:
        k = rng.choice(divisors)
        options += [Step(f"{pron} shares them equally among {k} {box}.", f"Each of the {k} {box} gets", "/", k)]
    return rng.choice(options) if options else None


def make_problem(
    rng: random.Random,
    *,
    steps: int,
    max_number: int,
    max_factor: int,
    max_value: int,
    calc: Literal["plain", "annotated"] = "plain",
) -> tuple[str, str, int]:
    """(question, worked solution ending in '#### N', N) for a chain of `steps` calculations."""
    while True:
        person, item = rng.choice(NAMES), rng.choice(ITEMS)
        pron = PRONOUN.get(person, "He")
        value = rng.randint(2, max_number)
        sentences, lines = [f"{person} has {value} {item}."], []
        for index in range(steps):
            step = _step(
                rng,
                value,
                person,
                pron,
                item,
                max_number=max_number,
                max_factor=max_factor,
                max_value=max_value,
                last=index == steps - 1,
            )
            if step is None:
                break
            result = {
                "+": value + step.operand,
                "-": value - step.operand,
                "*": value * step.operand,
                "/": value // step.operand if step.operand else 0,
            }[step.op]
            expression = f"{value}{step.op}{step.operand}"
            annotated = f"{expression}=<<{expression}={result}>>{result}"
            shown = annotated if calc == "annotated" else f"{expression}={result}"
            sentences.append(step.sentence)
            lines.append(f"{step.words} {shown}.")
            value = result
        else:
            ask = "How many does each get?" if step.op == "/" else f"How many {item} does {person} have now?"
            return " ".join(sentences + [ask]), "\n".join(lines + [f"#### {value}"]), value


def build_arithmetic(
    source: str | None = None,
    *,
    n_train: int = 20000,
    n_test: int = 500,
    min_steps: int = 2,
    max_steps: int = 4,
    max_number: int = 20,
    max_factor: int = 5,
    max_value: int = 200,
    calc: str = "plain",
    format: str = "rl",
    instruction: str = INSTRUCTION,
    seed: int = 0,
) -> dict[str, list[Row]]:
    """GSM8K-format arithmetic word problems (2-4 steps, worked solutions ending in '#### N'); seeded.

    `format`: "rl" (prompt + ground truth) or "sft" (also the worked solution as `response`);
    `calc`: "plain" (12+5=17) or "annotated" (12+5=<<12+5=17>>17, GSM8K's own style).
    """
    if format not in FORMATS:
        raise UserError(
            f"arithmetic: format={format!r}; choose one of {', '.join(FORMATS)} (rl: prompt + ground "
            "truth; sft: also the worked solution as `response`)"
        )
    if calc not in ("plain", "annotated"):
        raise UserError(f"-o calc={calc!r}: use 'plain' (12+5=17) or 'annotated' (12+5=<<12+5=17>>17)")
    if not 1 <= min_steps <= max_steps:
        raise UserError(f"-o min_steps={min_steps} -o max_steps={max_steps}: need 1 <= min_steps <= max_steps")
    if max_number < 2 or max_value < max_number + 1:
        raise UserError(
            f"-o max_number={max_number} -o max_value={max_value}: need max_number >= 2 and max_value > max_number"
        )
    rng, seen = random.Random(seed), set()
    splits: dict[str, list[Row]] = {}
    for split, count in (("train", n_train), ("test", n_test)):
        rows: list[Row] = []
        for attempt in range(50 * count):
            if len(rows) == count:
                break
            question, solution, answer = make_problem(
                rng,
                steps=rng.randint(min_steps, max_steps),
                max_number=max_number,
                max_factor=max_factor,
                max_value=max_value,
                calc=calc,
            )  # type: ignore[arg-type]
            if question in seen:  # a held-out test question is never a train question
                continue
            seen.add(question)
            rows.append(_row(question, solution, answer, split, len(rows), instruction, format))
        if len(rows) < count:
            raise UserError(
                f"only {len(rows)} different {split} problems at these settings (asked {count}); "
                "raise max_number/max_steps or ask fewer"
            )
        splits[split] = rows
    return splits


def _row(question: str, solution: str, answer: int, split: str, index: int, instruction: str, format: str) -> Row:
    content = f"{question} {instruction}" if instruction else question
    row = make_row(
        DATA_SOURCE, content, str(answer), split=split, index=index, ability="math", question=question, answer=solution
    )
    return {**row, "response": solution} if format == "sft" else row


def corpus(splits: dict[str, list[Row]]) -> list[str]:
    """Every prompt and solution text of the train split: what a tokenizer for the task is trained on."""
    texts: list[str] = []
    for row in splits["train"]:
        texts.append(row["prompt"][0]["content"])
        texts.append(row["extra_info"]["answer"])
    return texts
