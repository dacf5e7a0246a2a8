"""Named registries: a recipe, a data row or a command line names a function with a string.

The names and where each function lives are listed in one place, rlkit.core.registrations, not added
by the modules that define the functions; a function's module is imported on its name's first lookup.
A user's own function is named by its file instead ('path/file.py:function').
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Maps a string name to a callable; unknown names fail with the closest known one.

    `entries`: name -> 'module:attribute', resolved (and kept) on the name's first `get`: knowing the
    names imports nothing, and a lookup never depends on which modules were imported before it.
    """

    def __init__(self, kind: str, entries: dict[str, str]) -> None:
        self.kind = kind
        self._items: dict[str, F | str] = dict(entries)

    def get(self, name: str) -> F:
        try:
            item = self._items[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None
        if isinstance(item, str):  # imported on its first lookup
            module, _, attribute = item.partition(":")
            item = self._items[name] = getattr(importlib.import_module(module), attribute)
        return item

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._items, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r} (known: {', '.join(sorted(self._items))}){hint}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
