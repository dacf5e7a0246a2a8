"""What every command shares: one console, and user errors as one line + exit code 2."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import typer
from rich.console import Console

from rlkit.errors import UserError

console = Console()
err_console = Console(stderr=True, soft_wrap=True)
F = TypeVar("F", bound=Callable)


def user_errors(fn: F) -> F:
    """Turn UserError into a red message and exit code 2: no traceback for a fixable mistake."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
