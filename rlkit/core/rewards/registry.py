"""Rule-based reward functions and answer extractors, looked up by a row's `data_source`.

A reward function takes (response, ground_truth, extra_info) and returns a float or a
dict with a "score" key (its other keys become metrics). An answer extractor takes a
response and returns its final answer as a comparable string (None when it has none);
validation's majority vote (maj@k) groups responses by it.
"""

from __future__ import annotations

from typing import Any, Callable

from rlkit.core.registry import Registry

RewardFn = Callable[[str, str, dict[str, Any]], "float | dict[str, float]"]
REWARD_FNS: Registry[RewardFn] = Registry("reward function for data_source")
AnswerFn = Callable[..., "str | None"]  # fn(response, **reward options it declares) -> answer or None
ANSWER_FNS: Registry[AnswerFn] = Registry("answer extractor for data_source")


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
