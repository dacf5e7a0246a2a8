"""`rlkit plot`: one PNG of a run's metrics over steps, from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.core.controller.tracking import METRICS_FILE, read_metrics
from rlkit.errors import UserError

# (title, metric keys drawn in the panel; the first present of alternatives in a tuple)
PANELS: list[tuple[str, list[str | tuple[str, ...]]]] = [
    ("reward", ["reward/mean", "reward/max", "reward/min"]),
    ("response length (tokens)", ["response/length_mean", "response/length_max"]),
    ("KL to reference", [("actor/kl_ref", "actor/kl_loss")]),
    ("entropy", ["actor/entropy"]),
    ("grad norm", ["actor/grad_norm"]),
]


def plot_run(run_path: Path, out: Path) -> Path:
    """Reward, response length, KL, entropy, grad norm and each phase's seconds per step."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    records = read_metrics(run_path / METRICS_FILE)
    if not records:
        raise UserError(f"{run_path / METRICS_FILE} has no metrics yet (is trainer.logger missing jsonl?)")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    fig.suptitle(f"{run_path.name}: {len(records)} steps")
    for ax, (title, keys) in zip(axes.flat, PANELS):
        drawn = 0
        for key in keys:
            name = _first_present(records, key)
            if name:
                steps, values = _series(records, name)
                ax.plot(steps, values, label=name, marker="." if len(steps) < 30 else None)
                drawn += 1
        _finish(ax, title, drawn)
    timings = sorted({k for r in records for k in r if k.startswith("timing/") and k != "timing/step"})
    ax = axes.flat[len(PANELS)]
    if timings:  # stacked: the phases add up to (almost all of) the step
        steps = [r["step"] for r in records]
        ax.stackplot(steps, *[[_number(r.get(k)) for r in records] for k in timings],
                     labels=[k.removeprefix("timing/") for k in timings])
    _finish(ax, "phase timings (s, stacked)", len(timings))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _first_present(records: list[dict[str, Any]], key: str | tuple[str, ...]) -> str | None:
    for name in (key,) if isinstance(key, str) else key:
        if any(r.get(name) is not None for r in records):
            return name
    return None


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _finish(ax, title: str, drawn: int) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=ax.transAxes)
