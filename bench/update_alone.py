"""The benchmark workload's training passes alone: the reference pass and the update, no Ray, no engine.

One process, a world of one, rlkit's own code (the sharding, the compiled layers, the packing, the log-prob
kernels, `learner.optimize`) on the workload's model and batch: `prompts x samples` rows of prompt + response tokens
(random ids, every response full), a one-step policy gradient with random advantages. The GRPO lane times these two
phases between a rollout and a weight sync; here they run back to back, so a kernel or sharding change is measured in
a minute of device time and its figures compare only with another run of this script on the same card.

  python bench/update_alone.py --workdir DIR --out result.json [--steps 4] [--trace DIR] [--tiny]
      [--attention transformers] [--logprob-kernels chunks] [--attention-kernel break]

Steps after the first (which compiles) are the figures; `--trace` profiles one more update (torch.profiler, a
Chrome trace for bench/trace_summary.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import SHAPES, prepared  # noqa: E402
from rlkit.core.batch import Batch  # noqa: E402
from rlkit.core.cluster.device_worker import free_port  # noqa: E402
from rlkit.core.train import fsdp, logprobs, packed_attention, packed_layout, packing  # noqa: E402
from rlkit.core.train.learner import micro_batches, optimize  # noqa: E402
from rlkit.core.train.model import TrainableModel  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="where the workload's model lives (built once, shared)")
    parser.add_argument("--out", required=True, help="the result, JSON")
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="the tiny workload (a CPU check of the script)")
    parser.add_argument("--steps", type=int, default=4, help="steps, the first compiling (default 4)")
    parser.add_argument("--micro-batch-tokens", type=int, default=22528, help="the lanes' budget on an H100")
    parser.add_argument("--trace", default=None, help="a folder for one more update's torch.profiler trace")
    parser.add_argument("--attention", choices=("packed", "transformers"), default="packed",
                        help="packed: rlkit's (rlkit.core.train.packed_layout); transformers: its own attention "
                             "forward, the packed layout undone (an A/B of the two in one call)")
    parser.add_argument("--logprob-kernels", choices=("default", "chunks"), default="default",
                        help="default: rlkit's (Triton's on CUDA, rlkit.core.train.logprob_triton, the logits whole); "
                             "chunks: torch's compiled chunk kernels everywhere (an A/B in one call)")
    parser.add_argument("--attention-kernel", choices=("in-graph", "break"), default="in-graph",
                        help="in-graph: the varlen kernel a node of each compiled layer's graph (rlkit's); break: "
                             "kept out of the graphs, each layer split around it (rlkit's before 2026-12-07; an A/B)")
    return parser.parse_args(argv)


def rollout_batch(rows: int, prompt: int, response: int, vocab: int) -> Batch:
    """Full rows of random tokens in the rollout layout, one random advantage a sequence."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, response).contiguous()
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1,
                  "responses": ids[:, prompt:].clone(), "response_mask": mask[:, prompt:].float(),
                  "advantages": advantages})


def load(path: str, attention: str) -> torch.nn.Module:
    """The model as the trainer loads it; with `attention="transformers"`, its attention modules' own classes back."""
    model = fsdp.load_model(path)
    if attention == "transformers":
        for module in model.modules():
            if type(module).__module__ == packed_layout.__name__:
                module.__class__ = type(module).__bases__[0]
    return model


def run(args: argparse.Namespace) -> dict:
    workload, workdir = prepared(args.workdir, args.tiny, args.shape)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = fsdp.compute_dtype("auto", device)
    _, copies = logprobs._kernels_on(device)
    started = time.perf_counter()
    path = str(workdir / "model")
    policy = fsdp.shard_model(load(path, args.attention), device=device, compute_dtype=dtype,
                              compile=device.type == "cuda")
    model = TrainableModel(policy, torch.optim.AdamW(policy.parameters(), lr=1e-6), scheduler=None)
    reference = fsdp.shard_model(load(path, args.attention), device=device, compute_dtype=dtype,
                                 compile=device.type == "cuda").eval().requires_grad_(False)
    load_s = time.perf_counter() - started
    batch = rollout_batch(workload.sequences, workload.prompt_tokens, workload.response_tokens, workload.vocab)
    norm = {"num_tokens": float(workload.sequences * workload.response_tokens), "num_seqs": float(workload.sequences)}

    def micro_step(mb: Batch, norm: dict[str, float]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        packed = packing.pack(mb).to(device)
        log_probs, entropy = fsdp.packed_log_probs(policy, packed, temperature=1.0, with_entropy=True,
                                                   fused_head=False)
        loss = -(log_probs * packed.gather(mb["advantages"].to(device))).sum() / norm["num_tokens"]
        tokens = torch.tensor(float(len(log_probs)), device=device)
        return loss, {"loss": loss, "entropy": entropy.sum(), "tokens": tokens}

    def reference_pass() -> None:
        with torch.no_grad():
            for rows in micro_batches(batch, args.micro_batch_tokens):
                packed = packing.pack(batch.select(rows)).to(device)
                fsdp.packed_log_probs(reference, packed, temperature=1.0, with_entropy=False, fused_head=False)

    def update() -> dict[str, float]:
        return optimize(model, [batch], [norm], micro_step, grad_clip=1.0, micro_batch_tokens=args.micro_batch_tokens)

    result: dict = {
        "shape": "tiny" if args.tiny else args.shape,
        "attention": sorted({type(m.self_attn).__name__ for m in policy.model.layers}),
        "logprob_kernels": "chunks" if copies else "triton",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "micro_batch_tokens": args.micro_batch_tokens,
        "load_s": round(load_s, 2),
        "ref_s": [],
        "update_s": [],
    }
    for _ in range(args.steps):
        for key, phase in (("ref_s", reference_pass), ("update_s", update)):
            sync()
            began = time.perf_counter()
            metrics = phase()
            sync()
            result[key].append(round(time.perf_counter() - began, 4))
    result["metrics"] = metrics
    if device.type == "cuda":  # what was compiled: one graph a layer and mode, or the pieces between graph breaks
        from torch._dynamo.utils import counters

        result["compiled_graphs"] = counters["stats"]["unique_graphs"]
        result["graph_breaks"] = sum(counters["graph_break"].values())
    later = {key: result[key][1:] or result[key] for key in ("ref_s", "update_s")}
    result["mean_after_first"] = {key: round(sum(v) / len(v), 4) for key, v in later.items()}
    if device.type == "cuda":
        result["peak_GiB"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        flops = workload.phase_flops()["update_actor"]
        result["update_tflops"] = round(flops / result["mean_after_first"]["update_s"] / 1e12, 1)
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as profile:
            update()
            sync()
        profile.export_chrome_trace(os.path.join(args.trace, "update.trace.json"))
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    dist.init_process_group(backend, rank=0, world_size=1)
    kernels_on, attend = logprobs._kernels_on, packed_attention.attend
    if args.logprob_kernels == "chunks":
        logprobs._kernels_on = lambda device: (logprobs._kernels, True)
    if args.attention_kernel == "break":
        packed_attention.attend = torch.compiler.disable(attend)
    try:
        result = run(args)
    finally:
        logprobs._kernels_on, packed_attention.attend = kernels_on, attend
        dist.destroy_process_group()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"}), flush=True)
    return result


if __name__ == "__main__":
    main()
