"""The benchmark's rollout alone: which vLLM sampling settings decide its speed, and where its time goes.

  python bench/vllm_rollout.py --workdir /tmp/bench --out rollout.json [--async-scheduling] [--tiny]
      [--separate-process true|false] [--prefix-caching true|false] [--engine-kwargs '{block_size: 64}']
      [--replicas N] [--streaming] [--sleep-mode] [--ways with_log_probs,without_log_probs,without_seeds]
      [--profile DIR] [--heap-objects 3000000]

One engine (rlkit's VLLMEngine, the way the trainer starts it) generates the workload's
512 x 512 tokens several ways; each is timed twice and the faster run counts:
- `with_log_probs`: rlkit's call on a log-prob check step (rollout.log_prob_check_freq) or
  with a rollout correction;
- `without_log_probs`: rlkit's call on every other step;
- `without_seeds`: no per-request seeds either (vLLM's unseeded sampler path).
Each way also reports Python's garbage collections during its best run (seconds per generation),
and on a GPU one more run while nvidia-smi samples the GPU's utilisation (`nvml_busy_fraction`, any
process); with the engine core in this process, one more under torch.profiler gives the share of the
wall time the GPU was busy (`gpu_busy_fraction`: the union of all kernels and copies over the wall time).
--separate-process: rollout.vllm.separate_process (default: rlkit's, off).
--replicas: rollout.vllm.replicas, N engines on the device, each in a process of its own (`without_seeds` then
needs one engine: leave it out of --ways).
--streaming: rollout.vllm.streaming, vLLM's async engine fed one request per sample (leave `without_seeds` out).
--sleep-mode: the engine as a colocated trainer runs it on a GPU (vLLM's sleep mode): each generate is woken
first, its weights loaded into the memory its last sleep freed (as the step's weight sync does), then put to sleep
at level 2; the wake and the load (~0.3-0.5 s) are inside each way's time. Without it the engine never sleeps (an
engine's `sleep` then only empties its prefix cache). On a CPU vLLM has no sleep mode: the weights are loaded again.
Leave `without_seeds` out with it (that way calls vLLM directly).
--heap-objects: afterwards, the same ways again with that many more long-lived Python objects in the
process (a trainer's heap: model, compiled graphs, Ray) to show what garbage collection then costs.
--profile DIR: cProfile tables and py-spy stacks (where installed) of one generate per way, in DIR.
bench/vllm_logprobs.py takes the log-prob cost apart (engine settings, profiles).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import Workload, prepared  # noqa: E402


def start_engine(workload: Workload, workdir: Path, gpu_memory_utilization: float,
                 engine_kwargs: dict[str, Any] | None = None, separate_process: bool = False,
                 prefix_caching: bool = True, replicas: int = 1, streaming: bool = False, sleep_mode: bool = False):
    """rlkit's engine as the trainer starts it (`make_engine`; CUDA graphs on a GPU, eager on a CPU)."""
    import torch

    from rlkit.core.rollout.engines import make_engine
    from rlkit.recipes.rollout_schema import RolloutConfig

    on_gpu = torch.cuda.is_available()
    rollout = RolloutConfig(name="vllm", gpu_memory_utilization=gpu_memory_utilization,
                            max_num_seqs=workload.sequences,
                            vllm={"enforce_eager": not on_gpu, "separate_process": separate_process,
                                  "prefix_caching": prefix_caching, "replicas": replicas, "streaming": streaming,
                                  "engine_kwargs": engine_kwargs or {}})
    return make_engine(rollout, str(workdir / "model"), max_model_len=workload.prompt_tokens + workload.response_tokens,
                       device=torch.device("cuda", 0) if on_gpu else torch.device("cpu"),
                       dtype="bfloat16" if on_gpu else "float32", seed=0, sleep_mode=sleep_mode)


def model_weights(folder: Path, device: Any) -> dict[str, Any]:
    """The workload model's weights (its safetensors files), on `device`: what --sleep-mode loads before each
    generate, as a step's weight sync does."""
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(file), device=str(device)))
    return weights


def bench_prompts(workload: Workload) -> list[list[int]]:
    """The workload's prompts as token ids (fixed, distinct per prompt)."""
    return [[(7 * p + k) % 200 + 3 for k in range(workload.prompt_tokens)] for p in range(workload.prompts)]


