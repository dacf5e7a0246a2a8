"""bench/learning_tools.py's outputs: an rlkit run's points (validation with tool calls per episode, and the
training steps' reward and tool calls), the markdown table and the PNG of the three curves against steps."""

from __future__ import annotations

import json
from pathlib import Path

from bench.learning_results import rlkit_points

# (key in a point, y label): the three panels, each against the step, from step 0.
PANELS = (("val", "greedy validation (val/reward/mean@1)"), ("reward", "train reward (mean over samples)"),
          ("tool_calls", "tool calls per episode"))


def tool_points(run_dir: Path, began: float) -> dict[str, list[dict]]:
    """{"points": validations with "tool_calls" (val/agent/tool_calls, 0 in a run without tools), "train": each
    step's {"step", "reward" (reward/mean), "tool_calls" (agent/tool_calls)}} of an rlkit run's metrics.jsonl."""
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    tool_calls = {r["step"]: r.get("val/agent/tool_calls", 0.0) for r in records if "val/reward/mean@1" in r}
    points = [{**p, "tool_calls": tool_calls[p["step"]]} for p in rlkit_points(run_dir, began)]
    train = [{"step": r["step"], "reward": r["reward/mean"], "tool_calls": r.get("agent/tool_calls", 0.0)}
             for r in records if "reward/mean" in r]
    return {"points": points, "train": train}


def table(results: dict) -> str:
    """One row per run: its start (step-0 validation) and last and best validation, tool calls per episode at the
    start and the end, steps, samples, seconds; above it the calls and the no-tool line to beat."""
    baseline = results.get("no_tool_sft")
    calls = "; ".join(f"`{c['command']}` ({c['date']}, {c['seconds']:.0f} s)" for c in results["calls"])
    model = results.get("model", {})
    lines = [f"Model {model.get('size')} ({model.get('params', 0) / 1e6:.1f}M parameters); versions "
             f"{results.get('versions', {})}; calls: {calls}.", "",
             "The no-tool SFT model's greedy score on the test split (single turn, bench/greedy_eval.py): "
             + ("-" if baseline is None else f"{baseline:.3f}") + ".", "",
             "| run | status | start val | last val | best val | tool calls at start | at the end | steps | samples | "
             "seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in results["runs"].items():
        points = run.get("points") or []
        if not points:
            lines.append(f"| {name} | {run['status']} | - | - | - | - | - | - | - | - |")
            continue
        first, last = points[0], points[-1]
        calls_at = [f"{p['tool_calls']:.2f}" if p.get("tool_calls") is not None else "-" for p in (first, last)]
        seconds = "-" if last.get("seconds") is None else f"{last['seconds']:.0f}"
        lines.append(f"| {name} | {run['status']} | {first['val']:.3f} | {last['val']:.3f} | "
                     f"{max(p['val'] for p in points):.3f} | {calls_at[0]} | {calls_at[1]} | {last['step']} | "
                     f"{last['samples']:,.0f} | {seconds} |")
    phases = ", ".join(f"{name} {p['seconds']:.0f} s ({p['status']})" for name, p in results["phases"].items())
    return "\n".join([*lines, "", f"Phases: {phases}."]) + "\n"


def plot(results: dict, out: Path) -> Path:
    """Validation, train reward and tool calls per episode against steps, one colour per run (TRL's dashed): the
    validations as markers, the training steps as lines (tool calls: both, greedy validation and sampled steps)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), constrained_layout=True)
    fig.suptitle("tool-arithmetic from the SFT warm starts: with the calculator (tool loop) and without")
    for ax, (key, label) in zip(axes, PANELS):
        drawn = 0
        for index, (name, run) in enumerate(results["runs"].items()):
            style = {"color": f"C{index}", "linestyle": "--" if run.get("tool") == "trl" else "-"}
            validation = [(p["step"], p[key]) for p in run.get("points") or [] if p.get(key) is not None]
            train = [(p["step"], p[key]) for p in run.get("train") or [] if p.get(key) is not None]
            if key != "val" and train:  # the training steps: a line
                ax.plot(*zip(*train), label=name, **style)
                drawn += 1
            if key != "reward" and validation:  # the validations: markers (and a line for the validation panel)
                ax.plot(*zip(*validation), marker="o", markersize=3, label=None if key != "val" and train else name,
                        **(style if key == "val" else {"color": style["color"], "linestyle": "none"}))
                drawn += 1
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
