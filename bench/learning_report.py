"""bench/learning.py's outputs: the markdown table and the PNG of validation curves (rlkit plot style)."""

from __future__ import annotations

from pathlib import Path


def first_reaching(points: list[dict], target: float, key: str) -> float | None:
    """The samples or seconds (`key`) at the first validation at or above `target`; None if none reached it."""
    for point in points:
        if point["val"] >= target - 1e-9 and point[key] is not None:
            return point[key]
    return None


def table(results: dict) -> str:
    """One row per run: the SFT score it started from (its step-0 validation), its last and best
    validation, samples and seconds at its last validation, and when it first reached TRL's final score;
    above it the calls that made the runs, below it the SFT checkpoints' scores and the phases."""
    trl = results["runs"].get("trl-grpo", {}).get("points") or []
    target = trl[-1]["val"] if trl else None
    model = results.get("model", {})
    calls = "; ".join(f"`{c['command']}` ({c['date']}, {c['seconds']:.0f} s)" for c in results["calls"])
    lines = [f"Model {model.get('size')} ({model.get('params', 0) / 1e6:.1f}M parameters); versions "
             f"{results.get('versions', {})}; calls: {calls}.", "",
             "| run | status | start (SFT) | last val | best val | steps | samples | seconds | "
             f"samples to TRL's final{f' ({target:.3f})' if target is not None else ''} | seconds to it |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in results["runs"].items():
        points = run.get("points") or []
        if not points:
            lines.append(f"| {name} | {run['status']} | - | - | - | - | - | - | - | - |")
            continue
        last = points[-1]
        reach = [first_reaching(points, target, k) if target is not None else None for k in ("samples", "seconds")]
        cells = [f"{points[0]['val']:.3f}", f"{last['val']:.3f}", f"{max(p['val'] for p in points):.3f}",
                 str(last["step"]), f"{last['samples']:,.0f}", _seconds(last["seconds"]),
                 "-" if reach[0] is None else f"{reach[0]:,.0f}", _seconds(reach[1])]
        lines.append(f"| {name} | {run['status']} | {' | '.join(cells)} |")
    checkpoints = ", ".join(f"step {step} {score:.3f}" for step, score in
                            sorted((int(step), score) for step, score in results.get("sft_checkpoints", {}).items()))
    phases = ", ".join(f"{name} {p['seconds']:.0f} s ({p['status']})" for name, p in results["phases"].items())
    plateau = results.get("sft_plateau")
    start = (f"the SFT plateau (the first checkpoint after which no score rose by {plateau['min_gain']:g} or more)"
             if plateau and plateau["reached"] else
             f"the last checkpoint: no plateau (a gain of {plateau['min_gain']:g} or more after every earlier one)"
             if plateau else "the latest checkpoint scoring at most 0.6")
    lines += ["", f"SFT checkpoints scored (greedy, test split): {checkpoints or '-'}; RL starts from step "
              f"{results.get('sft_step')}, {start}.", "", f"Phases: {phases}."]
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def plot(results: dict, out: Path) -> Path:
    """Validation accuracy against samples and against seconds since each run started, one line per run."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    fig.suptitle("greedy validation accuracy on the held-out test split, from the SFT checkpoint")
    for ax, key, label in ((axes[0], "samples", "samples generated"), (axes[1], "seconds", "seconds since the run started")):
        drawn = 0
        for name, run in results["runs"].items():
            points = [p for p in run.get("points") or [] if p[key] is not None]
            if points:
                ax.plot([p[key] for p in points], [p["val"] for p in points], label=name,
                        marker="." if len(points) < 30 else None, linestyle="--" if run.get("tool") == "trl" else "-")
                drawn += 1
        ax.set_xlabel(label)
        ax.set_ylabel("val/reward/mean@1")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
