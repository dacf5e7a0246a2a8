"""Commands on recorded rollouts (trainer.record_rollouts, on by default: the last trainer.record_keep_steps steps):
replay a step's update, inspect its samples."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from rlkit.cli.common import console, run_failures, user_errors
from rlkit.cli.run_cmds import RUN_ARGUMENT, RUNS_DIR_OPTION

# Per-token gap colours: at float precision, small (bf16 noise), large (worth a look).
GAP_STYLES = ((1e-3, ""), (0.05, "yellow"), (float("inf"), "bold red"))


def register(app: typer.Typer) -> None:
    app.command()(replay)
    app.command()(inspect)


@user_errors
@run_failures
def replay(
    run_id: str = RUN_ARGUMENT,
    step: int = typer.Option(..., "--step", min=1, help="The recorded step whose update to run again."),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="actor.*/model.* overrides to try on the same batch, e.g. actor.clip_ratio_high=0.28."
    ),
    tolerance: Optional[float] = typer.Option(
        None, "--tolerance", help="Exit with code 1 when a metric differs by more than this (0: any difference)."
    ),
    runs_dir: str = RUNS_DIR_OPTION,
) -> None:
    """Run a recorded step's actor update again from the checkpoint before it, and print how loss,
    grad norm, KL and clip fraction differ from what the run logged (docs/replay.md).

    Example: rlkit replay grpo-demo-20261130-101500 --step 3 actor.clip_ratio_high=0.28
    """
    from rlkit.core.controller.replay import replay_step

    result = replay_step(run_id, step, overrides or [], runs_dir)
    changed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in result.changed.items()) or "none"
    console.print(f"replayed step {result.step} from {result.start}; overrides: {changed}", highlight=False)
    table = Table("metric", "recorded", "replayed", "difference")
    worst = 0.0
    for key, (recorded, replayed, diff) in result.differences().items():
        worst = max(worst, abs(diff)) if diff is not None else worst
        style = "green" if diff == 0 else "yellow" if diff is not None else "dim"
        table.add_row(key, _num(recorded), _num(replayed), f"[{style}]{_num(diff, signed=True)}[/]")
    console.print(table)
    if tolerance is not None and worst > tolerance:
        console.print(f"[bold red]differs[/]: largest difference {worst:.3g} > --tolerance {tolerance:g}")
        raise typer.Exit(1)


@user_errors
def inspect(
    run_id: str = RUN_ARGUMENT,
    step: Optional[int] = typer.Option(None, "--step", help="Recorded step (default: the newest)."),
    sort: str = typer.Option("reward", "--sort", help="reward, advantage, gap (mean per token), length or index."),
    ascending: bool = typer.Option(False, "--ascending", help="Lowest first (default: highest first)."),
    top: int = typer.Option(20, "--top", min=1, help="Samples to show."),
    tensorboard: bool = typer.Option(
        False,
        "--tensorboard",
        help="Also write the step's summary as text to RUN/tensorboard (tab TEXT, tag rollouts).",
    ),
    runs_dir: str = RUNS_DIR_OPTION,
) -> None:
    """Show a recorded step's rollouts: prompt, response, reward, advantage, and each response token
    coloured by its rollout-vs-trainer log-prob gap (runs keep the last trainer.record_keep_steps steps: 3 by default).

    Example: rlkit inspect grpo-demo-20261130-101500 --step 40 --sort advantage --ascending
    """
    from transformers import AutoTokenizer

    from rlkit.core.state import rollout_view
    from rlkit.core.state.records import read_record
    from rlkit.core.state.run_dir import RunDir, resolve_model_path
    from rlkit.errors import UserError
    from rlkit.recipes.loader import load_config

    if sort not in rollout_view.SORT_KEYS:
        raise UserError(f"--sort {sort}: sort by one of {', '.join(rollout_view.SORT_KEYS)}")
    run = RunDir.open(run_id, runs_dir)
    record = read_record(run.path, step)
    config = load_config(str(run.path / "config.yaml"), require_inputs=False)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.model.path))
    views = rollout_view.sample_views(record, tokenizer)
    stats = rollout_view.summary(record, views)
    console.print(
        f"[bold]step {record.step}[/] of {run.run_id}: "
        + ", ".join(f"{k} {v:.4g}" for k, v in stats.items())
        + (
            ""
            if "gap_mean" in stats
            else "  (no per-token gap: the engine returned no log-probs this "
            "step; rollout.log_prob_check_freq sets the steps that have them)"
        ),
        highlight=False,
    )
    table = Table(
        "#",
        "group",
        "reward",
        "adv",
        "len",
        "gap",
        "prompt",
        "response",
        caption="gap: mean |rollout - trainer| log-prob per token; response tokens coloured by theirs: "
        "plain < 1e-3, [yellow]yellow[/] < 0.05, [bold red]red[/] above; "
        "[dim italic]environment/tool tokens[/] (not trained); len+: cut at data.max_response_length",
        caption_justify="left",
    )
    for view in rollout_view.sort_views(views, sort, descending=not ascending)[:top]:
        gap = f"{view.mean_gap:.2g}" if view.mean_gap is not None else "-"
        table.add_row(
            str(view.index),
            str(view.group),
            f"{view.reward:.3g}",
            f"{view.advantage:+.3g}",
            str(len(view.tokens)) + ("" if view.finished else "+"),
            gap,
            Text(rollout_view.tail(view.prompt, 60)),
            _response(view),
        )
    console.print(table)
    if tensorboard:
        console.print(f"[green]wrote[/] the summary to {rollout_view.write_tensorboard(run.path, record, views)}")


def _response(view) -> Text:
    text = Text()
    for i, token in enumerate(view.tokens):
        gap = view.gaps[i] if view.gaps is not None else 0.0
        style = "dim italic" if not view.trained[i] else next(s for limit, s in GAP_STYLES if (gap or 0.0) < limit)
        text.append(token.replace("\n", "⏎"), style=style)
    return text


def _num(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.6g}" if signed else f"{value:.6g}"
