"""The benchmark's rollout alone: which vLLM sampling settings decide its speed.

  python bench/vllm_rollout.py --workdir /tmp/bench --out rollout.json [--async-scheduling] [--tiny]

One engine (rlkit's VLLMEngine, the way the trainer starts it) generates the workload's
512 x 512 tokens several ways; each is timed twice and the faster run counts:
- `with_log_probs`: rlkit's call on a log-prob check step (rollout.log_prob_check_freq);
- `without_log_probs`: rlkit's call on every other step;
- `without_seeds`: no per-request seeds either (vLLM then draws all requests' noise at once
  instead of one kernel per seeded request and step).
bench/vllm_logprobs.py takes the log-prob cost apart (engine settings, profiles).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import Workload, prepared  # noqa: E402


def start_engine(workload: Workload, workdir: Path, gpu_memory_utilization: float,
                 engine_kwargs: dict[str, Any] | None = None):
    """rlkit's VLLMEngine as the trainer starts it (CUDA graphs on a GPU, eager on a CPU)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from rlkit.core.rollout.vllm_engine import VLLMEngine

    on_gpu = torch.cuda.is_available()
    return VLLMEngine(str(workdir / "model"), dtype="bfloat16" if on_gpu else "float32", seed=0,
                      max_model_len=workload.prompt_tokens + workload.response_tokens,
                      device=torch.device("cuda", 0) if on_gpu else torch.device("cpu"),
                      gpu_memory_utilization=gpu_memory_utilization, enforce_eager=not on_gpu,
                      max_num_seqs=workload.sequences, sleep_mode=False, engine_kwargs=engine_kwargs)


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
    args = parser.parse_args()
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rlkit.core.rollout.base import Sampling

    workload, workdir = prepared(args.workdir, args.tiny)
    start = time.perf_counter()
    engine = start_engine(workload, workdir, args.gpu_memory_utilization,
                          {"async_scheduling": True} if args.async_scheduling else None)
    result: dict = {"label": args.label, "args": vars(args), "engine_start_seconds": time.perf_counter() - start, "runs": {}}
    prompts = bench_prompts(workload)
    tokens = workload.sequences * workload.response_tokens

    def call(log_probs: bool) -> None:
        engine.generate(prompts, Sampling(n=workload.samples, max_tokens=workload.response_tokens, seed=1,
                                          ignore_eos=True, log_probs=log_probs))

    def unseeded() -> None:
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(workload.samples)]
        params = SamplingParams(max_tokens=workload.response_tokens, ignore_eos=True, detokenize=False)
        engine.llm.generate(requests, params, use_tqdm=False)

    ways = {"with_log_probs": lambda: call(True), "without_log_probs": lambda: call(False), "without_seeds": unseeded}
    for name, run in ways.items():
        seconds = timed(run)
        result["runs"][name] = {"seconds": seconds, "tokens_per_s": tokens / min(seconds)}
        print(f"{name}: {min(seconds):.2f} s, {tokens / min(seconds):,.0f} tok/s", flush=True)
        result["status"] = f"{len(result['runs'])}/{len(ways)} ways"
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
