"""How agent episodes' turns reach the engine: all together each turn, or each on its own as it comes.

Every episode runs as a coroutine of its own (rlkit.core.agents.loop.AgentLoop) and asks for its next
turn with `sample(key, prompt, seed, limit)`; `key` is the episode's place in the worker's list and the
seed is the episode's own (the loop's `turn_seed`), so a turn's request is the same whichever schedule
serves it and whichever episodes run beside it.

- `BatchedTurns` (every engine; the deterministic schedule): a turn waits until every running episode
  has asked for its next turn or ended, then all of them go to the engine in ONE `generate` call, in
  the episodes' order. The batch a request runs in depends only on the episodes, never on timing, so
  a rerun and a resumed run repeat it bit for bit.
- `StreamedTurns` (the async vLLM engine, rollout.vllm.streaming): a turn goes to the engine as soon as
  its episode asks, with no barrier: an episode whose environment answers fast takes its next turn
  while a slow one's environment still works. Which requests share a forward pass then depends on
  timing (rlkit.core.rollout.vllm_async says what that costs in exactness).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Coroutine, TypeVar

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling
from rlkit.core.rollout.event_loop import EventLoop

T = TypeVar("T")


class BatchedTurns:
    """One `generate` call per turn of all running episodes (`episodes` of them at the start)."""

    def __init__(self, engine: RolloutEngine, events: EventLoop, episodes: int) -> None:
        self.engine, self.events, self.live = engine, events, episodes
        self.waiting: dict[int, tuple[list[int], int, int, asyncio.Future]] = {}
        self.sampling: Sampling | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.events.run(coroutine)

    async def sample(self, key: int, prompt: list[int], seed: int, limit: int, sampling: Sampling) -> RolloutSample:
        future = asyncio.get_running_loop().create_future()
        self.waiting[key] = (prompt, seed, limit, future)
        self.sampling = sampling
        self.flush_when_all_wait()
        try:
            return await future
        except asyncio.CancelledError:  # another episode failed and the run stops: nothing to generate for this one
            self.waiting.pop(key, None)
            raise

    def ended(self) -> None:
        """An episode is over: the others no longer wait for it."""
        self.live -= 1
        self.flush_when_all_wait()

    def flush_when_all_wait(self) -> None:
        if not self.waiting or len(self.waiting) < self.live:
            return
        batch = [self.waiting.pop(key) for key in sorted(self.waiting)]
        limits = [limit for _, _, limit, _ in batch]
        sampling = dataclasses.replace(
            self.sampling, n=1, max_tokens=max(limits), prompt_seeds=[seed for _, seed, _, _ in batch]
        )
        try:
            samples = self.engine.generate([prompt for prompt, _, _, _ in batch], sampling, limits)
        except Exception as exc:  # noqa: BLE001 - the engine's failure is every waiting episode's (and the run's)
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), sample in zip(batch, samples):
            if not future.done():
                future.set_result(sample)


class StreamedTurns:
    """Each turn to the async engine (rlkit.core.rollout.vllm_async.AsyncVLLMEngine, or replicas of it) when it
    is asked for; an episode's turns go to one replica (its prefix cache holds the conversation)."""

    def __init__(self, engine: Any, episodes: int) -> None:
        self.engine, self.episodes = engine, episodes

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.engine.run(coroutine)  # the engine's client lives on its own event loop

    async def sample(self, key: int, prompt: list[int], seed: int, limit: int, sampling: Sampling) -> RolloutSample:
        one = dataclasses.replace(sampling, n=1, max_tokens=limit)
        return await self.engine.sample(prompt, one, seed, limit, place=(key, self.episodes))

    def ended(self) -> None:
        pass


def turns_for(engine: RolloutEngine, events: EventLoop, episodes: int) -> BatchedTurns | StreamedTurns:
    """The schedule `engine` serves: streamed where it takes requests one by one, else batched."""
    if getattr(engine, "streams", False):
        return StreamedTurns(engine, episodes)
    return BatchedTurns(engine, events, episodes)
