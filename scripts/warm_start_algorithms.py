"""The 2025-26 losses' recipes beside grpo on the CPU warm-start pipeline (tests/test_warm_start_e2e.py's task):
SFT once, then each recipe's RL run from the same SFT export, off-policy (actor.ppo_epochs=2).

Not a test (one run per recipe would break the suite's budget): a benchmark that writes its section of
docs/algorithm_comparison.md (start and end validation scores per recipe) and
docs/algorithm_comparison_warm_start.png (each run's training reward per step). Every command runs in this
process with trainer.workers=in_process, one recipe after another; on 2 CPU cores the default takes about
25 minutes.

    nice -n 10 python scripts/warm_start_algorithms.py [--recipes grpo cispo ...] [--steps 40] [--ppo-epochs 2]
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The warm-start task and shapes of tests/test_warm_start_e2e.py and the README.
TASK = ["-o", "min_steps=2", "-o", "max_steps=2", "-o", "max_number=9", "-o", "max_factor=3", "-o", "max_value=50",
        "-o", "n_train=4000", "-o", "n_test=64"]
SHAPES = ["data.max_prompt_length=128", "data.max_response_length=64", "actor.micro_batch_tokens=8192"]
IN_PROCESS = ["trainer.workers=in_process", "trainer.device=cpu", "trainer.logger=[jsonl]"]
SFT = ["data.train_batch_size=32", "actor.mini_batch_size=32", "actor.lr=3e-3", "actor.lr_schedule=constant",
       "actor.warmup_steps=0", "trainer.total_steps=300", "trainer.val_freq=0", "trainer.save_freq=0"]
# The test's GRPO settings for every recipe (each keeps its loss, its options and its dynamic sampling); the
# mini-batch is the whole batch (clip_cov's and kl_cov's recipes ask for 32 prompts, the batch has 16).
RL = ["data.train_batch_size=16", "rollout.n=8", "actor.mini_batch_size=16", "actor.lr=3e-4",
      "actor.use_kl_loss=false", "trainer.val_freq=20", "trainer.val_n=4", "reward.num_workers=1"]
RECIPES = ["grpo", "cispo", "gmpo", "sapo", "clip_cov", "kl_cov"]
SECTION_START, SECTION_END = "<!-- warm_start_algorithms.py -->", "<!-- /warm_start_algorithms.py -->"


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
    """Data, a scratch model and its SFT export (the same for every recipe); returns the export."""
    data = work / "data"
    rlkit("prep-data", "arithmetic", "--out", str(data / "sft"), *TASK, "--format", "sft")
    rlkit("prep-data", "arithmetic", "--out", str(data / "rl"), *TASK)
    script = REPO / "scripts" / "build_scratch_model.py"
    argv = sys.argv
    sys.argv = [str(script), "--data", str(data / "sft" / "train.parquet"), "--out", str(work / "base"), "--size",
                "tiny"]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    rlkit("train", "sft", "--model", str(work / "base"), f"data.train_files=[{data / 'sft' / 'train.parquet'}]",
          *SFT, *SHAPES, *IN_PROCESS, f"trainer.runs_dir={work / 'runs'}", "--run-id", "sft")
    rlkit("export", "sft", "--runs-dir", str(work / "runs"), "--out", str(work / "sft-model"))
    return work / "sft-model"


def train(recipe: str, model: Path, work: Path, steps: int, ppo_epochs: int) -> dict:
    """One recipe's RL run from the SFT export: its validations and its training reward per step."""
    data, started = work / "data" / "rl", time.perf_counter()
    rlkit("train", recipe, "--model", str(model), f"data.train_files=[{data / 'train.parquet'}]",
          f"data.val_files=[{data / 'test.parquet'}]", *RL, f"actor.ppo_epochs={ppo_epochs}",
          f"trainer.total_steps={steps}", *SHAPES, *IN_PROCESS, f"trainer.runs_dir={work / 'runs'}", "--run-id", recipe)
    rows = records(work / "runs" / recipe)
    return {
        "recipe": recipe,
        "seconds": time.perf_counter() - started,
        "val": {r["step"]: r for r in rows if "val/reward/mean@1" in r},
        # With dynamic sampling (clip_cov, kl_cov) the trained batch holds only groups with signal: the policy's
        # reward is the mean over every sample generated, as compare_algorithms.py plots it.
        "reward": [(r["step"], r.get("dapo/reward_mean_sampled", r["reward/mean"]))
                   for r in rows if "reward/mean" in r],
    }


