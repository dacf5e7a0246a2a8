"""`rlkit eval`: parsing and printing; the work is in rlkit.core.controller.offline_eval."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rlkit.cli.common import console, user_errors
from rlkit.cli.run_cmds import RUNS_DIR_OPTION


@user_errors
def eval_command(
    target: str = typer.Argument(
        ..., help="A run id or run directory (scores a checkpoint), or a model directory such as an `rlkit export`."
    ),
    overrides: Optional[list[str]] = typer.Argument(
        None,
        help="KEY=VALUE settings validation reads, e.g. trainer.val_n=8 data.max_response_length=1024 "
        "rollout.name=hf reward.gsm8k_method=flexible.",
    ),
    data: Optional[list[Path]] = typer.Option(
        None, "--data", help="Parquet file of prompts (repeatable); default: the run's validation data."
    ),
    step: Optional[int] = typer.Option(
        None,
        "--step",
        min=0,
        help="A run's checkpoint step (default: the latest; 0: the base model). For a model "
        "directory, the step whose sampling seeds to use (default: the exported step).",
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", help="jsonl of every response (default for a run: RUN/validation/eval_step_N.jsonl)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object (for scripts)."),
    runs_dir: str = RUNS_DIR_OPTION,
) -> None:
    """Score a run's checkpoint or a model on validation prompts, exactly as the run's validation does.

    Greedy mean@1 per data source, plus mean@n, pass@k and maj@n with trainer.val_n >= 2.
    Example: rlkit eval grpo-demo-20261130-101500 --step 120 --data ~/data/gsm8k/test.parquet trainer.val_n=8
    """
    from rlkit.core.controller.offline_eval import evaluate_offline, resolve_target

    resolved = resolve_target(target, step=step, overrides=overrides or [], runs_dir=runs_dir)
    status = f"validating {resolved.label}"
    with contextlib.nullcontext() if as_json else console.status(status):
        report = evaluate_offline(resolved, data=[str(p.expanduser()) for p in data or []], out=out)
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(report), indent=2))
        return
    table = Table(
        "metric",
        "value",
        title=f"{report.label}: {report.rows} prompts, seeds of step {report.step}",
        title_justify="left",
    )
    for key, value in sorted(report.metrics.items()):
        table.add_row(key, f"{value:.4g}")
    console.print(table)
    if report.generations:
        console.print(f"responses: {report.generations}")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
