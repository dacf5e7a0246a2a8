"""Commands on runs: resume, runs list/show, export, plot. Printing only; the work is in rlkit.core."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from rlkit.cli.common import console, run_failures, user_errors

RUNS_DIR_OPTION = typer.Option(
    "runs",
    "--runs-dir",
    envvar="RLKIT_RUNS_DIR",
    help="Parent folder of run directories (trainer.runs_dir of the run).",
)
RUN_ARGUMENT = typer.Argument(..., help="Run id (a folder under --runs-dir) or the run directory's path.")
# Metrics `runs show` prints, in this order, when the run logged them.
SHOW_KEYS = [
    "actor/loss",
    "actor/token_accuracy",
    "perf/loss_tokens",  # offline objectives (sft, dpo)
    "rewards/accuracies",
    "rewards/margins",
    "rewards/chosen",
    "rewards/rejected",
    "reward/mean",
    "reward/max",
    "response/length_mean",
    "response/clip_frac",
    "actor/pg_loss",
    "actor/kl_ref",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "rollout/log_prob_diff",
    "timing/step",
    "perf/tokens_per_s",
]
STATUS_STYLE = {"running": "cyan", "finished": "green", "failed": "red", "dead": "red", "interrupted": "yellow"}


def register(app: typer.Typer) -> None:
    runs_app = typer.Typer(
        help="List runs and show one: status, step, last metrics, checkpoints.", no_args_is_help=True
    )
    app.add_typer(runs_app, name="runs")
    app.command()(resume)
    runs_app.command("list")(runs_list)
    runs_app.command("show")(runs_show)
    app.command("export")(export)
    app.command("plot")(plot)


@user_errors
@run_failures
def resume(
    run_id: str = RUN_ARGUMENT,
    overrides: Optional[list[str]] = typer.Argument(
        None, help="KEY=VALUE overrides that cannot change the math, e.g. trainer.total_steps=200."
    ),
    runs_dir: str = RUNS_DIR_OPTION,
) -> None:
    """Continue a run exactly from its latest complete checkpoint.

    Example: rlkit resume grpo-demo-20261130-101500 trainer.total_steps=200
    """
    from rlkit.core.controller.resume import resume_run

    path = resume_run(run_id, overrides or [], runs_dir)
    console.print(f"[green]done[/]: {path}")


@user_errors
def runs_list(runs_dir: str = RUNS_DIR_OPTION) -> None:
    """List runs, oldest first. Example: rlkit runs list --runs-dir /data/runs"""
    from rlkit.core.controller.tracking import METRICS_FILE, read_metrics
    from rlkit.core.state.checkpoint import list_checkpoints
    from rlkit.core.state.run_dir import list_runs

    runs = list_runs(runs_dir)
    if not runs:
        console.print(f"no runs in {Path(runs_dir).expanduser()}")
        return
    table = Table("run", "recipe", "status", "step", "reward / loss", "checkpoints", "updated")
    for run in runs:
        status = run.read_status()
        last = (read_metrics(run.path / METRICS_FILE) or [{}])[-1]
        usable = [c.step for c in list_checkpoints(run.path) if c.problem is None]
        table.add_row(
            run.run_id,
            _recipe(run.path),
            _styled(status.get("status", "unknown")),
            f"{status.get('step', '-')}/{status.get('total_steps', '-')}",
            _last_score(last),
            f"{len(usable)} (last {usable[-1]})" if usable else "0",
            str(status.get("updated_at", "-")),
        )
    console.print(table)


def _last_score(record: dict[str, Any]) -> str:
    """An RL run's reward, an offline objective's (sft) loss."""
    if "reward/mean" not in record and "actor/loss" in record:
        return f"loss {_fmt(record['actor/loss'])}"
    return _fmt(record.get("reward/mean"))


@user_errors
def runs_show(run_id: str = RUN_ARGUMENT, runs_dir: str = RUNS_DIR_OPTION) -> None:
    """A run's status, last metrics and checkpoints. Example: rlkit runs show grpo-demo-20261130-101500"""
    from rlkit.core.controller.tracking import METRICS_FILE, read_metrics
    from rlkit.core.state.checkpoint import interrupted_writes, list_checkpoints
    from rlkit.core.state.run_dir import RunDir

    run = RunDir.open(run_id, runs_dir)
    status = run.read_status()
    console.print(f"[bold]{run.run_id}[/]  {run.path}")
    console.print(
        f"recipe {_recipe(run.path)}, status {_styled(status.get('status', 'unknown'))}, step "
        f"{status.get('step', '-')}/{status.get('total_steps', '-')}, pid {status.get('pid', '-')} on "
        f"{status.get('host', '-')}, updated {status.get('updated_at', '-')}"
    )
    if status.get("error"):
        console.print(f"[red]error:[/] {status['error']}", highlight=False)
    records = read_metrics(run.path / METRICS_FILE)
    trained = [r for r in records if "timing/step" in r]  # not the validation before training (step 0)
    if trained:
        last = trained[-1]
        metrics = Table("metric", f"step {last.get('step')}", title="last metrics", title_justify="left")
        for key in SHOW_KEYS:
            if key in last:
                metrics.add_row(key, _fmt(last[key]))
        console.print(metrics)
    validated = [r for r in records if any(k.startswith("val/") for k in r)]
    if validated:
        shown = validated[:1] + validated[-1:] if len(validated) > 1 else validated
        generated = any(k.startswith("val/reward/") for k in validated[-1])  # an offline objective's generates nothing
        where = f"; responses in {run.path / 'validation'}" if generated else ""
        table = Table(
            "metric",
            *[f"step {r['step']}" for r in shown],
            title=f"validation ({len(validated)} times{where})",
            title_justify="left",
        )
        for key in sorted(k for k in validated[-1] if k.startswith("val/")):
            table.add_row(key, *[_fmt(r.get(key)) for r in shown])
        console.print(table)
    ckpts = Table("step", "reason", "written", "size", "usable", title="checkpoints", title_justify="left")
    for ckpt in list_checkpoints(run.path):
        state = _safe_state(ckpt)
        size = sum(p.stat().st_size for p in ckpt.path.rglob("*") if p.is_file())
        ckpts.add_row(
            str(ckpt.step),
            state.get("reason", "-"),
            state.get("written_at", "-"),
            _size(size),
            "[green]yes[/]" if ckpt.problem is None else f"[red]no[/]: {ckpt.problem}",
        )
    for tmp in interrupted_writes(run.path):
        ckpts.add_row(tmp.name, "-", "-", "-", "[red]no[/]: interrupted write")
    console.print(ckpts if ckpts.row_count else "no checkpoints")
    _print_provenance(run.path)


