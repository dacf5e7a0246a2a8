"""Fit the step-time constants of `rlkit plan` on measured H200 runs, and check them one run left out at a time.

    python bench/plan_time_fit.py          # CPU, a few seconds: each model is built on the meta device

MEASURED holds the runs' mean seconds per phase (steps after the first; docs/benchmarks.md, "Calibration
of rlkit plan"). Every prediction goes through rlkit.core.planning.timing.step_time. Each group of
constants is linear in what is fitted, so each is a least-squares fit of relative errors:
  training   1 / matmul_efficiency, forward_s_per_micro_batch, update_s_per_micro_batch (ref and update)
  decode     decode_s_per_layer, decode_s_per_sequence (generation, with the efficiency above for the prefill)
  sync       sync_s, 1 / sync_bytes_per_s
Prints the constants fitted on all runs, then per run: the plan with timing.CALIBRATION, and the
prediction with constants fitted on the other runs alone (leave-one-out).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.rlkit_grpo import build_parser, overrides  # noqa: E402
from bench.workload import SHAPES  # noqa: E402
from rlkit.core.planning import timing  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Run:
    label: str
    flags: list[str]  # bench/rlkit_grpo.py's flags of the run
    gen: float
    ref: float
    update: float
    sync: float
    step: float


# One H200, 2026-12-01, vLLM 0.26 (CUDA graphs), torch 2.11: bench/plan_check.py (the first) and bench/rlkit_grpo.py.
MEASURED = [
    Run("0.5B, 64 prompts, compiled, 32768 tokens", ["--shape", "0.5b", "--compile", "--micro-batch-tokens", "32768"],
        4.76, 1.09, 3.47, 0.39, 9.90),
    Run("0.5B, 16 prompts", ["--shape", "0.5b", "--prompts", "16", "--grad-ckpt", "--micro-batch-tokens", "8192"],
        2.38, 0.72, 3.90, 0.28, 7.34),
    Run("3B, 16 prompts", ["--shape", "3b", "--prompts", "16", "--grad-ckpt", "--micro-batch-tokens", "8192"],
        3.59, 1.55, 7.00, 0.56, 12.77),
    Run("7B LoRA 16, 16 prompts", ["--shape", "7b", "--prompts", "16", "--grad-ckpt", "--micro-batch-tokens", "8192",
                                   "--lora-rank", "16"], 4.51, 2.84, 10.58, 0.90, 18.92),
]
# Earlier runs of the 0.5B bench (bench/plan_check.py), not fitted: printed as a further check.
BENCH_FLAGS = ["--shape", "0.5b", "--compile", "--micro-batch-tokens", "32768"]
EARLIER = [
    Run("0.5B bench, session 3", BENCH_FLAGS, 5.07, 1.18, 3.60, 0.41, 10.52),
    Run("0.5B bench, session 4", BENCH_FLAGS, 6.74, 1.18, 3.63, 0.30, 12.20),
    Run("0.5B bench, checkpointed, session 4", [*BENCH_FLAGS, "--grad-ckpt"], 6.81, 1.14, 4.89, 0.30, 13.42),
]
FITTED = {"training": ["matmul_efficiency", "forward_s_per_micro_batch", "update_s_per_micro_batch"],
          "decode": ["decode_s_per_layer", "decode_s_per_sequence"], "sync": ["sync_s", "sync_bytes_per_s"]}


def planned(run: Run, folder: Path):
    """(config, shape, micro-batch tokens) of the run as `rlkit plan` sees it; the measured steps returned
    no engine log-probs (the check runs on step 1, left out), so neither does the prediction."""
    from transformers import Qwen2Config

    from rlkit.core.planning.plan import build_plan
    from rlkit.recipes.loader import load_config

    args = build_parser().parse_args(["--workdir", str(folder), "--out", "unused", "--cuda-graphs", *run.flags])
    workload = SHAPES[args.shape] if args.prompts is None else dataclasses.replace(SHAPES[args.shape],
                                                                                 prompts=args.prompts)
    model = folder / args.shape
    if not model.exists():
        Qwen2Config(vocab_size=workload.vocab, hidden_size=workload.hidden, intermediate_size=workload.intermediate,
                    num_hidden_layers=workload.layers, num_attention_heads=workload.heads,
                    num_key_value_heads=workload.kv_heads, head_dim=workload.head_dim,
                    max_position_embeddings=workload.max_positions, tie_word_embeddings=workload.tied,
                    torch_dtype="bfloat16").save_pretrained(model)
    config = load_config("grpo", [*overrides(args, workload, str(folder / "prompts.parquet"), str(folder / "runs")),
                                  "rollout.log_prob_check_freq=0"], model=str(model), require_inputs=False)
    plan = build_plan(config, gpu_memory_gib=139.8)
    return config, plan.shape, plan.memory.micro_batch_tokens


def phases(item, cal: dict) -> dict[str, float]:
    config, shape, tokens = item
    return timing.step_time(config, shape, micro_batch_tokens=tokens, cal=cal).phases


def _solve(rows: list, targets: list[float], measured: list[float] | None = None) -> list[float]:
    """Least squares of errors relative to `measured` (default: the targets)."""
    scale = measured or targets
    a = np.array([[v / m for v in row] for row, m in zip(rows, scale)])
    return list(np.linalg.lstsq(a, np.array(targets) / np.array(scale), rcond=None)[0])


def fit(items: list, runs: list[Run]) -> dict:
    """timing.CALIBRATION with every FITTED constant fitted on `runs`."""
    cal = dict(timing.CALIBRATION)

    def basis(phase: str, **values: float) -> list[float]:
        return [phases(item, {**cal, **values})[phase] for item in items]

    fixed = {"forward_s_per_micro_batch": 0.0, "update_s_per_micro_batch": 0.0}
    variants = [{"matmul_efficiency": 1.0, **fixed}] + [{"matmul_efficiency": float("inf"), **fixed, key: 1.0}
                                                        for key in fixed]
    rows, targets = [], []
    for phase, measured in (("ref", [run.ref for run in runs]), ("update_actor", [run.update for run in runs])):
        rows += zip(*(basis(phase, **values) for values in variants))
        targets += measured
    inverse, forward, update = _solve(rows, targets)
    cal.update(matmul_efficiency=1 / inverse, forward_s_per_micro_batch=forward, update_s_per_micro_batch=update)
    none = basis("gen", decode_s_per_layer=0.0, decode_s_per_sequence=0.0)
    layer = basis("gen", decode_s_per_layer=1.0, decode_s_per_sequence=0.0)
    sequence = basis("gen", decode_s_per_layer=0.0, decode_s_per_sequence=1.0)
    per_layer, per_sequence = _solve([[layer[i] - none[i], sequence[i] - none[i]] for i in range(len(runs))],
                                     [run.gen - none[i] for i, run in enumerate(runs)], [run.gen for run in runs])
    cal.update(decode_s_per_layer=per_layer, decode_s_per_sequence=per_sequence)
    moved = basis("sync", sync_s=0.0, sync_bytes_per_s=1.0)  # bytes moved
    fixed, inverse_rate = _solve([[1.0, moved[i]] for i in range(len(runs))], [run.sync for run in runs])
    cal.update(sync_s=fixed, sync_bytes_per_s=1 / inverse_rate)
    return cal


def row(label: str, name: str, got: dict[str, float], run: Run) -> str:
    """A markdown row: predicted seconds per phase and step, (measured / predicted)."""
    values = [got["gen"], got["ref"], got["update_actor"], got["sync"], sum(got.values())]
    measured = [run.gen, run.ref, run.update, run.sync, run.step]
    return f"| {label} | {name} | " + " | ".join(f"{v:.2f} ({m / v:.2f})" for v, m in zip(values, measured)) + " |"


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        items = [planned(run, Path(folder)) for run in MEASURED]
        earlier = [planned(run, Path(folder)) for run in EARLIER]
    fitted = fit(items, MEASURED)
    print("fitted on all runs:", {k: f"{fitted[k]:.4g}" for group in FITTED.values() for k in group})
    print("| run | | gen | ref | update | sync | step |\n|---|---|---|---|---|---|---|")
    for i, run in enumerate(MEASURED):
        others = [j for j in range(len(MEASURED)) if j != i]
        held_out = fit([items[j] for j in others], [MEASURED[j] for j in others])
        print(row(run.label, "planned", phases(items[i], timing.CALIBRATION), run))
        print(row("", "left out", phases(items[i], held_out), run))
    for item, run in zip(earlier, EARLIER):
        print(row(run.label, "not fitted", phases(item, timing.CALIBRATION), run))

if __name__ == "__main__":
    main()
