"""One rlkit configuration on the benchmark workload: per-phase seconds, tokens/s/GPU and MFU.

  python bench/rlkit_grpo.py --workdir /tmp/bench --out result.json [--gpus 2] [--rollout hf]
      [--placement split] [--compile] [--cuda-graphs] [--grad-ckpt] [--old-log-probs recompute]
      [--engine-kwargs '{async_scheduling: true}'] [--tiny]

Steps after --warmup are averaged. The result JSON is rewritten after every step, so a run
cut short still leaves its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import H200_BF16_PEAK_FLOPS, Workload, prepared  # noqa: E402

# Phases the controller times; everything else in a step is controller overhead.
WORKER_PHASES = ("gen", "old_log_prob", "ref", "update_actor", "sync")


def overrides(args: argparse.Namespace, workload: Workload, data: str, runs_dir: str) -> list[str]:
    reward = Path(__file__).resolve().parent / "reward.py"
    return [
        f"data.train_files=[{data}]", f"data.train_batch_size={workload.prompts}",
        f"data.max_prompt_length={workload.prompt_tokens}", f"data.max_response_length={workload.response_tokens}",
        f"rollout.n={workload.samples}", "rollout.ignore_eos=true", f"rollout.name={args.rollout}",
        f"rollout.placement={args.placement}", f"rollout.max_num_seqs={workload.sequences}",
        f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"rollout.vllm.enforce_eager={str(not args.cuda_graphs).lower()}",
        # One optimizer step per RL step, like TRL's run of the same workload.
        f"actor.mini_batch_size={workload.prompts}", f"actor.micro_batch_tokens={args.micro_batch_tokens}",
        f"model.compile={str(args.compile).lower()}", f"model.gradient_checkpointing={str(args.grad_ckpt).lower()}",
        f"actor.old_log_probs={args.old_log_probs}", f"rollout.vllm.engine_kwargs={args.engine_kwargs}",
        f"reward.function={reward}:score", "reward.num_workers=0",
        f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_steps={args.steps}", "trainer.logger=[jsonl]",
        f"trainer.runs_dir={runs_dir}",
    ]


def summarize(steps: list[dict], workload: Workload, train_gpus: int, peak: float) -> dict:
    """Mean over the measured steps, per phase: seconds, tokens/s per training GPU, MFU."""
    mean = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0] if isinstance(steps[0][k], (int, float))}
    tokens = sum(s["perf/tokens_per_s"] * s["timing/step"] for s in steps) / len(steps)
    flops = workload.phase_flops()
    phases = {}
    for phase in ("old_log_prob", "ref", "update_actor"):
        seconds = mean.get(f"timing/{phase}")
        if seconds:
            phases[phase] = {"seconds": seconds, "tokens_per_s_per_gpu": tokens / seconds / train_gpus,
                             "mfu": flops[phase] / seconds / train_gpus / peak,
                             "tflops_per_gpu": flops[phase] / seconds / train_gpus / 1e12}
    measured = sum(mean.get(f"timing/{p}", 0.0) for p in WORKER_PHASES)
    return {
        "step_seconds": mean["timing/step"], "phases": phases,
        "rollout": {"seconds": mean["timing/gen"], "tokens_per_s": mean["perf/response_tokens"] / mean["timing/gen"]},
        "sync_seconds": mean["timing/sync"], "sync_bytes": mean.get("sync/bytes"),
        "reward_seconds": mean.get("timing/reward"), "adv_seconds": mean.get("timing/adv"),
        "controller_overhead_seconds": mean["timing/step"] - measured,
        "tokens_per_step": tokens, "response_tokens_per_step": mean["perf/response_tokens"],
        "rollout_log_prob_diff": mean.get("rollout/log_prob_diff"),
        "step_tokens_per_s_per_gpu": tokens / mean["timing/step"] / train_gpus,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="where the workload's model and prompts live (built once)")
    parser.add_argument("--out", required=True, help="result JSON")
    parser.add_argument("--label", default="rlkit")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batch (CPU smoke run)")
    parser.add_argument("--gpus", type=int, default=1, help="devices (trainer.n_gpus_per_node)")
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "sglang", "hf"])
    parser.add_argument("--placement", default="colocated", choices=["colocated", "split"])
    parser.add_argument("--compile", action="store_true", help="model.compile=true")
    parser.add_argument("--cuda-graphs", action="store_true", help="vLLM with CUDA graphs (rollout.vllm.enforce_eager=false)")
    parser.add_argument("--grad-ckpt", action="store_true", help="model.gradient_checkpointing=true")
    parser.add_argument("--old-log-probs", default="auto", choices=["auto", "recompute"],
                        help="actor.old_log_probs (auto skips the pass here: one optimizer step per RL step)")
    parser.add_argument("--engine-kwargs", default="{}", help="rollout.vllm.engine_kwargs, e.g. '{async_scheduling: true}'")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="leading steps left out of the means")
    parser.add_argument("--peak-flops", type=float, default=H200_BF16_PEAK_FLOPS, help="per-GPU bf16 peak for MFU")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rlkit.core.controller.controller import Controller
    from rlkit.core.controller.run_dir import RunDir
    from rlkit.recipes.loader import load_config

    workload, workdir = prepared(args.workdir, args.tiny)
    config = load_config("grpo", overrides(args, workload, str(workdir / "prompts.parquet"), str(workdir / "runs")),
                         model=str(workdir / "model"))
    train_gpus = config.world_size
    result: dict = {"label": args.label, "args": vars(args), "train_gpus": train_gpus, "status": "starting"}
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    start = time.perf_counter()
    controller = Controller(config, RunDir.create(config))
    result["setup_seconds"] = time.perf_counter() - start
    steps: list[dict] = []
    try:
        for step in range(1, args.steps + 1):
            steps.append(controller.step(step))
            result["steps"] = steps
            measured = steps[args.warmup:] or steps
            result.update(status=f"{step}/{args.steps} steps", summary=summarize(measured, workload, train_gpus,
                                                                                  args.peak_flops))
            save()
            print(f"[{args.label}] step {step}: {steps[-1]['timing/step']:.2f} s", flush=True)
        result["status"] = "done"
    finally:
        save()
        controller.close()


if __name__ == "__main__":
    main()
