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
    app.command()(plan)


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
    from rlkit.core.doctor import exit_code, run_checks
    from rlkit.core.finding import LEVELS
    from rlkit.core.planning.plan import checkpoint_bytes

    findings = run_checks(_config(recipe, overrides, model), checkpoint_bytes=checkpoint_bytes)
    table = Table("", "check", "found", "what to do")
    for f in findings:
        table.add_row(f"[{LEVEL_STYLE[f.level]}]{f.level}[/]", f.check, f.found, f.fix)
    console.print(table)
    counts = {level: sum(f.level == level for f in findings) for level in LEVELS}
    code = exit_code(findings)
    verdict = "[bold red]a run would fail[/]" if code else "[green]ready[/]"
    console.print(
        f"{verdict}: "
        + ", ".join(f"{n} {level}" for level, n in counts.items() if n)
        + "  (tested versions: docs/compatibility.md)"
    )
    raise typer.Exit(code)


@user_errors
def plan(
    recipe: str = typer.Argument(..., help="Recipe name (`rlkit recipes list`) or path to a .yaml file."),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="KEY=VALUE overrides, e.g. actor.micro_batch_tokens=8192."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Hub id (in the local cache) or path of the policy."),
    usd_per_gpu_hour: Optional[float] = typer.Option(None, "--usd-per-gpu-hour", help="Price of one GPU-hour."),
    gpu_memory_gib: Optional[float] = typer.Option(
        None,
        "--gpu-memory-gib",
        help="Plan for GPUs of this size (default: this machine's, or an H200 with trainer.device=cuda).",
    ),
) -> None:
    """Before a run: memory per training device for each phase (weights, gradients, AdamW state,
    activations, logits, reference, critic, vLLM), whether it fits and which setting to turn, and
    the predicted time per step and cost of trainer.total_steps (docs/planning.md).

    Example: rlkit plan grpo --model Qwen/Qwen2.5-7B-Instruct trainer.n_gpus_per_node=8 --usd-per-gpu-hour 2.5
    """
    from rlkit.core.planning.plan import build_plan

    config = _config(recipe, overrides, model)
    result = build_plan(config, gpu_memory_gib=gpu_memory_gib)
    _print_plan(result, usd_per_gpu_hour)
    raise typer.Exit(0 if result.fits else 1)


def _print_plan(result, usd_per_gpu_hour: Optional[float]) -> None:
    from rlkit.core.planning.memory import GIB
    from rlkit.core.planning.timing import CALIBRATION, run_cost

    config, shape, device, mem = result.config, result.shape, result.device, result.memory
    trainer = config.trainer
    console.print(
        f"[bold]{config.model.path}[/]: {shape.params / 1e6:,.1f}M parameters ({shape.layers} layers, "
        f"hidden {shape.hidden}, vocabulary {shape.vocab}); {trainer.nnodes} node(s) x "
        f"{trainer.n_gpus_per_node} device(s), {config.world_size} training, "
        + (f"objective {config.objective}: no rollout" if config.offline else f"rollout {config.rollout.placement}"),
        highlight=False,
    )
    console.print(
        f"one training device: {device.name}, {device.bytes / GIB:.1f} GiB"
        + ("" if device.measured else " (not measured here)"),
        highlight=False,
    )
    parts = Table("per training device", "size", title_justify="left")
    for name, size in mem.parts.items():
        parts.add_row(name, _size(size))
    console.print(parts)
    if result.kv:
        kv = result.kv
        console.print(
            f"vLLM per engine: weights {_size(kv['weights'])}, KV cache ~{_size(max(kv['bytes'], 0))}"
            f" (~{int(kv['tokens']):,} tokens; {int(kv['sequences'])} sequences at full length need "
            f"{int(kv['wanted_tokens']):,})",
            highlight=False,
        )
    phases = ", ".join(f"{name} {_size(size)}" for name, size in mem.phases.items())
    verdict = "[green]fits[/]" if result.fits else "[bold red]does not fit[/]"
    console.print(
        f"peak per phase: {phases} -> {verdict}: {mem.peak_phase} needs {_size(mem.peak)} of "
        f"{_size(result.usable)} usable",
        highlight=False,
    )
    for knob in result.knobs:
        console.print(f"  [yellow]turn[/]: {knob}", highlight=False)
    for line in result.warnings + mem.notes:
        console.print(f"  note: {line}", highlight=False)
    if not result.device.on_gpu:
        # The time model's constants were measured on an H200: on a CPU they would price the run as GPU time.
        console.print(
            f"time: not predicted for a CPU run (the time model is calibrated on {CALIBRATION['device']}, "
            "docs/planning.md); run a few steps and read `timing/step` in the run's metrics",
            highlight=False,
        )
        return
    time = result.time
    console.print(
        f"time per step ~{time.step:.1f} s: "
        + ", ".join(f"{k} {v:.2f}" for k, v in time.phases.items())
        + f"  ({'; '.join(time.notes)})",
        highlight=False,
    )
    cost = run_cost(config, time.step, usd_per_gpu_hour)
    console.print(
        f"trainer.total_steps={trainer.total_steps}: ~{cost['hours']:.2f} h on {int(cost['devices'])} "
        f"device(s) = {cost['gpu_hours']:.2f} GPU-hours"
        + (f", ~${cost['usd']:,.2f} at ${usd_per_gpu_hour:g}/GPU-hour" if "usd" in cost else ""),
        highlight=False,
    )


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
