"""Rule-based reward functions and answer extractors, looked up by a row's `data_source`.

A reward function takes (response, ground_truth, extra_info) and returns a float or a
dict with a "score" key (its other keys become metrics). An answer extractor takes a
response and returns its final answer as a comparable string (None when it has none);
validation's majority vote (maj@k) groups responses by it. A reward function may declare its
range (score_range); the scorer clamps its scores into it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from rlkit.core.registrations import ANSWER_FNS, REWARD_FNS
from rlkit.core.registry import Registry
from rlkit.errors import UserError

RewardFn = Callable[[str, str, dict[str, Any]], "float | dict[str, float]"]
AnswerFn = Callable[..., "str | None"]  # fn(response, **reward options it declares) -> answer or None


def _lookup_name(registry: Registry, data_source: str) -> str:
    """'synthetic/echo' falls back to 'synthetic' when only the family is registered."""
    name = data_source
    while name not in registry and "/" in name:
        name = name.rsplit("/", 1)[0]
    return name if name in registry else data_source


def reward_fn_for(data_source: str) -> RewardFn:
    """The reward function for a data_source."""
    return REWARD_FNS.get(_lookup_name(REWARD_FNS, data_source))


def answer_fn_for(data_source: str) -> AnswerFn | None:
    """The answer extractor for a data_source, or None when its answers cannot be compared."""
    name = _lookup_name(ANSWER_FNS, data_source)
    return ANSWER_FNS.get(name) if name in ANSWER_FNS else None


def score_range(low: float, high: float) -> Callable[[RewardFn], RewardFn]:
    """Declare a reward function's range (as `@score_range(0.0, 1.0)` above its def, or `fn.score_range = (0, 1)`):
    the scorer clamps its scores into [low, high]. Functions without one are not clamped."""

    def declare(fn: RewardFn) -> RewardFn:
        fn.score_range = (float(low), float(high))  # type: ignore[attr-defined]
        return fn

    return declare


def declared_range(fn: Callable[..., Any], name: str) -> tuple[float, float] | None:
    """The (low, high) a reward function declares with registry.score_range, or None; UserError if malformed."""
    declared = getattr(fn, "score_range", None)
    if declared is None:
        return None
    try:
        low, high = (float(bound) for bound in declared)
    except (TypeError, ValueError):
        low, high = math.nan, math.nan
    if not low <= high:
        raise UserError(f"{name}.score_range={declared!r}: expected (low, high) with low <= high")
    return low, high


def clamp(score: float, bounds: tuple[float, float] | None) -> float:
    """`score` moved into `bounds` (None: unchanged)."""
    return score if bounds is None else min(max(score, bounds[0]), bounds[1])
