"""Train grpo, dapo, ppo, rloo and the 2025-26 losses' recipes on the built-in echo task for the same number of
samples.

Not a test: a benchmark that writes docs/algorithm_comparison.md (a table) and
docs/algorithm_comparison.png (reward against samples generated). Each algorithm runs its
own recipe with the same tiny-world overrides; see TINY_WORLD and ALGORITHMS for what is
changed and why. On 2 CPU cores the default budget takes about 10 minutes.

    python scripts/compare_algorithms.py [--samples 16384] [--seeds 1] [--out docs]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# The same for every algorithm: the tiny model, one-token answers, lr 1e-3 (what the echo task
# needs, measured on the tiny model), and one optimizer step per RL step over 128 samples. Recipe choices made for
# 7B models (LR warm-up, weight decay, response lengths) are levelled out; each recipe's
# algorithm (estimator, KL, clip bounds, dynamic sampling, loss aggregation) is kept.
SAMPLES_PER_STEP = 128
WARM_START_SECTION = "<!-- warm_start_algorithms.py -->"  # where that script's section starts
TINY_WORLD = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "data.max_prompt_length=16",
              "data.max_response_length=1", "actor.micro_batch_tokens=4096", "actor.lr=1e-3",
              "actor.warmup_steps=0", "actor.weight_decay=0", "rollout.name=vllm", "reward.num_workers=1"]

# name -> (recipe, overrides on top of TINY_WORLD)
ALGORITHMS = {
    "grpo": ("grpo", ["rollout.n=8"]),
    # A one-token answer always sits at the length limit, so the overlong buffer would punish every
    # answer alike: shaping is off here, the rest of DAPO (clip-higher, dynamic sampling) is on.
    "dapo": ("dapo", ["rollout.n=8", "reward.overlong_buffer.enable=false"]),
    # The critic learns at the actor's rate here (the recipe's 1e-5 is for 7B models).
    "ppo": ("ppo", ["rollout.n=1", "critic.lr=1e-3"]),
    "rloo": ("rloo", ["rollout.n=8"]),
    # The 2025-26 losses, each its own recipe (docs/algorithms.md): clip_cov and kl_cov keep their dynamic sampling.
    "cispo": ("cispo", ["rollout.n=8"]),
    "gmpo": ("gmpo", ["rollout.n=8"]),
    "sapo": ("sapo", ["rollout.n=8"]),
    "clip_cov": ("clip_cov", ["rollout.n=8"]),
    "kl_cov": ("kl_cov", ["rollout.n=8"]),
}


@dataclass
class Curve:
    name: str
    seed: int
    samples: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    gen_rounds: list[float] = field(default_factory=list)  # dynamic sampling only
    seconds: float = 0.0
    steps: int = 0


def train_until(name: str, seed: int, budget: int, runs_dir: Path, progress: Progress) -> Curve:
    """Train `name` until `budget` samples were generated; the reward of each step's samples."""
    from rlkit.core.controller.controller import Controller
    from rlkit.core.state.run_dir import RunDir
    from rlkit.recipes.loader import load_config

    recipe, extra = ALGORITHMS[name]
    n = int(next(o for o in extra if o.startswith("rollout.n=")).split("=")[1])
    prompts = SAMPLES_PER_STEP // n
    config = load_config(recipe, [*TINY_WORLD, *extra, f"data.train_batch_size={prompts}",
                                  f"actor.mini_batch_size={prompts}", f"trainer.seed={seed}",
                                  f"trainer.total_steps={budget // SAMPLES_PER_STEP}", f"trainer.runs_dir={runs_dir}"])
    controller = Controller(config, RunDir.create(config, f"{name}-seed{seed}"))
    curve, task = Curve(name, seed), progress.add_task(f"{name} seed {seed}", total=budget)
    start, seen = time.perf_counter(), 0.0
    try:
        while seen < budget:
            curve.steps += 1
            metrics = controller.step(curve.steps)
            seen += metrics["rollout/samples"]
            # Dynamic sampling trains on a filtered batch; what the policy scores is the reward over all samples.
            curve.rewards.append(metrics.get("dapo/reward_mean_sampled", metrics["reward/mean"]))
            curve.samples.append(seen)
            if "dapo/gen_rounds" in metrics:
                curve.gen_rounds.append(metrics["dapo/gen_rounds"])
            progress.update(task, completed=min(seen, budget))
    finally:
        curve.seconds = time.perf_counter() - start
        controller.close()
    return curve


def smoothed(values: list[float], window: int = 10) -> list[float]:
    return [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
            for i in range(len(values))]


def samples_to_reach(curve: Curve, level: float) -> float | None:
    for samples, reward in zip(curve.samples, smoothed(curve.rewards)):
        if reward >= level:
            return samples
    return None


