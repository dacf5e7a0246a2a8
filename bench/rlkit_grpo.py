"""One rlkit configuration on the benchmark workload: per-phase seconds, tokens/s/GPU, MFU, peak GPU memory.

  python bench/rlkit_grpo.py --workdir /tmp/bench --out result.json [--gpus 2] [--rollout hf]
      [--placement split] [--compile] [--cuda-graphs] [--defaults] [--grad-ckpt] [--old-log-probs recompute]
      [--engine-kwargs '{async_scheduling: true}'] [--shape 7b] [--lora-rank 16] [--prompts 16]
      [--mode one_step_off|async] [--max-staleness 2] [--weight-sync broadcast|object_store]
      [--rollout-is-cap 2.0] [--tiny]

Steps after --warmup are averaged. The result JSON is rewritten after every step, so a run
cut short still leaves its numbers. `startup` holds step 1's `startup/*` figures (docs/startup.md):
from the process's launch to the end of the first step, part by part. Peak memory is the most
`nvidia-smi` showed on any GPU (training and the rollout engine together), sampled twice a second;
None without a GPU. The rollout's GPU-busy share (`summary.rollout.nvml_busy_fraction`, and per step in
`rollout_nvml_busy_by_step`) is the mean of nvidia-smi's utilisation samples, every 50 ms, of the first visible
GPU inside each step's rollout: every process's kernels count, the engines' own processes included. The
update's, the same way, is in `summary.phases.update_actor` and `update_nvml_busy_by_step`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if __name__ == "__main__":  # as the `rlkit` command, before torch, transformers and vLLM are imported (docs/startup.md)
    from rlkit.core.bytecode import keep_bytecode

    keep_bytecode()

from bench.host_time import NvmlSampler, busy_within  # noqa: E402
from bench.workload import (  # noqa: E402
    H200_BF16_PEAK_FLOPS,
    SHAPES,
    Workload,
    prepared,
)

# Phases the controller times (wait_for_rollout: asynchronous rollout's wait for the batch);
# everything else in a step is controller overhead.
WORKER_PHASES = ("gen", "wait_for_rollout", "old_log_prob", "ref", "update_actor", "sync")


def overrides(args: argparse.Namespace, workload: Workload, data: str, runs_dir: str) -> list[str]:
    reward = Path(__file__).resolve().parent / "reward.py"
    fast_paths = [] if args.defaults else [
        f"rollout.vllm.enforce_eager={str(not args.cuda_graphs).lower()}",
        f"actor.micro_batch_tokens={args.micro_batch_tokens}", f"model.compile={str(args.compile).lower()}"]
    return [
        f"data.train_files=[{data}]", f"data.train_batch_size={workload.prompts}",
        f"data.max_prompt_length={workload.prompt_tokens}", f"data.max_response_length={workload.response_tokens}",
        f"rollout.n={workload.samples}", "rollout.ignore_eos=true", f"rollout.name={args.rollout}",
        f"rollout.placement={args.placement}", f"rollout.max_num_seqs={workload.sequences}",
        f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}", *fast_paths,
        # One optimizer step per RL step, like TRL's run of the same workload.
        f"actor.mini_batch_size={workload.prompts}", f"model.gradient_checkpointing={str(args.grad_ckpt).lower()}",
        f"model.lora.rank={args.lora_rank}", f"model.lora.alpha={2 * max(args.lora_rank, 1)}",
        f"actor.old_log_probs={args.old_log_probs}", f"rollout.vllm.engine_kwargs={args.engine_kwargs}",
        f"reward.function={reward}:score", f"rollout.mode={args.mode}",
        *([f"rollout.max_staleness={args.max_staleness}"] if args.mode == "async" else []),
        *([f"rollout.weight_sync={args.weight_sync}"] if args.placement == "split" else []),
        *([f"actor.rollout_is_cap={args.rollout_is_cap}"] if args.rollout_is_cap else []),
        *([f"trainer.profile_steps=[{args.torch_profile_step}]"] if args.torch_profile else []),
        f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_steps={args.steps}", "trainer.logger=[jsonl]",
        f"trainer.runs_dir={runs_dir}", *args.override,
    ]


def summarize(steps: list[dict], workload: Workload, train_gpus: int, peak: float) -> dict:
    """Mean over the measured steps, per phase: seconds, tokens/s per training GPU, MFU."""
    mean = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]
            if isinstance(steps[0][k], (int, float)) and all(k in s for s in steps)}  # not step 1's startup/*
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
    # Asynchronous rollout: generation is off the step's path; the rollout worker reports its own time.
    gen = mean.get("timing/gen", mean.get("rollout/generate_seconds"))
    overlap = {k.split("/", 1)[1]: mean[k] for k in ("timing/wait_for_rollout", "rollout/wait_for_weights_seconds",
                                                     "rollout/idle_seconds", "sync/rollout_load_seconds",
                                                     "rollout/staleness_mean") if k in mean}
    return {
        "step_seconds": mean["timing/step"], "phases": phases,
        "rollout": {"seconds": gen, "tokens_per_s": mean["perf/response_tokens"] / gen},
        "sync_seconds": mean["timing/sync"], "sync_bytes": mean.get("sync/bytes"), "overlap": overlap,
        "reward_seconds": mean.get("timing/reward"), "adv_seconds": mean.get("timing/adv"),
        "controller_overhead_seconds": mean["timing/step"] - measured,
        "tokens_per_step": tokens, "response_tokens_per_step": mean["perf/response_tokens"],
        "rollout_log_prob_diff": mean.get("rollout/log_prob_diff"),
        "step_tokens_per_s_per_gpu": tokens / mean["timing/step"] / train_gpus,
    }


def rollout_windows(step_began: list[float], steps: list[dict]) -> list[tuple[float, float]]:
    """Each step's rollout by time.time(): from the step's start (the rollout is its first phase) to its
    generate's seconds later."""
    return [(began, began + step.get("timing/gen", step.get("rollout/generate_seconds", 0.0)))
            for began, step in zip(step_began, steps)]


