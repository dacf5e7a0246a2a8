"""Named registries: a new estimator, loss or reward is a function plus a decorator."""

from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Maps a string name to a callable; unknown names fail with the closest known one."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, *names: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            for name in names:
                if name in self._items and self._items[name] is not fn:
                    raise ValueError(f"{self.kind} {name!r} is registered twice")
                self._items[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._items, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r} (known: {', '.join(sorted(self._items))}){hint}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
