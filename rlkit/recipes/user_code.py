"""Config values that name user code: a string, or (from the Python API, `rlkit.train`) the object itself.

A string is 'path/file.py:name' or 'python:module:qualname' (an object of an importable module). An
object stays an object in the config that the run's processes receive (Ray and the reward worker
processes get copies through cloudpickle); config.yaml, which holds only text, records it as
'python:module:qualname' (`reference`). That string names the object again when its module can be
imported (not `__main__`, not a function defined inside another); otherwise a resume has to be given
the object again (rlkit.core.rewards.custom.resolve says so).
"""

from __future__ import annotations

from typing import Annotated, Any, Callable

from pydantic import PlainSerializer

PYTHON_REF = "python:"


def reference(value: Any) -> str:
    """A config value as config.yaml records it: a string as it is, an object as 'python:module:qualname'
    (an instance, e.g. a callable object or a functools.partial: its type's name followed by '()')."""
    if isinstance(value, str):
        return value
    named = value if hasattr(value, "__qualname__") else type(value)
    suffix = "" if named is value else "()"
    return f"{PYTHON_REF}{getattr(named, '__module__', None) or '?'}:{named.__qualname__}{suffix}"


# A string, or any callable (a function, a class, a callable object); written to YAML/JSON as `reference`.
UserCode = Annotated[str | Callable[..., Any], PlainSerializer(reference, return_type=str, when_used="json")]