def write_outputs(curves: list[Curve], budget: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for curve in curves:
        label = curve.name if len({c.seed for c in curves}) == 1 else f"{curve.name} (seed {curve.seed})"
        ax.plot(curve.samples, smoothed(curve.rewards), label=label)
    ax.set_xlabel("samples generated")
    ax.set_ylabel("mean reward of the step's samples (10-step mean)")
    ax.set_title("echo task, tiny Qwen2 (0.3M params), 2 CPU cores")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "algorithm_comparison.png", dpi=120)

    def fmt(samples: float | None) -> str:
        return f"{samples:,.0f}" if samples is not None else "not reached"

    notes = "".join(
        f"- {c.name} (seed {c.seed}) needed {sum(c.gen_rounds) / len(c.gen_rounds):.1f} generation rounds per "
        f"step on average ({sum(c.gen_rounds[:10]) / len(c.gen_rounds[:10]):.1f} in its first 10 steps): while "
        "few answers are right, most groups score all 0 and dynamic sampling drops them, so it takes fewer, "
        "fuller steps for the same samples.\n" for c in curves if c.gen_rounds)
    header = ("| algorithm | seed | final reward | best reward | samples to 0.5 | samples to 0.9 | steps "
              "| train time (s) |\n|---|---|---|---|---|---|---|---|\n")
    rows = ""
    for c in curves:
        smooth = smoothed(c.rewards)
        rows += (f"| {c.name} | {c.seed} | {sum(c.rewards[-10:]) / len(c.rewards[-10:]):.3f} | {max(smooth):.3f} "
                 f"| {fmt(samples_to_reach(c, 0.5))} | {fmt(samples_to_reach(c, 0.9))} | {c.steps} "
                 f"| {c.seconds:.0f} |\n")
    doc = out / "algorithm_comparison.md"
    # scripts/warm_start_algorithms.py's section, between its markers, is kept.
    earlier = doc.read_text() if doc.exists() else ""
    warm_start = earlier[earlier.find(WARM_START_SECTION):] if WARM_START_SECTION in earlier else ""
    doc.write_text(
        "# Algorithm comparison on the echo task\n\n"
        "Written by `python scripts/compare_algorithms.py`; do not edit by hand.\n\n"
        f"Each algorithm ran its recipe for {budget:,} generated samples (about {SAMPLES_PER_STEP} per step) "
        "on the built-in `echo` task (answer = the prompt's digit, exact-match reward 0/1) with the tiny "
        "offline Qwen2, one-token answers, lr 1e-3 and one optimizer step per RL step. ppo samples one "
        "answer for each of 128 prompts, the others 8 answers for each of 16; the extra "
        "dynamic-sampling rounds (dapo, clip_cov, kl_cov) count towards the budget. Reward is the mean over all "
        "samples a step generated (with dynamic sampling, before its filter); final = mean of the last 10 steps, best = best 10-step "
        "mean, samples to X = first point where the 10-step mean reaches X. Train time excludes start-up.\n\n"
        f"{header}{rows}\n{notes}\n![reward curves](algorithm_comparison.png)\n\n"
        "One seed on a toy task: this shows that each algorithm learns through the whole stack and how "
        "fast in samples, not which algorithm is better on real tasks. With one optimizer step per batch the "
        "update starts on-policy (every ratio 1), where the clipped and reweighted losses (cispo, gmpo, sapo, "
        "clip_cov, kl_cov) all give the policy gradient: they follow grpo, and clip_cov and kl_cov follow dapo, "
        "whose dynamic sampling they share. They differ off-policy: several optimizer steps per batch "
        "(actor.ppo_epochs, smaller mini-batches) or asynchronous rollout: the warm-start section below runs them "
        "with actor.ppo_epochs=2.\n" + (f"\n{warm_start}" if warm_start else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=16384, help="samples generated per algorithm")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per algorithm (0, 1, ...)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs")
    args = parser.parse_args()
    console = Console()
    curves = []
    with tempfile.TemporaryDirectory(prefix="rlkit-compare-") as runs, Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,} samples"),
            TimeElapsedColumn(), console=console) as progress:
        for seed in range(args.seeds):
            for name in args.algorithms:
                curves.append(train_until(name, seed, args.samples, Path(runs), progress))
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs(curves, args.samples, args.out)
    summary = Table("algorithm", "seed", "final", "best", "steps", "seconds")
    for c in curves:
        summary.add_row(c.name, str(c.seed), f"{sum(c.rewards[-10:]) / len(c.rewards[-10:]):.3f}",
                        f"{max(smoothed(c.rewards)):.3f}", str(c.steps), f"{c.seconds:.0f}")
    console.print(summary)
    console.print(f"wrote {args.out / 'algorithm_comparison.md'} and .png")


if __name__ == "__main__":
    main()