def update_windows(step_began: list[float], steps: list[dict]) -> list[tuple[float, float]]:
    """Each step's actor update by time.time(): the step's last phases are the update, then the weight sync, so
    the update ends the sync's seconds before the step does. Empty for a step without an update."""
    windows = []
    for began, step in zip(step_began, steps):
        if "timing/update_actor" in step:
            ended = began + step["timing/step"] - step.get("timing/sync", 0.0)
            windows.append((ended - step["timing/update_actor"], ended))
    return windows


def gc_in_rollout(folder: Path, step_began: list[float], steps: list[dict]) -> dict[str, dict]:
    """Per process that wrote gc stats (bench/gc_site): all its collections' seconds per generation, and the
    seconds of its collections over 5 ms that fell inside a step's rollout (`rollout_windows`)."""
    windows = rollout_windows(step_began, steps)
    found = {}
    for path in folder.glob("*.json"):
        stats = json.loads(path.read_text())
        long_in_rollout = [took for at, _, took in stats["long"] if any(a <= at <= b for a, b in windows)]
        found[path.stem] = {"argv": stats["argv"], "seconds_by_generation": stats["seconds"],
                            "collections_by_generation": stats["counts"],
                            "long_collections_in_rollouts": len(long_in_rollout),
                            "long_collection_seconds_in_rollouts": round(sum(long_in_rollout), 3)}
        path.unlink()
    return found


