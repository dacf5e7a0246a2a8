"""Math reward through `math-verify`: the response's answer against the `\\boxed{}` ground truth.

math-verify parses LaTeX and plain expressions into sympy and compares them as math
(1/2 = 0.5 = \\frac12, sets, intervals, percentages). It is an optional dependency
(`pip install 'rlkit[math]'`) and imported on first use, so registering costs nothing.
"""

from __future__ import annotations

import threading
from typing import Any

# math-verify's own per-parse timeout (seconds); it uses SIGALRM, so only in the main thread.
_MATH_VERIFY_TIMEOUT = 5


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, `\\boxed N`) in text, braces matched."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
    if rest.startswith(" "):  # "\boxed 5": the argument runs to the next '$' or end
        return rest[1:].split("$", 1)[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced braces


def math_reward(
    response: str, ground_truth: str, extra_info: dict[str, Any], *, format_score: float = 0.0
) -> dict[str, float]:
    """1 when math-verify finds the response's answer equal to the ground truth, else
    `format_score` when it finds an answer at all, else 0."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ImportError("the math reward needs math-verify: pip install 'rlkit[math]'") from None
    timeout = _MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math-verify cannot parse the ground truth {ground_truth!r}")
    answer = parse(response, parsing_timeout=timeout)
    found = bool(answer)
    correct = found and verify(gold, answer, timeout_seconds=timeout)
    return {"score": 1.0 if correct else (format_score if found else 0.0), "answer_found": float(found)}


def math_answer(response: str) -> str | None:
    """The last \\boxed{} content without spaces: a textual key, so '1/2' and '0.5' count as two answers."""
    boxed = last_boxed(response)
    if boxed is None:
        return None
    return "".join(boxed.split()) or None
