"""GSM8K preference pairs for `rlkit train dpo`: chosen = the reference solution, rejected = the same
solution with a wrong final answer.

The wrong answer is the right one moved by a seeded offset (1-9, up or down, never below zero for a
non-negative answer), written consistently: every occurrence of the answer on the last line of the
working that states it (the final calculation, e.g. "48+24 = 72 clips") and the "#### N" line. So
the two responses differ only where the solution goes wrong, which is what DPO should learn from.
Each row is the gsm8k builder's RL row plus `chosen` and `rejected`.
"""

from __future__ import annotations

import random
import re
from decimal import Decimal

from rlkit.core.data.builders import Dropped, Row
from rlkit.core.data.gsm8k import INSTRUCTION, build_gsm8k
from rlkit.core.rewards.gsm8k import to_number

# GSM8K's calculator annotations, "<<48/2=24>>": generator hints, not text a model should write.
_CALCULATION = re.compile(r"<<[^<>]*>>")
_NUMBER = re.compile(r"(?<![\d.])\d[\d,]*(?:\.\d+)?(?![\d])")


def build_gsm8k_pairs(
    source: str | None = None, *, instruction: str = INSTRUCTION, seed: int = 0, keep_calculations: bool = False
) -> dict[str, list[Row | Dropped]]:
    """GSM8K preference pairs: chosen = the reference solution, rejected = it with a wrong final answer.

    `seed` picks each row's wrong answer (deterministic per split and row); `keep_calculations`
    keeps GSM8K's <<a*b=c>> annotations in both responses (dropped by default).
    """
    return {
        split: [row if isinstance(row, Dropped) else _pair(row, seed, keep_calculations) for row in rows]
        for split, rows in build_gsm8k(source, instruction=instruction).items()
    }


def _pair(row: Row, seed: int, keep_calculations: bool) -> Row | Dropped:
    info = row["extra_info"]
    answer = to_number(row["reward_model"]["ground_truth"])
    if answer is None or answer != answer.to_integral_value():
        return Dropped("the final answer is not a whole number")
    solution = info["answer"] if keep_calculations else _CALCULATION.sub("", info["answer"])
    wrong = wrong_answer(int(answer), random.Random(f"{seed}:{info['split']}:{info['index']}"))
    # The RL row's columns stay (data_source, reward_model, ...): `rlkit eval` scores a DPO run's generations on them.
    return {
        **row,
        "chosen": solution,
        "rejected": corrupt_solution(solution, int(answer), wrong),
        "extra_info": {**info, "wrong_answer": str(wrong)},
    }


def wrong_answer(answer: int, rng: random.Random) -> int:
    """The answer moved by 1-9 up or down; down only while it stays >= 0 (for a non-negative answer)."""
    offset = rng.randint(1, 9)
    if rng.random() < 0.5 and (answer < 0 or answer - offset >= 0):
        return answer - offset
    return answer + offset


def corrupt_solution(solution: str, answer: int, wrong: int) -> str:
    """`solution` with its final answer `answer` replaced by `wrong`, on the "#### N" line and on the last
    line of the working that states the answer."""
    body, _, _ = solution.rpartition("####")
    lines = body.rstrip("\n").split("\n")

    def states_answer(line: str) -> bool:
        return any(Decimal(m.group().replace(",", "")) == answer for m in _NUMBER.finditer(line))

    for i in range(len(lines) - 1, -1, -1):
        if states_answer(lines[i]):
            lines[i] = _NUMBER.sub(
                lambda m: str(wrong) if Decimal(m.group().replace(",", "")) == answer else m.group(), lines[i]
            )
            break
    return "\n".join(lines) + f"\n#### {wrong}"
