"""`rlkit algos check`: the RL math against hand-computed cases and, where installed, verl. Printing only;
the work lives in rlkit.core.algos.parity."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from rlkit.cli.common import console, user_errors
from rlkit.errors import UserError

REFERENCES = ("auto", "verl", "trl", "none")
STATUS_STYLE = {"ok": "green", "differs": "bold red", "missing": "bold red", "lacks": "yellow"}

algos_app = typer.Typer(help="Check the registered estimators, losses and KL estimators.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(algos_app, name="algos")


@algos_app.command("check")
@user_errors
def check(
    only: Optional[list[str]] = typer.Option(
        None, "--only", help="Check only this registered name (repeatable), e.g. --only grpo --only vanilla."
    ),
    reference: str = typer.Option(
        "auto", "--reference", help="auto (verl when installed), verl, trl or none (the hand-computed cases only)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Every registered advantage estimator, policy loss, KL estimator and aggregation mode on small batches
    worked out by hand, and against verl's functions on seeded random batches where verl is installed: the
    largest difference per item. Exit code 0 when every check passes, 1 when one differs beyond its tolerance
    or a registered name has no hand-computed case (docs/algorithms.md, "Checking the math").

    Example: rlkit algos check --only grpo --only vanilla
    """
    from rlkit.core.algos.parity.check import check_cases, registered
    from rlkit.core.algos.parity.reference import VERL_MODULE, compare, load_verl

    known = sorted({name for names in registered().values() for name in names})
    unknown = [name for name in only or [] if name not in known]
    if unknown:
        raise UserError(f"--only {', '.join(unknown)}: not a registered name (known: {', '.join(known)})")
    if reference not in REFERENCES:
        raise UserError(f"--reference {reference!r}: one of {', '.join(REFERENCES)}")
    if reference == "trl":
        # TRL computes its GRPO loss types inside GRPOTrainer.compute_loss, with no function of a batch to call.
        raise UserError(
            "--reference trl: TRL's GRPO loss types live inside GRPOTrainer.compute_loss, with no function "
            "of a batch to compare against; use --reference verl, or none"
        )
    verl = load_verl() if reference in ("auto", "verl") else None
    if reference == "verl" and verl is None:
        raise UserError(f"--reference verl: {VERL_MODULE} cannot be imported; install verl, or use --reference none")
    cases = check_cases(only)
    compared = compare(verl, only) if verl is not None else []
    if reference == "auto" and verl is None:
        source = "no reference installed (verl is not importable): the hand-computed cases only"
    else:
        source = "verl" if verl is not None else "reference none: the hand-computed cases only"
    failed = [r for r in cases + compared if r.failed]
    if as_json:
        payload = {"cases": [asdict(r) for r in cases], "reference": source, "compared": [asdict(r) for r in compared]}
        console.out(json.dumps({**payload, "ok": not failed}, indent=2), highlight=False)
    else:
        _print("hand-computed cases", cases)
        console.print(f"reference: {source}", highlight=False)
        if compared:
            _print(f"against verl ({VERL_MODULE}), seeded random batches", compared)
        verdict = f"[bold red]{len(failed)} failed[/]" if failed else "[green]all passed[/]"
        console.print(f"{verdict}: {len(cases)} cases, {len(compared)} compared with the reference", highlight=False)
    raise typer.Exit(1 if failed else 0)


def _print(title: str, results: list) -> None:
    table = Table("", "kind", "name", "largest difference", "tolerance", "note", title=title, title_justify="left")
    for r in results:
        style = STATUS_STYLE[r.status]
        difference = "-" if r.difference is None else f"{r.difference:.2e}"
        tolerance = "-" if r.tolerance is None else f"{r.tolerance:.0e}"
        table.add_row(f"[{style}]{r.status}[/]", r.kind, r.name, difference, tolerance, escape(r.note))
    console.print(table)