def timed(run: Callable[[], Any], repeats: int = 2) -> list[float]:
    """Wall seconds of each of `repeats` calls (the first also warms up; report the minimum)."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - began)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="vllm-rollout")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--async-scheduling", action="store_true", help="vLLM async_scheduling=True")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--separate-process", choices=["true", "false"], help="rollout.vllm.separate_process")
    parser.add_argument("--prefix-caching", default="true", choices=["true", "false"],
                        help="rollout.vllm.prefix_caching")
    parser.add_argument("--replicas", type=int, default=1, help="rollout.vllm.replicas (engines on the device)")
    parser.add_argument("--streaming", action="store_true", help="rollout.vllm.streaming (vLLM's async engine)")
    parser.add_argument("--sleep-mode", action="store_true",
                        help="a colocated trainer's engine: woken and its weights loaded before each generate, "
                             "asleep at level 2 after")
    parser.add_argument("--ways", default="with_log_probs,without_log_probs,without_seeds",
                        help="which ways to time, comma-separated")
    parser.add_argument("--engine-kwargs", default="{}", help="rollout.vllm.engine_kwargs (YAML), e.g. '{block_size: 64}'")
    parser.add_argument("--heap-objects", type=int, default=0, help="then again with this many more Python objects")
    parser.add_argument("--profile", help="folder for cProfile tables and py-spy stacks of one generate per way")
    args = parser.parse_args()
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from bench.host_time import GcTimer, gpu_busy, nvml_busy, py_spy, python_profile
    from rlkit.core.rollout.base import Sampling

    workload, workdir = prepared(args.workdir, args.tiny)
    start = time.perf_counter()
    engine_kwargs = {**yaml.safe_load(args.engine_kwargs), **({"async_scheduling": True} if args.async_scheduling else {})}
    engine = start_engine(workload, workdir, args.gpu_memory_utilization, engine_kwargs,
                          args.separate_process == "true", args.prefix_caching == "true", args.replicas,
                          args.streaming, args.sleep_mode)
    separate = getattr(engine, "separate_process", True)  # replicas, streaming: engine cores in processes of their own
    args.separate_process = separate
    result: dict = {"label": args.label, "args": vars(args), "engine_start_seconds": time.perf_counter() - start, "runs": {}}
    prompts = bench_prompts(workload)
    tokens = workload.sequences * workload.response_tokens

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    weights = model_weights(workdir / "model", device) if args.sleep_mode else {}

    def woken() -> None:
        """--sleep-mode: as a step's sync, then its rollout, wakes the engine (rlkit.core.rollout.generator)."""
        if args.sleep_mode:
            engine.wake_up(weights_only=True)
            engine.load_weights(weights.items())
            engine.wake_up()

    # Each way is a rollout as the trainer runs it: generate, then `sleep`, which without sleep mode empties
    # the prefix cache, so that a timed repeat does not find the previous run's prompts cached.
    def call(log_probs: bool) -> Callable[[], None]:
        return lambda: (woken(),
                        engine.generate(prompts, Sampling(n=workload.samples, max_tokens=workload.response_tokens,
                                                          seed=1, ignore_eos=True, log_probs=log_probs)),
                        engine.sleep(discard_weights=args.sleep_mode))

    def unseeded() -> None:
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(workload.samples)]
        params = SamplingParams(max_tokens=workload.response_tokens, ignore_eos=True, detokenize=False)
        engine.llm.generate(requests, params, use_tqdm=False)
        engine.sleep()

    ways = {"with_log_probs": call(True), "without_log_probs": call(False), "without_seeds": unseeded}
    ways = {name: ways[name] for name in args.ways.split(",")}
    heap: list[Any] = []
    for suffix in [""] + (["_big_heap"] if args.heap_objects else []):
        if suffix:  # long-lived objects, as a trainer's process holds them, gc-tracked and not frozen
            heap.extend([i] for i in range(args.heap_objects))  # lists: always gc-tracked
        for name, run in ways.items():
            seconds, timers = [], []
            for _ in range(2):
                timer = GcTimer()
                began = time.perf_counter()
                with timer.measuring():
                    run()
                seconds.append(time.perf_counter() - began)
                timers.append(timer)
            best = seconds.index(min(seconds))
            entry = {"seconds": seconds, "tokens_per_s": tokens / min(seconds), **timers[best].summary()}
            if torch.cuda.is_available():
                entry.update(nvml_busy(run))
                if not separate:  # torch.profiler sees this process's kernels only
                    entry.update(gpu_busy(run))
            if args.profile and not suffix and name != "without_seeds":  # the trainer's two ways
                folder = Path(args.profile)
                folder.mkdir(parents=True, exist_ok=True)
                with py_spy(folder / f"py-spy-{name}{suffix}.txt", min(seconds), separate):
                    run()
                entry["wall_seconds_under_cprofile"], table = python_profile(run)
                with (folder / "python_profiles.txt").open("a") as f:
                    f.write(f"\n\n######## {name}{suffix}\n{table}")
            result["runs"][name + suffix] = entry
            print(f"{name}{suffix}: {min(seconds):.2f} s, {tokens / min(seconds):,.0f} tok/s, gc "
                  f"{entry['gc_seconds']:.3f} s, GPU busy {entry.get('gpu_busy_fraction', '-')} (profiler) "
                  f"{entry.get('nvml_busy_fraction', '-')} (NVML)", flush=True)
            result["status"] = f"{len(result['runs'])} ways"
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
