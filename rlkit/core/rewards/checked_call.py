"""A reward call whose raw return value is judged in the reward worker, before the scorer sees it.

Its own module, importing nothing heavy: every reward worker process unpickles it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from rlkit.errors import shown


class ReturnValueProblem(Exception):
    """A reward call returned something the run cannot train on (raised in the reward worker)."""


def value_problem(value: Any) -> str | None:
    """What makes a reward's return value unusable (not a finite number, nor a dict of them with 'score'), or None."""
    if isinstance(value, dict):
        if "score" not in value:
            return f"returned a dict without a 'score' key (keys: {sorted(map(str, value))})"
        return next(
            (
                f"returned key {key!r} = {shown(v)}, not a finite number"
                for key, v in value.items()
                if _not_finite(v) and not (key == "reason" and isinstance(v, str))  # worker_pool.REASON_KEY
            ),
            None,
        )
    return f"returned {shown(value)}, not a finite number" if _not_finite(value) else None


def _not_finite(value: Any) -> bool:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        return True
    return not math.isfinite(float(value))


@dataclass(frozen=True)
class CheckedCall:
    """The reward, its return value judged where it ran (picklable: it crosses into the reward workers)."""

    fn: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        value = self.fn(*args)
        problem = value_problem(value)
        if problem:
            raise ReturnValueProblem(problem)
        return value
