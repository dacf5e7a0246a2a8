"""SGLang's offline engine (`sglang.Engine`), started by the worker that uses it.

Token ids in and out (no tokenizer in the engine), log-probs of the distribution actually
sampled (SGLang's default: after temperature), in-place weight updates from named tensors
(`update_weights_from_tensor`) and, colocated on a GPU, the memory saver that releases
weights and KV cache during training. The engine runs its scheduler in a child process.
With rollout.sglang.streaming every sample is a request of its own through SGLang's async client, as with
vLLM's async engine (rlkit.core.rollout.vllm_async): agent turns go out with no per-turn barrier, and
finished responses can be scored while the rest generate (rlkit.core.rollout.scored_generation).

Per-request seeds need SGLang's deterministic inference (its batch-invariant kernels), which
only its GPU attention backends support and `rollout.sglang.deterministic=true` turns on. It is off
by default, as it costs most of SGLang's speed: then, and on a CPU, the seeds are ignored
(`honors_seeds` is False), so rollouts are not reproducible.
Versions: docs/compatibility.md (0.5.17 is the newest for torch 2.11 on CUDA, 0.5.21 for torch 2.13).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Coroutine, Iterable, Iterator, Sequence, TypeVar

import torch

from rlkit.core.rollout import base
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt, request_seed
from rlkit.core.rollout.scored_generation import stream_samples

T = TypeVar("T")

# SGLang's memory-saver tags (sglang.srt.constants): the weights, and what generation needs besides.
_WEIGHTS = ("weights",)
_GENERATION = ("kv_cache", "cuda_graph")
# A weight sync hands tensors over in buckets of about this size: one call per tensor would
# cost a round trip to the scheduler each, one call for all would hold a full copy at once.
BUCKET_BYTES = 512 * 2**20
# SGLang keeps part of its context out of a request's reach (0.5.17 and 0.5.21): an input must be shorter than
# context - 6 tokens (its scheduler's max_req_input_len: context - 1, less 5 spare) and a response is cut to end
# at context - 2. rlkit's lengths (prompt + response, a whole sequence scored, an agent's conversation so far)
# go up to max_model_len, so SGLang's context is that much longer. rlkit's model check keeps max_model_len
# within the model's positions; the reserve is never reached by a token, only by SGLang's arithmetic.
RESERVED_TOKENS = 7
logger = logging.getLogger(__name__)


class SGLangEngine(RolloutEngine):
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        seed: int,
        max_model_len: int,
        device: torch.device,
        gpu_memory_utilization: float,
        max_num_seqs: int,
        sleep_mode: bool,
        attention_backend: str | None,
        deterministic: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
        streaming: bool = False,
    ) -> None:
        """`streaming` (rollout.sglang.streaming): every sample a request of its own through SGLang's async
        client (`sample`), as vLLM's async engine serves them (rlkit.core.rollout.vllm_async)."""
        import sglang

        on_gpu = device.type == "cuda"
        self.sleep_mode = sleep_mode and on_gpu
        self.honors_seeds = on_gpu and deterministic
        if not self.honors_seeds:
            why = "rollout.sglang.deterministic=false" if on_gpu else "on a CPU"
            logger.warning(
                f"SGLang {why} ignores per-request seeds: rollouts are not reproducible and a "
                "resumed run is not bit-exact (docs/compatibility.md)"
            )
        # Defaults a user may change through rollout.sglang.engine_kwargs: quiet logs, and CUDA graphs
        # wherever they exist ({log_level: info, disable_cuda_graph: true} shows and shortens a slow start),
        # captured up to a rollout's whole batch: SGLang captures decode graphs up to batch 256 on an H200
        # (tensor parallel < 4), so a rollout of 512 sequences would decode without them until half had ended.
        graphs = {"cuda_graph_max_bs_decode": max_num_seqs} if on_gpu else {}
        options = {"disable_cuda_graph": not on_gpu, "log_level": "error", **graphs, **(engine_kwargs or {})}
        with _host_logging_kept(sglang_level=options["log_level"]), _longer_context_allowed():
            self.engine = sglang.Engine(
                model_path=model_path,
                dtype=dtype,
                random_seed=seed,
                context_length=max_model_len + RESERVED_TOKENS,
                device="cuda" if on_gpu else "cpu",
                base_gpu_id=device.index or 0,
                mem_fraction_static=gpu_memory_utilization,
                max_running_requests=max_num_seqs,
                # On a CPU SGLang sizes its KV cache from free host memory; cap it at what a full batch needs.
                max_total_tokens=None if on_gpu else max_num_seqs * (max_model_len + RESERVED_TOKENS),
                # CPU: SGLang's native attention (its Xeon kernels need AMX and a source build).
                attention_backend=attention_backend or (None if on_gpu else "torch_native"),
                enable_deterministic_inference=self.honors_seeds,  # makes `sampling_seed` count
                enable_memory_saver=self.sleep_mode,
                enable_weights_cpu_backup=self.sleep_mode,
                skip_tokenizer_init=True,
                disable_radix_cache=True,
                **options,
            )
        self.asleep: set[str] = set()  # memory-saver tags released by sleep()
        # rlkit.core.agents.turns and rlkit.core.rollout.scored_generation: requests one by one (`sample`)
        self.streams = streaming

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        if self.streams:
            return stream_samples(self, prompts, sampling, token_limits)
        # One request per sample with its own seed, prompt-major: sample j of prompt i is request i * n + j.
        limits = limits_per_prompt(prompts, sampling, token_limits)
        seeds = [request_seed(sampling, k // sampling.n, k % sampling.n) for k in range(len(prompts) * sampling.n)]
        with_log_probs = [base.returns_log_probs(sampling, seed) for seed in seeds]
        outputs = self.engine.generate(
            input_ids=[p for p in prompts for _ in range(sampling.n)],
            sampling_params=[_params(sampling, seed, limits[k // sampling.n]) for k, seed in enumerate(seeds)],
            return_logprob=with_log_probs,
        )
        return [_sample(k // sampling.n, out, with_log_probs[k]) for k, out in enumerate(outputs)]

    async def sample(
        self, prompt: list[int], sampling: Sampling, seed: int, max_tokens: int, place: tuple[int, int] = (0, 1)
    ) -> RolloutSample:
        """One sample of `prompt` (its prompt_index 0) through SGLang's async client; runs on the engine's event
        loop (`run`). `place` is for replicas, which SGLang does not have here."""
        with_log_probs = base.returns_log_probs(sampling, seed)
        out = await self.engine.async_generate(
            input_ids=prompt, sampling_params=_params(sampling, seed, max_tokens), return_logprob=with_log_probs
        )
        return _sample(0, out, with_log_probs)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that awaits `sample` on the event loop SGLang's client lives on (it runs while a call
        waits on it, in the calling thread, as SGLang's own batch `generate` runs it)."""
        return self.engine.loop.run_until_complete(coroutine)

    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        # Nothing is generated. SGLang gives the first token from `logprob_start_len` on no log-prob
        # (None), so start one token early and drop it.
        outputs = self.engine.generate(
            input_ids=sequences,
            sampling_params={"max_new_tokens": 0, "temperature": 1.0},
            return_logprob=True,
            logprob_start_len=prompt_len - 1,
        )
        return [[entry[0] for entry in out["meta_info"]["input_token_logprobs"][1:]] for out in outputs]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # The model's own `load_weights` runs on each bucket: a tied LM head follows the embedding.
        # SGLang 0.5.21 takes updates only inside a begin/end session (which also re-packs
        # weights its kernels keep in another layout); 0.5.17 has neither call.
        session = hasattr(self.engine, "begin_weight_update")
        if session:
            _check("begin_weight_update", self.engine.begin_weight_update())
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in named_tensors:
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= BUCKET_BYTES:
                _check("update_weights_from_tensor", self.engine.update_weights_from_tensor(bucket, flush_cache=False))
                bucket, size = [], 0
        # The rest, and the KV cache of the old weights dropped.
        _check("update_weights_from_tensor", self.engine.update_weights_from_tensor(bucket, flush_cache=True))
        if session:
            _check("end_weight_update", self.engine.end_weight_update())

    def sleep(self, discard_weights: bool = False) -> None:
        """Release weights (kept in host memory, whatever `discard_weights` says) and KV cache through SGLang's
        memory saver."""
        if self.sleep_mode and not self.asleep:
            self.engine.release_memory_occupation(tags=[*_WEIGHTS, *_GENERATION])
            self.asleep = {*_WEIGHTS, *_GENERATION}

    def wake_up(self, weights_only: bool = False) -> None:
        """A weight sync needs only the weights back; the KV cache returns just before generating."""
        wanted = set(_WEIGHTS) if weights_only else {*_WEIGHTS, *_GENERATION}
        missing = self.asleep & wanted
        if missing:
            self.engine.resume_memory_occupation(tags=sorted(missing))
            self.asleep -= missing

    def shutdown(self) -> None:
        """Stop the scheduler process (it would otherwise outlive a test that made the engine).

        SGLang's shutdown kills every child process of the process that hosts the engine, not only
        its own (also at exit): the engine belongs in a process of its own, as rlkit's rollout worker is.
        """
        self.engine.shutdown()


@contextmanager
def _host_logging_kept(sglang_level: str) -> Iterator[None]:
    """SGLang's start reconfigures the root logger of the process that hosts it (its handler, at its
    log level: `error` by default here), which would silence rlkit's own warnings in the worker from
    then on. The root logger is put back as it was; SGLang's loggers keep the level it was given."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    try:
        yield
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
        logging.getLogger("sglang").setLevel(sglang_level.upper())


@contextmanager
def _longer_context_allowed() -> Iterator[None]:
    """SGLang refuses a context longer than the model's positions unless this is set while it starts (its
    scheduler process inherits it then). A model whose positions end within RESERVED_TOKENS of max_model_len
    needs it; no token goes past max_model_len."""
    name = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
    before = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _params(sampling: Sampling, seed: int, max_tokens: int) -> dict[str, Any]:
    """One request's SGLang sampling parameters (the seed counts only with deterministic inference)."""
    return {
        "max_new_tokens": max_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "ignore_eos": sampling.ignore_eos,
        "sampling_seed": seed,
    }


def _sample(prompt_index: int, out: dict[str, Any], with_log_probs: bool) -> RolloutSample:
    meta = out["meta_info"]
    log_probs = [entry[0] for entry in meta["output_token_logprobs"]] if with_log_probs else []
    return RolloutSample(prompt_index, list(out["output_ids"]), log_probs, meta["finish_reason"]["type"] == "stop")


def _check(call: str, result: tuple[bool, str]) -> None:
    """SGLang reports a failed weight update in its result, not by raising."""
    success, message = result
    if not success:
        raise RuntimeError(f"SGLang {call} failed: {message}")
