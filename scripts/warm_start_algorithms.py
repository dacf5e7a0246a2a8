"""The 2025-26 losses' recipes beside grpo on the CPU warm-start pipeline (tests/test_warm_start_e2e.py's task):
SFT once, then each recipe's RL run from the same SFT export, for each seed (trainer.seed: data order and
sampling) and each actor.ppo_epochs asked for (by default the recipe's own; 2 makes the second pass off-policy).

Not a test (one run per recipe would break the suite's budget): a benchmark that writes its section of
docs/algorithm_comparison.md (start and end validation scores per run, how many seeds beat their start) and
docs/algorithm_comparison_warm_start.png (training reward per step, each recipe's mean over seeds). Every
command runs with trainer.workers=in_process, in this process or, with --jobs N, in N worker processes;
one run takes about 2 minutes on a free CPU core.

    nice -n 10 python scripts/warm_start_algorithms.py [--recipes grpo sapo cispo@2 ...] [--seeds 0 1 2] \
        [--ppo-epochs 1 2] [--steps 40] [--jobs 2] [--set actor.loss_agg_mode=token-mean ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import runpy
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The warm-start task and shapes of tests/test_warm_start_e2e.py and the README.
TASK = [
    "-o",
    "min_steps=2",
    "-o",
    "max_steps=2",
    "-o",
    "max_number=9",
    "-o",
    "max_factor=3",
    "-o",
    "max_value=50",
    "-o",
    "n_train=4000",
    "-o",
    "n_test=64",
]
SHAPES = [
    "data.max_prompt_length=128",
    "data.max_response_length=64",
    "actor.micro_batch_tokens=8192",
]
IN_PROCESS = [
    "trainer.workers=in_process",
    "trainer.device=cpu",
    "trainer.logger=[jsonl]",
]
SFT = [
    "data.train_batch_size=32",
    "actor.mini_batch_size=32",
    "actor.lr=3e-3",
    "actor.lr_schedule=constant",
    "actor.warmup_steps=0",
    "trainer.total_steps=300",
    "trainer.val_freq=0",
    "trainer.save_freq=0",
]
# The test's GRPO settings for every recipe (each keeps its loss, its options, its aggregation, its dynamic
# sampling and its ppo_epochs unless --ppo-epochs says otherwise); the mini-batch is the whole batch, so one
# epoch is one on-policy optimizer step (clip_cov's and kl_cov's recipes ask for 32 prompts, the batch has 16).
RL = [
    "data.train_batch_size=16",
    "rollout.n=8",
    "actor.mini_batch_size=16",
    "actor.lr=3e-4",
    "actor.use_kl_loss=false",
    "trainer.val_freq=20",
    "trainer.val_n=4",
    "reward.num_workers=1",
]
RECIPES = ["grpo", "cispo", "gmpo", "sapo", "clip_cov", "kl_cov"]
SECTION_START, SECTION_END = (
    "<!-- warm_start_algorithms.py -->",
    "<!-- /warm_start_algorithms.py -->",
)


def rlkit(*args: str) -> None:
    """`rlkit ARGS` through the CLI's Typer app in this process; exits on a failed command."""
    from typer.testing import CliRunner

    from rlkit.cli.main import app
    from rlkit.core.cluster.local_group import release_engines

    result = CliRunner().invoke(app, list(args))
    release_engines()  # the next in-process run starts its own engine
    if result.exit_code != 0:
        sys.exit(f"rlkit {' '.join(args)} failed ({result.exit_code}):\n{result.output[-3000:]}\n{result.exception!r}")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def warm_start(work: Path) -> Path:
    """Data, a scratch model and its SFT export (the same for every recipe); returns the export. An export already
    in `work` (a study kept with --work) is used again, so further runs start from the same model."""
    data = work / "data"
    if (work / "sft-model").exists():
        return work / "sft-model"
    rlkit("prep-data", "arithmetic", "--out", str(data / "sft"), *TASK, "--format", "sft")
    rlkit("prep-data", "arithmetic", "--out", str(data / "rl"), *TASK)
    script = REPO / "scripts" / "build_scratch_model.py"
    argv = sys.argv
    sys.argv = [
        str(script),
        "--data",
        str(data / "sft" / "train.parquet"),
        "--out",
        str(work / "base"),
        "--size",
        "tiny",
    ]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    rlkit(
        "train",
        "sft",
        "--model",
        str(work / "base"),
        f"data.train_files=[{data / 'sft' / 'train.parquet'}]",
        *SFT,
        *SHAPES,
        *IN_PROCESS,
        f"trainer.runs_dir={work / 'runs'}",
        "--run-id",
        "sft",
    )
    rlkit(
        "export",
        "sft",
        "--runs-dir",
        str(work / "runs"),
        "--out",
        str(work / "sft-model"),
    )
    return work / "sft-model"