def write_section(runs: list[dict], steps: int, ppo_epochs: int, out: Path, command: str) -> None:
    """The table and the plot; the section replaces its earlier self in docs/algorithm_comparison.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        ax.plot([s for s, _ in run["reward"]], [r for _, r in run["reward"]], label=run["recipe"])
    ax.set_xlabel("RL step (16 prompts x 8 samples)")
    ax.set_ylabel("mean reward of the step's samples (all generated)")
    ax.set_title(f"warm start (arithmetic, 0.6M-param scratch Qwen2 after SFT), ppo_epochs={ppo_epochs}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "algorithm_comparison_warm_start.png", dpi=120)

    mid = steps // 2
    rows = ""
    for run in runs:
        val = run["val"]
        greedy = [val[s]["val/reward/mean@1"] if s in val else float("nan") for s in (0, mid, steps)]
        sampled = [val[s]["val/reward/mean@4"] if s in val else float("nan") for s in (0, mid, steps)]
        verdict = "yes" if sampled[2] > sampled[0] else "**no**"
        rows += (f"| {run['recipe']} | {greedy[0]:.3f} | {greedy[1]:.3f} | {greedy[2]:.3f} | {sampled[0]:.3f} "
                 f"| {sampled[1]:.3f} | {sampled[2]:.3f} | {verdict} | {run['seconds']:.0f} |\n")
    section = (
        f"{SECTION_START}\n## The 2025-26 losses on the warm-start pipeline, off-policy\n\n"
        f"Written by `{command}`; do not edit by hand.\n\n"
        "The CPU warm start of tests/test_warm_start_e2e.py (arithmetic word problems, a 0.6M-parameter Qwen2 "
        "built from scratch, 300 SFT steps) once; then each recipe from the same SFT export with the test's GRPO "
        f"settings (16 prompts x 8 samples, lr 3e-4, no KL loss, {steps} steps) and actor.ppo_epochs={ppo_epochs}: "
        "each batch is trained twice, so the second pass is off-policy and the losses differ from grpo's gradient. "
        "Each recipe keeps its loss and options (and clip_cov's and kl_cov's dynamic sampling). Validation on the "
        "64 held-out problems: greedy (mean@1) and 4 samples at temperature 1 (mean@4, 256 answers); step 0 is the "
        "SFT model. Beats start = mean@4 at the last step above step 0's.\n\n"
        f"| recipe | greedy @0 | greedy @{mid} | greedy @{steps} | mean@4 @0 | mean@4 @{mid} | mean@4 @{steps} "
        "| beats start | seconds |\n|---|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n![training reward per step](algorithm_comparison_warm_start.png)\n{SECTION_END}\n"
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
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--steps", type=int, default=40, help="RL steps per recipe (validations at 0, half, end)")
    parser.add_argument("--ppo-epochs", type=int, default=2, help="actor.ppo_epochs: 2 makes the update off-policy")
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="rlkit-warm-start-") as tmp:
        model = warm_start(Path(tmp))
        for recipe in args.recipes:
            runs.append(train(recipe, model, Path(tmp), args.steps, args.ppo_epochs))
            scores = {s: (r["val/reward/mean@1"], r["val/reward/mean@4"]) for s, r in runs[-1]["val"].items()}
            print(f"{recipe}: (greedy, mean@4) by step {scores} in {runs[-1]['seconds']:.0f} s", flush=True)
    command = "nice -n 10 python scripts/warm_start_algorithms.py " + " ".join(sys.argv[1:])
    write_section(runs, args.steps, args.ppo_epochs, args.out, command.strip())
    print(f"wrote {args.out / 'algorithm_comparison.md'} and algorithm_comparison_warm_start.png")


if __name__ == "__main__":
    main()
