"""vLLM's async engine: every sample a request of its own, in and out as it goes (rollout.vllm.streaming).

The engine core (scheduler and model) runs in a process of its own, as with rollout.vllm.separate_process;
this process holds vLLM's asyncio client (`AsyncLLM`) on an event loop in a thread of its own (`EventLoop`).
A batch call (`generate`, `score`) submits all its requests at once and waits for all; an agent episode
submits each turn itself (`sample`, rlkit.core.agents.turns.StreamedTurns) as soon as its environment
has answered, so no episode waits for another's turn. Weights reach the engine's process as with
separate_process (rlkit.core.rollout.vllm_worker.pack_weights: CUDA IPC handles on a GPU), through the
same worker extension, and the prefix cache is emptied at every weight load and every rollout's end.

Which requests share a forward pass now depends on timing. A request's seed still fixes its sampling, but a
sample's logits can differ in their last bits with the batch it ran in (GPU kernels choose their reduction
by batch shape), so a rerun or a resumed run may sample other tokens where two were nearly tied:
docs/resume.md says which guarantee holds in which mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from typing import Any, Coroutine, Iterable, Sequence, TypeVar

import torch

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, returns_log_probs
from rlkit.core.rollout.engine_start import start_parts, vllm_info_lines
from rlkit.core.rollout.event_loop import EventLoop
from rlkit.core.rollout.scored_generation import stream_samples
from rlkit.core.rollout.vllm_engine import (
    collections_paused,
    engine_arguments,
    engine_process_lines,
    import_engine_modules,
    prompt_scores,
    sampling_params,
    score_params,
    smallest,
    to_sample,
    use_engine_process,
)
from rlkit.core.rollout.vllm_worker import pack_weights

T = TypeVar("T")


class AsyncVLLMEngine(RolloutEngine):
    """The arguments are VLLMEngine's (rlkit.core.rollout.vllm_engine), less separate_process: the engine core
    always runs in a process of its own."""

    streams = True  # rlkit.core.agents.turns: episodes submit their turns one by one

    def __init__(self, model_path: str, *, device: torch.device, sleep_mode: bool, **settings: Any) -> None:
        """`settings`: the rest of engine_arguments' (dtype, seed, max_model_len, gpu_memory_utilization,
        enforce_eager, max_num_seqs, prefix_caching, engine_kwargs)."""
        self.on_gpu = device.type == "cuda"
        self.sleep_mode = sleep_mode and self.on_gpu
        began = time.perf_counter()
        import_engine_modules()
        use_engine_process(True)
        from vllm.engine.arg_utils import AsyncEngineArgs

        imported = {"rollout_engine_import": time.perf_counter() - began}
        arguments = engine_arguments(model_path, on_gpu=self.on_gpu, sleep_mode=self.sleep_mode, **settings)
        self.events = EventLoop("rlkit-vllm-async")
        self.request_ids = itertools.count()
        constructed = time.time()
        with vllm_info_lines() as lines:
            # vLLM's periodic throughput lines are off, as LLM has them off.
            self.llm = self.events.run(_start(AsyncEngineArgs(**arguments, disable_log_stats=True)))
        ended = time.time()
        lines += engine_process_lines(self.events.run(self.llm.collective_rpc("rlkit_start_lines")))
        self.reported_start = {**imported, **start_parts(sorted(lines), constructed, ended)}
        self.asleep: set[str] = set()
        self.events.run(self.llm.collective_rpc("rlkit_exit_with", args=(os.getpid(),)))

    def start_parts(self) -> dict[str, float]:
        return self.reported_start

    def kv_cache_bytes(self) -> int | None:
        """As VLLMEngine.kv_cache_bytes."""
        return smallest(self.events.run(self.llm.collective_rpc("rlkit_kv_cache_bytes")))

    # -- requests -------------------------------------------------------------------------
    async def sample(
        self, prompt: list[int], sampling: Sampling, seed: int, max_tokens: int, place: tuple[int, int] = (0, 1)
    ) -> RolloutSample:
        """One sample of `prompt` (its prompt_index 0), seeded by `seed`; runs on this engine's event loop.
        `place`: (the request's place, of how many), which replicas route by (rlkit.core.rollout.replicas)."""
        output = await self.request(prompt, sampling_params(sampling, seed, max_tokens))
        return to_sample(output, 0, returns_log_probs(sampling, seed))

    async def request(self, prompt: list[int], params: Any) -> Any:
        """vLLM's output of one request (FINAL_ONLY: one output, when the request ends)."""
        from vllm.inputs import TokensPrompt

        final = None
        async for output in self.llm.generate(TokensPrompt(prompt_token_ids=prompt), params, self.request_id()):
            final = output
        return final

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that awaits `sample` (an agent loop's episodes) on this engine's event loop."""
        with collections_paused():
            return self.events.run(coroutine)

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        return stream_samples(self, prompts, sampling, token_limits)

    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        async def scored(sequence: list[int]) -> list[float]:
            return prompt_scores(await self.request(sequence, score_params()), sequence, prompt_len)

        async def every_score() -> list[list[float]]:
            return list(await asyncio.gather(*(scored(s) for s in sequences)))

        return self.run(every_score())

    def request_id(self) -> str:
        return f"rlkit-{next(self.request_ids)}"

    # -- weights and memory ---------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """New weights in place, packed for the engine's process; the prefix cache goes with the old ones."""
        packed, shared = pack_weights(named_tensors)
        self.events.run(self.llm.collective_rpc("rlkit_load_weights", args=(packed,)))
        del shared  # the engine holds no reference to them any more: their memory may go back
        if self.on_gpu:
            torch.cuda.ipc_collect()
        self.events.run(self.llm.reset_prefix_cache())

    @property
    def discards_weights(self) -> bool:
        return self.sleep_mode

    def sleep(self, discard_weights: bool = False) -> None:
        """As VLLMEngine.sleep: level 1 with sleep mode (2 with `discard_weights`), else only the prefix cache
        emptied."""
        if self.sleep_mode and not self.asleep:
            self.events.run(self.llm.sleep(level=2 if discard_weights else 1))
            self.asleep = {"weights", "kv_cache"}
        elif not self.sleep_mode:
            self.events.run(self.llm.reset_prefix_cache())

    def wake_up(self, weights_only: bool = False) -> None:
        missing = self.asleep & ({"weights"} if weights_only else {"weights", "kv_cache"})
        if missing:
            self.events.run(self.llm.wake_up(tags=sorted(missing)))
            self.asleep -= missing

    def close(self) -> None:
        """Stop the engine's process and the event loop's thread. The output handler is stopped first: stopped
        after the engine's process, it would log the process's end as an engine failure."""
        handler = getattr(self.llm, "output_handler", None)
        if handler is not None and not handler.done():
            if threading.current_thread() is self.events.thread:  # collected on the loop's own thread
                handler.cancel()
            else:
                self.events.run(_cancelled(handler))
        self.llm.shutdown()
        self.events.close()

    def __del__(self) -> None:
        """The engine goes with its last reference (an in-process run's workers are dropped at its end, and
        another run may start in this process)."""
        if getattr(self, "llm", None) is None or getattr(self, "events", None) is None:
            return  # the start failed: nothing of it runs
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit vLLM's modules may already be gone
            pass


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _start(arguments: Any) -> Any:
    """vLLM's AsyncLLM, made on the event loop it will run on (its output handler is a task of that loop)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(arguments)
