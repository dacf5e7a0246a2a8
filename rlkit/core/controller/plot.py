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
# Runs of an offline objective (sft): the loss where RL runs have rewards and samples.
OFFLINE_PANELS: list[tuple[str, list[str | tuple[str, ...]]]] = [
    ("loss", ["actor/loss", "val/loss"]),
    ("token accuracy", ["actor/token_accuracy", "val/token_accuracy"]),
    ("grad norm", ["actor/grad_norm"]),
    ("learning rate", ["actor/lr"]),
    ("trained tokens per step", ["perf/loss_tokens"]),
]
# objective dpo: the implicit rewards (TRL's names) next to the loss.
DPO_PANELS: list[tuple[str, list[str | tuple[str, ...]]]] = [
    ("loss", ["actor/loss", "val/loss"]),
    ("preference accuracy", ["rewards/accuracies", "val/rewards/accuracies"]),
    ("reward margin", ["rewards/margins", "val/rewards/margins"]),
    ("implicit rewards", ["rewards/chosen", "rewards/rejected", "val/rewards/chosen", "val/rewards/rejected"]),
    ("grad norm", ["actor/grad_norm"]),
    ("learning rate", ["actor/lr"]),
]


def plot_run(run_path: Path, out: Path) -> Path:
    """Reward, validation, response length, KL, entropy, grad norm and each phase's seconds per step
    (sft: training and validation loss, token accuracy, grad norm, learning rate, tokens; dpo: loss,
    preference accuracy, margins and implicit rewards, grad norm, learning rate)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    records = read_metrics(run_path / METRICS_FILE)
    if not records:
        raise UserError(f"{run_path / METRICS_FILE} has no metrics yet (is trainer.logger missing jsonl?)")
    trained = [r for r in records if "timing/step" in r]  # not the validation before training (step 0)
    fig, axes = plt.subplots(2, 4, figsize=(20, 8), constrained_layout=True)
    fig.suptitle(f"{run_path.name}: {len(trained)} steps")
    panels = panels_for(records)
    for ax, (title, keys) in zip(axes.flat, panels):
        drawn = 0
        for key in keys:
            name = _first_present(records, key)
            if name:
                xs, values = _series(records, name)
                ax.plot(xs, values, label=name, marker="." if len(xs) < 30 else None)
                drawn += 1
        _finish(ax, title, drawn)
    timings = sorted({k for r in trained for k in r if k.startswith("timing/") and k != "timing/step"})
    ax = axes.flat[len(panels)]
    if timings:  # stacked: the phases add up to (almost all of) the step
        ax.stackplot(
            [r["step"] for r in trained],
            *[[_number(r.get(k)) for r in trained] for k in timings],
            labels=[k.removeprefix("timing/") for k in timings],
        )
    _finish(ax, "phase timings (s, stacked)", len(timings))
    for ax in axes.flat[len(panels) + 1 :]:
        ax.set_visible(False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def panels_for(records: list[dict[str, Any]]) -> list[tuple[str, list[str | tuple[str, ...]]]]:
    """The panels of a run: dpo's (it logs rewards/margins), sft's (actor/loss) or RL's with its validation
    scores."""
    if any("rewards/margins" in r for r in records):
        return DPO_PANELS
    if any("actor/loss" in r for r in records):
        return OFFLINE_PANELS
    return PANELS[:1] + [("validation", validation_keys(records))] + PANELS[1:]


def validation_keys(records: list[dict[str, Any]]) -> list[str | tuple[str, ...]]:
    """The validation scores over all sources (greedy mean@1, then mean@n, the largest pass@k, maj@n),
    and each source's mean@1 when there are several."""
    logged = {k for r in records for k in r if k.startswith("val/")}
    pooled = sorted((k for k in logged if k.startswith("val/reward/")), key=_val_order)
    pass_ks = [k for k in pooled if "/pass@" in k]
    keys: list[str | tuple[str, ...]] = [k for k in pooled if "/pass@" not in k] + pass_ks[-1:]
    per_source = sorted(k for k in logged if k.endswith("/reward/mean@1") and k != "val/reward/mean@1")
    return keys + (per_source if len(per_source) > 1 else [])


def _val_order(key: str) -> tuple[int, int]:
    """mean@1, mean@n, pass@k by k, maj@n."""
    name, _, k = key.rpartition("/")[2].partition("@")
    return ({"mean": 0, "pass": 1, "maj": 2}.get(name, 3), int(k) if k.isdigit() else 0)


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
