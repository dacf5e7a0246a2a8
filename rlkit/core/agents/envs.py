"""Environments: user Python that answers the policy's turns.

An environment is a class; rlkit makes one instance per episode and calls
  reset(row) -> observation                  before the first turn
  step(action) -> (observation, reward, done) after every policy turn
  close()                                    where it defines one: after the worker's episodes ended
(any may be `async def`). `row` is the episode's data row as a dict (index, data_source, ground_truth,
extra_info); `action` is the policy's turn as text. An observation is None
(reset: keep the row's prompt), a string (a user message), a message dict
{"role", "content"} or a list of them. `reward` is a number or None; the episode's reward is
the sum of the numbers it got (None if it got none: then the reward functions score it).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

from rlkit.core.registrations import ENVIRONMENTS
from rlkit.errors import UserError
from rlkit.recipes.user_code import reference

Message = dict[str, Any]


def load_env_class(spec: str | type, key: str = "rollout.agent.env") -> type:
    """The class `spec` names (a registered name, 'path/file.py:ClassName', or the class itself), checked to be
    usable."""
    from rlkit.core.rewards.custom import names_code, resolve

    if isinstance(spec, str) and spec in ENVIRONMENTS:
        cls = ENVIRONMENTS.get(spec)
    elif names_code(spec):
        cls = resolve(spec, key)
    else:
        raise UserError(
            f"{key}={spec!r}: {ENVIRONMENTS.unknown_message(spec)}; name your own as 'path/file.py:ClassName'"
        )
    check_env_class(cls, f"{key}={reference(spec)!r}")
    return cls


def check_env_class(cls: Any, where: str) -> None:
    """A class whose reset and step each take one argument besides self."""
    if not inspect.isclass(cls):
        raise UserError(
            f"{where}: names {type(cls).__name__} {getattr(cls, '__name__', cls)!r}, not a class with "
            "reset(row) and step(action)"
        )
    for method, argument in (("reset", "row"), ("step", "action")):
        fn = getattr(cls, method, None)
        if not callable(fn):
            raise UserError(f"{where}: class {cls.__name__} has no method {method}({argument})")
        try:
            inspect.signature(fn).bind(None, argument)
        except TypeError:
            raise UserError(
                f"{where}: {cls.__name__}.{method}{inspect.signature(fn)} cannot be called as "
                f"{method}({argument}); define it as def {method}(self, {argument})"
            ) from None


def env_factory(cls: type, kwargs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: cls(**kwargs)


def row_dict(row: Any) -> dict[str, Any]:
    """What an environment (`reset`) and an agent function see of a PromptRow: its prompt as the data holds it
    (chat messages or a string) and its other columns."""
    return {
        "index": row.index,
        "prompt": row.prompt,
        "data_source": row.data_source,
        "ground_truth": row.ground_truth,
        "extra_info": row.extra_info,
    }


def as_messages(observation: Any, what: str) -> list[Message]:
    """An observation as chat messages; ValueError (naming `what`) for anything else."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    items = [observation] if isinstance(observation, dict) else observation
    if isinstance(items, (list, tuple)) and items and all(_is_message(m) for m in items):
        return [dict(m) for m in items]
    raise ValueError(
        f"{what} returned an observation of {_show(observation)}; expected a string, a message "
        "{'role': ..., 'content': str} or a list of them"
    )


def parse_step(result: Any) -> tuple[list[Message] | None, float | None, bool]:
    """step()'s (observation, reward, done), checked: ValueError says what is wrong."""
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise ValueError(f"step returned {_show(result)}; expected a tuple (observation, reward, done)")
    observation, reward, done = result
    if not isinstance(done, (bool, int)) or isinstance(done, float):
        raise ValueError(f"step returned done={_show(done)}; expected True or False")
    if reward is not None:
        if isinstance(reward, (str, bytes)) or not hasattr(reward, "__float__") or not math.isfinite(float(reward)):
            raise ValueError(f"step returned reward={_show(reward)}; expected a finite number or None")
        reward = float(reward)
    if done:
        return None, reward, True
    return as_messages(observation, "step"), reward, False


def _is_message(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("role"), str) and isinstance(item.get("content"), str)


def _show(value: Any) -> str:
    return f"{value!r:.80} ({type(value).__name__})"