def recipe_ppo_epochs(recipe: str) -> int:
    """The actor.ppo_epochs a recipe trains with when nothing overrides it."""
    from rlkit.recipes.loader import load_config

    return load_config(recipe, ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"]).actor.ppo_epochs


def train(
    recipe: str,
    seed: int,
    ppo_epochs: int,
    model: Path,
    work: Path,
    steps: int,
    overrides: list[str],
) -> dict:
    """One recipe's RL run from the SFT export: its validations and its training reward per step. A run that
    finished in `work` before (its study.json) is read, not run again."""
    data, started, run_id = (
        work / "data" / "rl",
        time.perf_counter(),
        f"{recipe}-seed{seed}-epochs{ppo_epochs}" + "".join("-" + re.sub(r"[^\w.-]+", "_", o) for o in overrides),
    )
    summary = work / "runs" / run_id / "study.json"
    if summary.exists():
        run = json.loads(summary.read_text())
        return {**run, "val": {int(step): record for step, record in run["val"].items()}}
    rlkit(
        "train",
        recipe,
        "--model",
        str(model),
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]",
        *RL,
        *overrides,
        f"actor.ppo_epochs={ppo_epochs}",
        f"trainer.seed={seed}",
        f"trainer.total_steps={steps}",
        *SHAPES,
        *IN_PROCESS,
        f"trainer.runs_dir={work / 'runs'}",
        "--run-id",
        run_id,
    )
    rows = records(work / "runs" / run_id)
    run = {
        "recipe": recipe,
        "seed": seed,
        "ppo_epochs": ppo_epochs,
        "seconds": time.perf_counter() - started,
        "val": {r["step"]: r for r in rows if "val/reward/mean@1" in r},
        # With dynamic sampling (clip_cov, kl_cov) the trained batch holds only groups with signal: the policy's
        # reward is the mean over every sample generated, as compare_algorithms.py plots it.
        "reward": [
            (r["step"], r.get("dapo/reward_mean_sampled", r["reward/mean"])) for r in rows if "reward/mean" in r
        ],
    }
    summary.write_text(json.dumps(run))
    return run


def scores(run: dict, key: str, steps: tuple[int, ...]) -> list[float]:
    return [run["val"][s][key] if s in run["val"] else float("nan") for s in steps]


