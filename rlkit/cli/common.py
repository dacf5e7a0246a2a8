"""What every command shares: one console; user errors as one line + exit code 2, run failures + exit code 1."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import typer
from rich.markup import escape
from rich.syntax import Syntax

from rlkit.console import make_console
from rlkit.core.cluster.failures import RunFailure
from rlkit.core.controller.interrupt import RunInterrupted
from rlkit.errors import UserError

console = make_console()
err_console = make_console(stderr=True, soft_wrap=True)
F = TypeVar("F", bound=Callable)


def print_yaml(text: str) -> None:
    """Highlighted on a terminal; the text itself when redirected (`rlkit recipes show dapo > x.yaml`)."""
    if console.is_terminal:
        console.print(Syntax(text.rstrip("\n"), "yaml", theme="ansi_dark"))
    else:
        console.out(text.rstrip("\n"), highlight=False)


def user_errors(fn: F) -> F:
    """Turn UserError into a red message and exit code 2: no traceback for a fixable mistake."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
            if exc.next_step:
                err_console.print(exc.next_step, markup=False, highlight=False)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def run_failures(fn: F) -> F:
    """Turn RunFailure (a dead, hung or crashed worker, an unwritable checkpoint) into its message
    and exit code 1; the detail (a worker's traceback) follows, dimmed, for bug reports, then how
    to continue. A run stopped by Ctrl-C/SIGTERM prints how to continue and exits with 130/143."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RunFailure as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
            if exc.detail:
                err_console.print(exc.detail.rstrip(), style="dim", markup=False, highlight=False)
            if exc.next_step:
                err_console.print(exc.next_step, markup=False, highlight=False)
            raise typer.Exit(1) from None
        except RunInterrupted as exc:
            err_console.print(str(exc), style="bold yellow", markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:  # another Ctrl-C while the run was already shutting down
            pending = exc.__context__
            text = str(pending) if isinstance(pending, RunInterrupted) else "stopped at once by Ctrl-C"
            err_console.print(text, style="bold yellow", markup=False, highlight=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
