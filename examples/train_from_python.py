"""Train from Python: GRPO on the tiny built-in `echo` task (the `grpo-demo` recipe of `make demo`: a tiny Qwen2
built offline, nothing downloaded, a CPU is enough) with a reward function written here, then read the run's
metrics and export the trained policy. docs/python_api.md explains each call.

    python examples/train_from_python.py               # 60 steps: the reward climbs from ~0.1 towards 1
    python examples/train_from_python.py --steps 2     # a quick check that everything works

Each cell below (`# %%`) runs as it is in a notebook too (there: set STEPS and RUNS_DIR by hand).
"""

# %% A reward function: any Python callable fn(data_source, response, ground_truth, extra_info) returning a float,
# or a dict with "score" whose other keys are logged as reward/<key>. rlkit runs it in reward worker processes
# (a copy made with cloudpickle), so it may be defined right here, in a script or a notebook.
from __future__ import annotations

import argparse

from rlkit import Run, train


def echo_reward(data_source: str, response: str, ground_truth: str, extra_info: dict) -> dict[str, float]:
    """Score 1.0 when the policy repeats the digit of the prompt ('echo 7' -> '7'), else 0.0; logs as
    reward/digit how often it answers with a digit at all."""
    answer = response.strip()
    return {"score": float(answer == ground_truth), "digit": float(answer.isdigit())}


def main(steps: int, runs_dir: str, workers: str) -> Run:
    # %% Train: the recipe, and overrides as {dotted key: value} (the command line's KEY=VALUE).
    run = train(
        "grpo-demo",
        overrides={
            "reward.function": echo_reward,  # the object itself; config.yaml records python:__main__:echo_reward
            "trainer.total_steps": steps,
            "trainer.runs_dir": runs_dir,
            # in_process: the workers are objects in this process (no Ray), which suits a notebook on a CPU;
            # ray: one worker process per device, as `rlkit train` runs by default.
            "trainer.workers": workers,
            "trainer.device": "cpu" if workers == "in_process" else "auto",
        },
    )

    # %% Read what the run wrote: a record per step, a metric's history, the checkpoints.
    rewards = run.history("reward/mean")
    window = min(5, len(rewards))
    first, last = list(rewards.values())[:window], list(rewards.values())[-window:]
    print(f"{run.id}: reward/mean {sum(first) / window:.3f} (first {window} steps) -> {sum(last) / window:.3f} (last)")
    print("validation (greedy, the task's test split):", run.history("val/reward/mean@1"))
    print("share of digit answers (reward/digit, from echo_reward's dict):", run.history("reward/digit"))
    print("checkpoints:", [checkpoint.step for checkpoint in run.checkpoints])
    same = Run.load(run.path)  # any run, later or from another process: by its directory, or its id and runs_dir
    last = same.metrics[-1]  # every metric of the last step: actor/*, reward/*, response/*, timing/*, val/*
    print(f"step {last['step']}: " + ", ".join(f"{k}={last[k]:.3g}" for k in ("actor/entropy", "actor/grad_norm")))

    # %% Export the last checkpoint as a Hugging Face model directory (transformers, vLLM, or --model of a new run).
    out = run.export(run.path / "export")
    print(f"exported to {out}")
    return run


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    parser.add_argument("--runs-dir", default="runs", help="parent folder of the run directory (default ./runs)")
    parser.add_argument("--workers", choices=["in_process", "ray"], default="in_process", help="trainer.workers")
    args = parser.parse_args()
    main(args.steps, args.runs_dir, args.workers)