def write_section(runs: list[dict], steps: int, overrides: list[str], out: Path, command: str) -> None:
    """The table and the plot; the section replaces its earlier self in docs/algorithm_comparison.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["recipe"], run["ppo_epochs"]), []).append(run)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (recipe, ppo_epochs), group in groups.items():
        # Each recipe's mean over its seeds at the steps every seed logged.
        by_step = [dict(run["reward"]) for run in group]
        common = sorted(set.intersection(*(set(b) for b in by_step)))
        ax.plot(
            common,
            [sum(b[s] for b in by_step) / len(by_step) for s in common],
            label=f"{recipe}, ppo_epochs {ppo_epochs} ({len(group)} seeds)",
        )
    ax.set_xlabel("RL step (16 prompts x 8 samples)")
    ax.set_ylabel("mean reward of the step's samples (all generated)")
    ax.set_title("warm start (arithmetic, 0.6M-param Qwen2 after SFT), mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "algorithm_comparison_warm_start.png", dpi=120)

    mid, rows, summary = steps // 2, "", ""
    for (recipe, ppo_epochs), group in groups.items():
        wins = 0
        for run in group:
            greedy = scores(run, "val/reward/mean@1", (0, mid, steps))
            sampled = scores(run, "val/reward/mean@4", (0, mid, steps))
            wins += sampled[2] > sampled[0]
            verdict = "yes" if sampled[2] > sampled[0] else "**no**"
            rows += (
                f"| {recipe} | {ppo_epochs} | {run['seed']} | {greedy[0]:.3f} | {greedy[2]:.3f} "
                f"| {sampled[0]:.3f} | {sampled[1]:.3f} | {sampled[2]:.3f} | {sampled[2] - sampled[0]:+.3f} "
                f"| {verdict} | {run['seconds']:.0f} |\n"
            )
        change = sum(
            scores(r, "val/reward/mean@4", (steps,))[0] - scores(r, "val/reward/mean@4", (0,))[0] for r in group
        ) / len(group)
        summary += (
            f"- {recipe}, ppo_epochs {ppo_epochs}: beats its start on {wins} of {len(group)} seeds, "
            f"mean@4 change {change:+.3f} on average.\n"
        )
    section = (
        f"{SECTION_START}\n## The 2025-26 losses on the warm-start pipeline, over seeds\n\n"
        f"Written by `{command}`; do not edit by hand.\n\n"
        "The CPU warm start of tests/test_warm_start_e2e.py (arithmetic word problems, a 0.6M-parameter Qwen2 "
        "built from scratch, 300 SFT steps) once; then each recipe from the same SFT export with the test's GRPO "
        f"settings (16 prompts x 8 samples, lr 3e-4, no KL loss, {steps} steps, the mini-batch the whole batch) "
        "for each seed (trainer.seed: the order of the prompts and the sampling). Each recipe keeps its loss, its "
        "options, its loss_agg_mode (and clip_cov's and kl_cov's dynamic sampling). With ppo_epochs 1 the one "
        "optimizer step per batch is on-policy, where every loss here gives the policy gradient (they differ only "
        "in how tokens are averaged); with 2 the second pass is off-policy and the losses differ. Validation on "
        "the 64 held-out problems: greedy (mean@1) and 4 samples at temperature 1 (mean@4, 256 answers); step 0 "
        "is the SFT model. Beats start = mean@4 at the last step above step 0's."
        + (f" Every run also with `{' '.join(overrides)}`." if overrides else "")
        + "\n\n"
        f"| recipe | ppo_epochs | seed | greedy @0 | greedy @{steps} | mean@4 @0 | mean@4 @{mid} | mean@4 @{steps} "
        "| change | beats start | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n{summary}\n![training reward per step](algorithm_comparison_warm_start.png)\n{SECTION_END}\n"
    )
    doc = out / "algorithm_comparison.md"
    text = doc.read_text() if doc.exists() else ""
    if SECTION_START in text:
        before, _, rest = text.partition(SECTION_START)
        text = before + section + rest.partition(SECTION_END)[2].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--recipes",
        nargs="+",
        default=RECIPES,
        metavar="RECIPE[@EPOCHS]",
        help="recipes to run; sapo@2 runs sapo with actor.ppo_epochs=2 whatever --ppo-epochs says",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0],
        help="trainer.seed of each recipe's runs",
    )
    parser.add_argument(
        "--ppo-epochs",
        nargs="+",
        type=int,
        default=None,
        help="actor.ppo_epochs of each recipe's runs (default: the recipe's own; 2 is off-policy)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=40,
        help="RL steps per run (validations at 0, half, end)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for every run, after the pipeline's settings (e.g. actor.loss_agg_mode=token-mean)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the data and runs here (default: removed); runs already finished there are read, not run again",
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    plan = []
    for spec in args.recipes:
        recipe, _, epochs = spec.partition("@")
        for ppo_epochs in [int(epochs)] if epochs else args.ppo_epochs or [recipe_ppo_epochs(recipe)]:
            plan += [(recipe, seed, ppo_epochs) for seed in args.seeds]
    with tempfile.TemporaryDirectory(prefix="rlkit-warm-start-") as tmp:
        work = args.work or Path(tmp)
        model = warm_start(work)
        # A fresh spawned process per run: each starts its own in-process engine, and gives back its memory (the
        # CPU engine's KV cache, about 1 GiB) when the run ends.
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=spawn, max_tasks_per_child=1) as pool:
            futures = [pool.submit(train, *run, model, work, args.steps, args.set) for run in plan]
            runs = []
            for future in futures:
                try:
                    run = future.result()
                except BaseException:  # a failed run (rlkit() exits) stops the study: the rest are not started
                    pool.shutdown(cancel_futures=True)
                    raise
                runs.append(run)
                val = {s: (r["val/reward/mean@1"], r["val/reward/mean@4"]) for s, r in run["val"].items()}
                print(
                    f"{run['recipe']} seed {run['seed']} ppo_epochs {run['ppo_epochs']}: (greedy, mean@4) by step "
                    f"{val} in {run['seconds']:.0f} s",
                    flush=True,
                )
    command = "nice -n 10 python scripts/warm_start_algorithms.py " + " ".join(sys.argv[1:])
    write_section(runs, args.steps, args.set, args.out, command.strip())
    print(f"wrote {args.out / 'algorithm_comparison.md'} and algorithm_comparison_warm_start.png")


if __name__ == "__main__":
    main()
