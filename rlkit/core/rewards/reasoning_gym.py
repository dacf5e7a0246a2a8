"""reasoning-gym's own scorers, rebuilt from what a `rlkit prep-data reasoning-gym` row holds.

A row's extra_info keeps three things (data_source 'reasoning_gym/<task>'):
  task    the task's name in reasoning-gym ('chain_sum')
  config  the task's config as JSON: the -o options the data was built with, plus its seed and size
  entry   the generated entry as JSON: {question, answer, metadata}, metadata as the task wrote it
The reward rebuilds the task's dataset from (task, config) — once per worker process and config — and calls
its `score_answer(answer, entry)`: the number reasoning-gym itself gives, partial credit included. The answer is
what reasoning-gym's `extract_answer` finds: the text inside the last <answer>...</answer> (None without one,
which its scorers grade 0).

The JSON is rlkit.core.rewards.plain_data's encoding, so tuples, sets and dicts with non-string keys in a
task's metadata come back as they were written. A metadata value of any other type (a datetime.time) is stored
as its str(); `rlkit prep-data` checks every row it writes by scoring the task's own answer with the rebuilt
scorer and the stored entry, and drops a row whose score differs from the task's.

reasoning-gym (`pip install reasoning-gym`) is imported on the first call; in a reward worker process that
first call takes about 2-3 s (the package imports all its tasks), inside reward.timeout_s.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from rlkit.core.rewards import plain_data
from rlkit.core.rewards.registry import score_range

if TYPE_CHECKING:
    from reasoning_gym.dataset import ProceduralDataset

DATA_SOURCE_PREFIX = "reasoning_gym"
EXTRA_KEYS = ("task", "config", "entry")
_PLAIN_LEAVES = (type(None), bool, int, float, str, bytes, bytearray)


def import_reasoning_gym() -> Any:
    """The `reasoning_gym` package, or an ImportError that says how to install it."""
    try:
        import reasoning_gym
        import reasoning_gym.utils  # noqa: F401 - its extract_answer
    except ImportError:
        raise ImportError("these tasks need the reasoning-gym package: pip install 'rlkit[reasoning]'") from None
    return reasoning_gym


def _storable(value: Any) -> Any:
    """`value` with every part plain_data cannot encode (a datetime.time, a Fraction) as its str()."""
    if isinstance(value, _PLAIN_LEAVES):
        return value
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(_storable(item) for item in value)
    return str(value)


def to_json(value: Any) -> str:
    """`value` as one JSON text that `from_json` turns back into it (up to the str() of exotic leaves)."""
    return json.dumps(plain_data.encode(_storable(value)), sort_keys=True)


def from_json(text: str) -> Any:
    return plain_data.decode(json.loads(text))


@functools.lru_cache(maxsize=32)
def dataset_for(task: str, config_json: str) -> ProceduralDataset:
    """The task's dataset built with the stored config (cached: rows of one split share one)."""
    return import_reasoning_gym().create_dataset(task, **from_json(config_json))


def extract_answer(response: str) -> str | None:
    """What reasoning-gym grades: the stripped text of the last <answer>...</answer>, None without one."""
    return import_reasoning_gym().utils.extract_answer(response)


def _stored(extra_info: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    missing = [key for key in EXTRA_KEYS if not isinstance((extra_info or {}).get(key), str)]
    if missing:
        raise ValueError(
            f"extra_info has no {missing[0]!r} text: not a row of `rlkit prep-data reasoning-gym` "
            "(build the data with it, or set reward.function for rows of your own)"
        )
    return extra_info["task"], extra_info["config"], from_json(extra_info["entry"])


@score_range(0.0, 1.0)
def reasoning_gym_reward(response: str, ground_truth: str, extra_info: dict[str, Any]) -> dict[str, float]:
    """The task's own `score_answer` on the response's <answer>...</answer> (0 to 1, partial credit as the task
    gives it); `answer_found` says whether the response had answer tags. ground_truth is not read: the stored
    entry holds the answer, and the metadata some tasks score by."""
    task, config_json, entry = _stored(extra_info)
    answer = extract_answer(response)
    score = dataset_for(task, config_json).score_answer(answer, entry)
    return {"score": float(score), "answer_found": float(answer is not None)}


def reasoning_gym_answer(response: str) -> str | None:
    """The answer the reward grades, for majority voting (maj@n): the last <answer>...</answer>'s text."""
    return extract_answer(response) or None
