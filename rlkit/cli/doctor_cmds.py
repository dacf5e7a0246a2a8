"""Commands that look before a run spends anything: `rlkit doctor` and `rlkit plan`. Printing only."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from rlkit.cli.common import console, user_errors

LEVEL_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "fail": "bold red"}
DEFAULT_RECIPE = "grpo"


def register(app: typer.Typer) -> None:
    app.command()(doctor)


def _config(recipe: Optional[str], overrides: Optional[list[str]], model: Optional[str]):
    """The config a run would use: RECIPE (default grpo) with overrides; a first argument with '=' is an override."""
    from rlkit.recipes.loader import load_config

    overrides = list(overrides or [])
    if recipe and "=" in recipe:
        recipe, overrides = None, [recipe, *overrides]
    return load_config(recipe or DEFAULT_RECIPE, overrides, model=model, require_inputs=False)


@user_errors
def doctor(
    recipe: Optional[str] = typer.Argument(None, help="Recipe whose settings to check against (default: grpo)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. trainer.n_gpus_per_node=8."),
    model: Optional[str] = typer.Option(None, "--model", help="Policy model (sets model.path; sizes the disk check)."),
) -> None:
    """Check this machine before a run: versions against the tested matrix, GPUs and free memory, NCCL
    settings, the Ray cluster (RAY_ADDRESS), free disk. Exit code 0 when all is well, 1 when a run would fail.

    Example: rlkit doctor grpo trainer.n_gpus_per_node=8
    """
    from rlkit.core.doctor import LEVELS, exit_code, run_checks

    findings = run_checks(_config(recipe, overrides, model))
    table = Table("", "check", "found", "what to do")
    for f in findings:
        table.add_row(f"[{LEVEL_STYLE[f.level]}]{f.level}[/]", f.check, f.found, f.fix)
    console.print(table)
    counts = {level: sum(f.level == level for f in findings) for level in LEVELS}
    code = exit_code(findings)
    verdict = "[bold red]a run would fail[/]" if code else "[green]ready[/]"
    console.print(f"{verdict}: " + ", ".join(f"{n} {level}" for level, n in counts.items() if n)
                  + "  (tested versions: docs/compatibility.md)")
    raise typer.Exit(code)
