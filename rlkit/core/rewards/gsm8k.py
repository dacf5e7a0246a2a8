"""GSM8K reward: extract the final number and compare it with the ground truth as a number.

'strict' takes the number after the last '####' (the format GSM8K solutions use and the
prompt asks for); 'flexible' takes the last number anywhere. Numbers compare by value:
'72.0' = '72', '1,000' = '1000', '$18' = '18', '−5' (unicode minus) = '-5'.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

# A number: a minus not glued to a word ('3-5' is 3 and 5), an optional '$', digits in
# comma groups of three or plain, optional decimals. Linear time: no nested repeats.
_NUMBER = r"(?:(?<![\w)])-)?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
_STRICT = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)
_NORMALIZE = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff04": "$"})


def extract_answer(response: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The answer text the method finds in `response`, or None when there is none."""
    text = response.translate(_NORMALIZE)
    if method == "strict":
        matches = _STRICT.findall(text)
    elif method == "flexible":
        matches = _ANY_NUMBER.findall(text)
    else:
        raise ValueError(f"unknown GSM8K extraction method {method!r}; use 'strict' or 'flexible'")
    return matches[-1] if matches else None


def to_number(text: str) -> Decimal | None:
    """'$1,000.50' -> Decimal('1000.50'); None for text that is not a number."""
    cleaned = text.translate(_NORMALIZE).replace(",", "").replace("$", "").replace(" ", "").strip()
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def gsm8k_reward(
    response: str,
    ground_truth: str,
    extra_info: dict[str, Any],
    *,
    gsm8k_method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
) -> dict[str, float]:
    """1 for the right number, `format_score` for a wrong one, 0 when no answer is found."""
    expected = to_number(ground_truth)
    if expected is None:
        raise ValueError(f"ground truth {ground_truth!r} is not a number (fix reward_model.ground_truth)")
    answer = extract_answer(response, gsm8k_method)
    found = answer is not None
    correct = found and to_number(answer) == expected
    score = 1.0 if correct else (format_score if found else 0.0)
    return {"score": score, "answer_found": float(found)}


def gsm8k_answer(response: str, *, gsm8k_method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The number the reward would grade, by value ('72.0', '$72' and '72' are one answer)."""
    answer = extract_answer(response, gsm8k_method)
    number = to_number(answer) if answer is not None else None
    return None if number is None else format(number.normalize(), "f")