@user_errors
def export(
    run_id: str = RUN_ARGUMENT,
    out: Path = typer.Option(..., "--out", help="New directory for the Hugging Face model."),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the latest complete one)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (the base model's dtype), float32 or bfloat16."),
    lora_format: Optional[str] = typer.Option(
        None,
        "--lora-format",
        help="LoRA runs: both (merged model in --out, peft adapter in --out/adapter; "
        "the default), merged, or adapter (the peft adapter alone in --out).",
    ),
    runs_dir: str = RUNS_DIR_OPTION,
) -> None:
    """Write a checkpoint's policy as a Hugging Face model (safetensors, config, tokenizer).

    Example: rlkit export grpo-demo-20261130-101500 --out ./my-policy   (then: --model ./my-policy, or vllm serve)
    """
    from rlkit.core.state.run_dir import RunDir
    from rlkit.core.train.export import export_hf

    path = export_hf(RunDir.open(run_id, runs_dir), out, step=step, dtype=dtype, lora_format=lora_format)
    console.print(f"[green]exported[/] to {path}")


@user_errors
def plot(
    run_id: str = RUN_ARGUMENT,
    out: Optional[Path] = typer.Option(None, "--out", help="PNG path (default: RUN_DIR/plot.png)."),
    runs_dir: str = RUNS_DIR_OPTION,
) -> None:
    """Plot reward, response length, KL, entropy, grad norm and phase timings over steps.

    Example: rlkit plot grpo-demo-20261130-101500 --out reward.png
    """
    from rlkit.core.controller.plot import plot_run
    from rlkit.core.state.run_dir import RunDir

    run = RunDir.open(run_id, runs_dir)
    console.print(f"[green]wrote[/] {plot_run(run.path, out or run.path / 'plot.png')}")


def _print_provenance(run_path: Path) -> None:
    """What the run was trained with (provenance.json), and where its newest checkpoint's record differs."""
    from rlkit.core.state import provenance
    from rlkit.core.state.checkpoint import list_checkpoints

    record = provenance.read(run_path)
    if record is None:
        console.print("no provenance.json (the run predates it)")
        return
    table = Table("", "", title="provenance", title_justify="left", show_header=False)
    for what, value in provenance.summary_lines(record):
        table.add_row(what, value)
    console.print(table)
    usable = [c for c in list_checkpoints(run_path) if c.problem is None]
    saved = provenance.read(usable[-1].path) if usable else None
    changes = provenance.differences(saved, record) if saved else []
    if changes:
        console.print(
            f"[yellow]checkpoint {usable[-1].path.name} was written in another environment:[/] " + "; ".join(changes),
            highlight=False,
        )


def _recipe(run_path: Path) -> str:
    import yaml

    try:
        return str((yaml.safe_load((run_path / "config.yaml").read_text()) or {}).get("recipe", "-"))
    except (OSError, yaml.YAMLError):
        return "-"


def _safe_state(ckpt: Any) -> dict[str, Any]:
    try:
        return ckpt.state
    except (OSError, ValueError):
        return {}


def _styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