class GpuMemoryPeak(threading.Thread):
    """The most memory any of this process's GPUs used (MiB, from nvidia-smi) while the benchmark ran.

    Only the GPUs CUDA_VISIBLE_DEVICES names, when set: another benchmark on the same machine
    must not show up in this one's peak.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib: float | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      *([f"--id={visible}"] if visible else [])],
                                     capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                return  # no GPU here
            used = [float(x) for x in out.split()] or [0.0]
            self.peak_mib = max(self.peak_mib or 0.0, *used)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="where the workload's model and prompts live (built once)")
    parser.add_argument("--out", required=True, help="result JSON")
    parser.add_argument("--label", default="rlkit")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batch (CPU smoke run)")
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="Qwen2.5 model shape (random weights)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the workload's)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="model.lora.rank (alpha = 2 x rank); 0 = full fine-tuning")
    parser.add_argument("--gpus", type=int, default=1, help="devices (trainer.n_gpus_per_node)")
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "sglang", "hf"])
    parser.add_argument("--placement", default="colocated", choices=["colocated", "split"])
    parser.add_argument("--defaults", action="store_true", help="rlkit's defaults (auto) for model.compile, "
                        "rollout.vllm.enforce_eager and actor.micro_batch_tokens: --compile, --cuda-graphs and "
                        "--micro-batch-tokens are ignored")
    parser.add_argument("--compile", action="store_true", help="model.compile=true")
    parser.add_argument("--cuda-graphs", action="store_true", help="vLLM with CUDA graphs (rollout.vllm.enforce_eager=false)")
    parser.add_argument("--grad-ckpt", action="store_true", help="model.gradient_checkpointing=true")
    parser.add_argument("--old-log-probs", default="auto", choices=["auto", "recompute"],
                        help="actor.old_log_probs (auto skips the pass here: one optimizer step per RL step)")
    parser.add_argument("--engine-kwargs", default="{}", help="rollout.vllm.engine_kwargs, e.g. '{async_scheduling: true}'")
    parser.add_argument("--mode", default="sync", choices=["sync", "one_step_off", "async"],
                        help="rollout.mode (one_step_off/async need --placement split)")
    parser.add_argument("--max-staleness", type=int, default=2, help="rollout.max_staleness (--mode async)")
    parser.add_argument("--weight-sync", default="broadcast", choices=["broadcast", "object_store"],
                        help="rollout.weight_sync (split placement)")
    parser.add_argument("--rollout-is-cap", type=float, default=None,
                        help="actor.rollout_is_cap: importance weights, so vLLM returns log-probs every step "
                             "(the like-for-like setting against TRL; on by default in async modes)")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a further recipe override, last (repeatable), e.g. rollout.sglang.attention_backend=triton")
    parser.add_argument("--host-profile", metavar="DIR",
                        help="where the time outside the GPU goes: every worker's garbage collections (bench/gc_site) "
                             "and py-spy stacks of every process during --py-spy-step's first seconds, in DIR")
    parser.add_argument("--py-spy-step", type=int, default=3)
    parser.add_argument("--torch-profile", metavar="DIR",
                        help="torch.profiler over step --torch-profile-step's phases in every training worker "
                             "(trainer.profile_steps): each phase's table of top kernels, summary and Chrome trace, "
                             "copied into DIR; that step is left out of the means")
    parser.add_argument("--torch-profile-step", type=int, default=3)
    parser.add_argument("--py-spy-seconds", type=float, default=10.0, help="how long py-spy samples that step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="leading steps left out of the means")
    parser.add_argument("--peak-flops", type=float, default=H200_BF16_PEAK_FLOPS, help="per-GPU bf16 peak for MFU")
    return parser


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` of another bench script, completed with this script's defaults for the settings it
    does not expose, so that `overrides` sees every setting (full fine-tuning, sync rollout, ...)."""
    for key, value in vars(build_parser().parse_args(["--workdir", "", "--out", ""])).items():
        if not hasattr(args, key):
            setattr(args, key, value)
    return args


