"""Several engines on one device, each generating a fixed share of a call's prompts at the same time.

vLLM's engine loop (scheduler, KV-cache bookkeeping, the model runner's host side) is single-threaded
Python: at batch 512 on an H200 it keeps the GPU busy only a quarter to a third of a generate
(docs/benchmarks.md). Several engines, each with its engine core in a process of its own, run their
loops on several cores while their kernels share the GPU. `ReplicatedEngine` is one `RolloutEngine`
over such replicas (rollout.vllm.replicas).

Prompt i always goes to the same replica for a given number of replicas (contiguous shares, sizes
differing by at most one), and its samples keep the seeds a single engine gives them, so a call's
result does not depend on which replica finishes first. A prompt's samples stay on one replica,
where they share its prefix cache.

Replicas of vLLM's async engine (rollout.vllm.streaming) also stream: an agent episode's request goes to the
replica whose share holds the episode's place (`sample`), so all its turns meet its prefix cache there; the
episodes run on the first replica's event loop and wait there for the others' results.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Coroutine, Iterable, Sequence, TypeVar

import torch

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling
from rlkit.core.rollout.engine_start import replicas_start_parts

T = TypeVar("T")


def shares(count: int, replicas: int) -> list[range]:
    """Contiguous ranges of `count` items over `replicas`, the first ones one longer when it does not divide."""
    base, extra = divmod(count, replicas)
    bounds = [0]
    for k in range(replicas):
        bounds.append(bounds[-1] + base + (1 if k < extra else 0))
    return [range(bounds[k], bounds[k + 1]) for k in range(replicas)]


class ReplicatedEngine(RolloutEngine):
    """`replicas` engines behind one interface; every call runs on all of them at once, one thread each
    (the threads wait on the engines' processes, not on Python)."""

    def __init__(self, replicas: list[RolloutEngine], started_together: bool = False) -> None:
        """`started_together`: whether the replicas started at once (rlkit.core.rollout.replica_start)."""
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one engine")
        self.replicas = replicas
        self.started_together = started_together
        self.honors_seeds = all(engine.honors_seeds for engine in replicas)
        self.pool = ThreadPoolExecutor(max_workers=len(replicas), thread_name_prefix="rlkit-replica")
        self.streams = all(getattr(engine, "streams", False) for engine in replicas)

    def start_parts(self) -> dict[str, float]:
        """The slowest replica's where they started together, each part summed where they started in turn."""
        return replicas_start_parts([engine.start_parts() for engine in self.replicas], self.started_together)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Streaming replicas: run a coroutine that awaits `sample` (an agent loop's episodes) on the first one's
        event loop."""
        return self.replicas[0].run(coroutine)  # type: ignore[attr-defined]

    async def sample(
        self, prompt: list[int], sampling: Sampling, seed: int, max_tokens: int, place: tuple[int, int] = (0, 1)
    ) -> RolloutSample:
        """Streaming replicas: one sample on the replica whose share of `place[1]` requests holds `place[0]`."""
        key, count = place
        engine = next(e for e, part in zip(self.replicas, shares(count, len(self.replicas))) if key in part)
        request = engine.sample(prompt, sampling, seed, max_tokens)  # type: ignore[attr-defined]
        if engine is self.replicas[0]:
            return await request
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(request, engine.events.loop))

    def on_all(self, calls: list[Callable[[], T]]) -> list[T]:
        """Each call on its own thread; results in the calls' order, the first exception raised."""
        return [future.result() for future in [self.pool.submit(call) for call in calls]]

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        calls = []
        for engine, part in zip(self.replicas, shares(len(prompts), len(self.replicas))):
            if not part:
                continue
            # A single engine seeds sample j of prompt i with seed + i * n + j (or prompt i's own seed): the share
            # starting at prompt `part.start` starts its seeds there.
            own_seeds = None if sampling.prompt_seeds is None else list(sampling.prompt_seeds)[part.start : part.stop]
            share_sampling = replace(sampling, seed=sampling.seed + part.start * sampling.n, prompt_seeds=own_seeds)
            limits = None if token_limits is None else list(token_limits)[part.start : part.stop]
            calls.append(self.generate_share(engine, [prompts[i] for i in part], share_sampling, limits, part.start))
        return [sample for share in self.on_all(calls) for sample in share]

    @staticmethod
    def generate_share(
        engine: RolloutEngine, prompts: list[list[int]], sampling: Sampling, limits: list[int] | None, offset: int
    ) -> Callable[[], list[RolloutSample]]:
        def run() -> list[RolloutSample]:
            samples = engine.generate(prompts, sampling, limits)
            return [replace(sample, prompt_index=sample.prompt_index + offset) for sample in samples]

        return run

    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        parts = [part for part in shares(len(sequences), len(self.replicas)) if part]
        calls = [
            (lambda engine=engine, part=part: engine.score([sequences[i] for i in part], prompt_len))
            for engine, part in zip(self.replicas, parts)
        ]
        return [scores for share in self.on_all(calls) for scores in share]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The same tensors to every replica (an iterable is read once)."""
        tensors = list(named_tensors)
        self.on_all([lambda engine=engine: engine.load_weights(tensors) for engine in self.replicas])

    @property
    def discards_weights(self) -> bool:
        return all(engine.discards_weights for engine in self.replicas)

    def sleep(self, discard_weights: bool = False) -> None:
        self.on_all([lambda engine=engine: engine.sleep(discard_weights) for engine in self.replicas])

    def wake_up(self, weights_only: bool = False) -> None:
        self.on_all([lambda engine=engine: engine.wake_up(weights_only) for engine in self.replicas])
