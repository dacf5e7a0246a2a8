"""TRL's GRPOTrainer on the same workload as bench/rlkit_grpo.py, for a like-for-like step time.

  python bench/trl_grpo.py --workdir /tmp/bench --out trl.json [--vllm | --vllm-server] [--tiny]
      [--shape 7b] [--prompts 16] [--lora-rank 64] [--grad-ckpt] [--micro-batch-tokens 12288]
      [--gpu-memory-utilization 0.35]

Same model files, prompts, reward, sampling and batch: 64 prompts x 8 samples per
optimizer step (per_device 16 x gradient accumulation 32 = one generation batch of 512),
responses forced to 512 tokens, fp32 master weights with bf16 autocast, KL to a reference
(beta 0.001, as rlkit's grpo recipe), gradient checkpointing off (rlkit's default).
--shape, --prompts, --lora-rank and --grad-ckpt mean what they mean in bench/rlkit_grpo.py
(the same workload folder, the same peft LoRA: alpha 2 x rank, every linear layer but the
head, no dropout; TRL's reference is then the base with the adapters off, as rlkit's);
--micro-batch-tokens is rlkit's actor.micro_batch_tokens in TRL's unit, sequences per device
(every sequence here is prompt + response tokens long).
--vllm uses TRL's colocated vLLM (its defaults: CUDA graphs, no sleep mode); --vllm-server
TRL's two-GPU setup: `trl vllm-serve` on the second visible GPU, the trainer on the first
(weights sent to the server over NCCL after each step); without either, transformers
generate. --bytecode keeps Python's bytecode where the machine writes none, in the folder and the way the `rlkit`
command does (rlkit/core/bytecode.py; lent GPU images set PYTHONDONTWRITEBYTECODE): start-up against rlkit's with
bytecode on both sides (docs/startup.md). A step is timed from one optimizer step's end to the next; the start-up
from the process's launch to the end of the first optimizer step (`startup`, as rlkit's
`startup/launch_to_first_step_s`); `peak_gpu_memory_gib` is the most nvidia-smi showed on this process's GPU
(None without one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if __name__ == "__main__" and "--bytecode" in sys.argv:  # before TRL, transformers and vLLM are imported
    from rlkit.core.bytecode import keep_bytecode

    keep_bytecode()

from bench.reward import trl_reward  # noqa: E402
from bench.rlkit_grpo import GpuMemoryPeak  # noqa: E402
from bench.workload import SHAPES, Workload, prepared  # noqa: E402
from rlkit.core.rollout.engine_start import start_parts, vllm_info_lines  # noqa: E402
from rlkit.core.startup import process_start_time  # noqa: E402

LAUNCH = process_start_time() or time.time()  # as rlkit's start-up clock counts: from the process's launch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="trl")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="Qwen2.5 model shape (random weights)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the workload's)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="peft LoRA of this rank (alpha = 2 x rank, all linear layers); 0 = full fine-tuning")
    parser.add_argument("--grad-ckpt", action="store_true",
                        help="gradient checkpointing (on in TRL's defaults; off here unless given, as in rlkit's)")
    parser.add_argument("--micro-batch-tokens", type=int, default=None,
                        help="tokens per forward/backward, a multiple of prompt + response tokens "
                             "(per_device_train_batch_size = this / that); default 16 sequences")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vllm_gpu_memory_utilization of the colocated engine (default: TRL's, 0.3)")
    parser.add_argument("--vllm", action="store_true", help="TRL's vLLM colocate mode")
    parser.add_argument("--vllm-server", action="store_true",
                        help="TRL's server mode: `trl vllm-serve` on the second visible GPU, the trainer on the first")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--bytecode", action="store_true",
                        help="keep Python's bytecode as the rlkit command does where the machine writes none")
    return parser


def lora_settings(rank: int) -> dict | None:
    """The peft LoraConfig a TRL user writes for bench/rlkit_grpo.py's `--lora-rank rank` (rlkit's model.lora with
    alpha 2 x rank and its defaults: every linear layer but the output head, no dropout); None for 0."""
    if not rank:
        return None
    return dict(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")


def sequences_per_micro_batch(micro_batch_tokens: int | None, workload: Workload) -> int:
    """per_device_train_batch_size: `micro_batch_tokens` in whole sequences (16 when not given), at most one step's."""
    length = workload.prompt_tokens + workload.response_tokens
    if micro_batch_tokens is not None and (micro_batch_tokens < length or micro_batch_tokens % length):
        raise ValueError(f"--micro-batch-tokens {micro_batch_tokens}: give a multiple of {length} "
                         "(prompt + response tokens), so each micro-batch holds whole sequences")
    per_device = min(16 if micro_batch_tokens is None else micro_batch_tokens // length, workload.sequences)
    if workload.sequences % per_device:
        raise ValueError(f"--micro-batch-tokens {micro_batch_tokens}: {workload.sequences} sequences a step do not "
                         f"split into micro-batches of {per_device}")
    return per_device


def grpo_settings(args: argparse.Namespace, workload: Workload, output_dir: str, server_url: str | None) -> dict:
    """GRPOConfig's arguments: one optimizer step over the whole generation batch, as rlkit's run of the workload."""
    per_device = sequences_per_micro_batch(args.micro_batch_tokens, workload)
    use_vllm = args.vllm or server_url is not None
    forced = {"ignore_eos": True} if use_vllm else {"min_new_tokens": workload.response_tokens}
    mode = {"vllm_mode": "server", "vllm_server_base_url": server_url} if server_url else {"vllm_mode": "colocate"}
    if args.gpu_memory_utilization is not None:
        mode["vllm_gpu_memory_utilization"] = args.gpu_memory_utilization
    return dict(
        output_dir=output_dir, per_device_train_batch_size=per_device,
        gradient_accumulation_steps=workload.sequences // per_device, num_generations=workload.samples,
        max_completion_length=workload.response_tokens, generation_kwargs=forced, temperature=1.0,
        learning_rate=1e-6, beta=0.001, max_steps=args.steps, logging_steps=1, save_strategy="no",
        report_to="none", bf16=not args.tiny, use_cpu=args.tiny, gradient_checkpointing=args.grad_ckpt,
        use_vllm=use_vllm, seed=0, dataloader_num_workers=0, **mode)


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    workload, workdir = prepared(args.workdir, args.tiny, args.shape)
    if args.prompts:
        workload = replace(workload, prompts=args.prompts)
    try:
        sequences_per_micro_batch(args.micro_batch_tokens, workload)
    except ValueError as exc:
        parser.error(str(exc))
    server = start_vllm_server(str(workdir / "model"), workload) if args.vllm_server else None
    import pyarrow.parquet as pq
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts = pq.read_table(workdir / "prompts.parquet").column("prompt").to_pylist()
    settings = grpo_settings(args, workload, str(workdir / "trl-out"), server[1] if server else None)
    config = GRPOConfig(**settings)
    lora, peft_config = lora_settings(args.lora_rank), None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(**lora)
    result: dict = {"label": args.label, "args": vars(args), "trl_version": trl.__version__, "status": "starting",
                    "settings": {k: v for k, v in settings.items() if k != "output_dir"}, "lora": lora}
    out = Path(args.out)
    ends: list[float] = []
    engine_parts: dict[str, float] = {}

    class StepTimes(TrainerCallback):
        def on_train_begin(self, *_, **__):
            ends.append(time.perf_counter())
            result["startup"] = {"launch_to_train_begin_s": round(time.time() - LAUNCH, 3),
                                 "trainer_build_s": round(result["setup_seconds"], 3),
                                 **{key: round(seconds, 3) for key, seconds in engine_parts.items()}}

        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())
            if len(ends) == 2:  # the first optimizer step's end
                result["startup"]["launch_to_first_step_s"] = round(time.time() - LAUNCH, 3)
            times = [b - a for a, b in zip(ends, ends[1:])]
            measured = times[args.warmup:] or times
            result.update(status=f"{len(times)}/{args.steps} steps", step_times=times,
                          step_seconds=sum(measured) / len(measured), peak_gpu_memory_gib=peak_gib())
            out.write_text(json.dumps(result, indent=1))
            print(f"[{args.label}] step {len(times)}: {times[-1]:.2f} s", flush=True)

    memory = GpuMemoryPeak()  # the trainer and its colocated engine, as rlkit_grpo.py measures rlkit's

    def peak_gib() -> float | None:
        return memory.peak_mib / 1024 if memory.peak_mib else None

    memory.start()
    start, began = time.perf_counter(), time.time()
    # The colocated engine's start, part by part, read from vLLM's INFO lines as rlkit reads its own engines'
    # (rlkit/core/rollout/engine_start.py; TRL leaves vLLM's screen at WARNING, which stays so)
    with vllm_info_lines() if args.vllm else nullcontext([]) as lines:
        trainer = GRPOTrainer(model=str(workdir / "model"), reward_funcs=trl_reward, args=config,
                              train_dataset=Dataset.from_dict({"prompt": prompts}),
                              processing_class=AutoTokenizer.from_pretrained(workdir / "model"),
                              callbacks=[StepTimes()], peft_config=peft_config)
    result["setup_seconds"] = time.perf_counter() - start
    # before_weights_load counts from the trainer's construction: TRL's model loads come before its engine's
    engine_parts.update(start_parts(lines, began, time.time()))
    try:
        trainer.train()
        result["status"] = "done"
    finally:
        result["peak_gpu_memory_gib"] = peak_gib()
        out.write_text(json.dumps(result, indent=1))
        if server is not None:
            server[0].kill()


def start_vllm_server(model: str, workload, timeout_s: float = 600) -> tuple[subprocess.Popen, str]:
    """`trl vllm-serve` on the second visible GPU; this process keeps the first. Returns (process, base URL)."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")
    if len(gpus) < 2:
        raise SystemExit("--vllm-server needs two visible GPUs (one for the server, one for the trainer)")
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    trl_cli = [shutil.which("trl")] if shutil.which("trl") else [sys.executable, "-c", "from trl.cli import main; main()"]
    server = subprocess.Popen(
        [*trl_cli, "vllm-serve", "--model", model, "--port", str(port), "--gpu-memory-utilization", "0.9",
         "--max-model-len", str(workload.prompt_tokens + workload.response_tokens)],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus[1]})
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]  # before torch initialises CUDA in this process
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/health/", timeout=5)
            return server, url
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"trl vllm-serve did not come up on port {port} (exit {server.poll()})") from None
            time.sleep(2)


if __name__ == "__main__":
    main()