def main() -> None:
    args = build_parser().parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rlkit.core.cluster.phases import profiled_step
    from rlkit.core.cluster.profiling import step_folder, summary_lines
    from rlkit.core.controller.controller import Controller
    from rlkit.core.rollout.sync_check import check_weight_sync
    from rlkit.core.state.run_dir import RunDir
    from rlkit.recipes.loader import load_config

    workload, workdir = prepared(args.workdir, args.tiny, args.shape)
    if args.prompts:
        workload = replace(workload, prompts=args.prompts)
    config = load_config("grpo", overrides(args, workload, str(workdir / "prompts.parquet"), str(workdir / "runs")),
                         model=str(workdir / "model"))
    train_gpus = config.world_size
    result: dict = {"label": args.label, "args": vars(args), "train_gpus": train_gpus, "status": "starting"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)  # run directly, not only under run_all (which makes it)

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    if args.host_profile:  # before Ray starts: its workers inherit the environment
        Path(args.host_profile).mkdir(parents=True, exist_ok=True)
        os.environ["RLKIT_BENCH_GC_DIR"] = args.host_profile
        site = str(Path(__file__).resolve().parent / "gc_site")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    memory = GpuMemoryPeak()
    memory.start()
    utilisation = NvmlSampler().start()  # the GPU's busy share in each step's rollout (issue 26's guard)
    step_began: list[float] = []
    start = time.perf_counter()
    steps: list[dict] = []
    controller = None
    try:
        controller = Controller(config, RunDir.create(config))
        result["setup_seconds"] = time.perf_counter() - start
        result["fast_paths"] = controller.fast_paths.describe()
        print(f"[{args.label}] {result['fast_paths']}", flush=True)
        for step in range(1, args.steps + 1):
            step_began.append(time.time())
            with ExitStack() as around:
                if args.host_profile and step == args.py_spy_step:
                    from bench.host_time import py_spy

                    around.enter_context(py_spy(Path(args.host_profile) / "py-spy-step.txt", args.py_spy_seconds,
                                                subprocesses=True))
                # as a training run's loop (rlkit.core.controller.loop) profiles trainer.profile_steps
                around.enter_context(profiled_step(controller.checkpoint_groups, controller.run.path, step,
                                                   config.trainer.profile_steps))
                steps.append(controller.step(step))
            if args.torch_profile and step == args.torch_profile_step:
                shutil.copytree(step_folder(controller.run.path, step), args.torch_profile, dirs_exist_ok=True)
                for line in summary_lines(Path(args.torch_profile)):
                    print(f"[{args.label}] step {step} profiled, rank 0 {line}", flush=True)
            steps[-1].update(controller.startup.finish())  # step 1's start-up parts, as a training run logs them
            check_weight_sync(steps[-1], config.rollout, step)  # as a training run does
            result["steps"] = steps
            result["startup"] = {k.removeprefix("startup/"): v for k, v in steps[0].items() if k.startswith("startup/")}
            # The engine-vs-trainer log-prob gap comes only from check steps (step 1, then every
            # rollout.log_prob_check_freq), rarely among the averaged ones: each is kept by its step.
            result["log_prob_diff_by_step"] = {i + 1: s["rollout/log_prob_diff"] for i, s in enumerate(steps)
                                               if "rollout/log_prob_diff" in s}
            # the steps averaged: after the warm-up, not the one under torch.profiler
            kept = [i for i in range(len(steps)) if i >= args.warmup
                    and not (args.torch_profile and i + 1 == args.torch_profile_step)] or list(range(len(steps)))
            measured = [steps[i] for i in kept]
            result.update(status=f"{step}/{args.steps} steps", summary=summarize(measured, workload, train_gpus,
                                                                                  args.peak_flops))
            windows = rollout_windows(step_began, steps)
            result["rollout_nvml_busy_by_step"] = {i + 1: busy_within(utilisation.samples, [window])
                                                   for i, window in enumerate(windows)}
            result["summary"]["rollout"].update(busy_within(utilisation.samples, [windows[i] for i in kept]))
            # The update's too: below ~95% the device waits for the host between micro-batches.
            updates = update_windows(step_began, steps)
            result["update_nvml_busy_by_step"] = {i + 1: busy_within(utilisation.samples, [window])
                                                  for i, window in enumerate(updates)}
            if "update_actor" in result["summary"]["phases"]:
                result["summary"]["phases"]["update_actor"].update(
                    busy_within(utilisation.samples, [updates[i] for i in kept if i < len(updates)]))
            result["peak_gpu_memory_gib"] = memory.peak_mib / 1024 if memory.peak_mib else None
            save()
            print(f"[{args.label}] step {step}: {steps[-1]['timing/step']:.2f} s", flush=True)
        result["status"] = "done"
    except Exception as exc:  # e.g. out of memory: the result says so, with the memory seen until then
        result["status"] = f"failed: {type(exc).__name__}: {str(exc)[:1000]}"
        raise
    finally:
        utilisation.stop()
        result["peak_gpu_memory_gib"] = memory.peak_mib / 1024 if memory.peak_mib else None
        if args.host_profile:
            result["gc_in_rollout"] = gc_in_rollout(Path(args.host_profile), step_began, steps)
        save()
        if controller is not None:
            controller.close()


if __name__ == "__main__":
    main()
