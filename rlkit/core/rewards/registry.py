"""Rule-based reward functions, looked up by a row's `data_source`.

A reward function takes (response, ground_truth, extra_info) and returns a float or a
dict with a "score" key (its other keys become metrics).
"""

from __future__ import annotations

from typing import Any, Callable

from rlkit.core.registry import Registry

RewardFn = Callable[[str, str, dict[str, Any]], "float | dict[str, float]"]
REWARD_FNS: Registry[RewardFn] = Registry("reward function for data_source")


def reward_fn_for(data_source: str) -> RewardFn:
    """The function for a data_source; 'synthetic/echo' falls back to 'synthetic' if unregistered."""
    name = data_source
    while name not in REWARD_FNS and "/" in name:
        name = name.rsplit("/", 1)[0]
    return REWARD_FNS.get(name if name in REWARD_FNS else data_source)
