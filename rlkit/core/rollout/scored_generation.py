"""A streaming engine's samples, each handed on the moment it finishes: scoring while the rollout generates.

A streaming engine (rlkit.core.rollout.vllm_async or replicas of it, SGLang with rollout.sglang.streaming)
serves every sample as a request of its own, so a short response is done long before the longest one. With
reward.while_generating the generation role gives each finished response to the reward's worker processes at
once (`generate_scored`, called by rlkit.core.rollout.generator.Generator) and the controller gets the rollout
with its reward outcomes: what a code reward spends in its sandbox hides behind the decode of the longest
responses.

Agent episodes end at different turns on any engine: `episodes_scored` scores each as it ends while the others
still take turns.

The requests, their seeds and the replica each goes to are those of the engine's own `generate`, and a reward
sees the same text as when the controller scores (the policy's tokens decoded with special tokens skipped),
so the scores are the same either way.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from rlkit.core.rewards.worker_pool import Feed, Outcome
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt, request_seed
from rlkit.core.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from rlkit.core.agents.loop import AgentLoop
    from rlkit.core.data.dataset import PromptRow
    from rlkit.core.rewards.scoring import RewardScorer

T = TypeVar("T")


def stream_samples(
    engine: RolloutEngine,
    prompts: list[list[int]],
    sampling: Sampling,
    token_limits: Sequence[int] | None = None,
    on_sample: Callable[[int, RolloutSample], None] | None = None,
) -> list[RolloutSample]:
    """`engine.generate`'s samples (prompt-major, the same seeds), each request on its own; `on_sample(k, sample)`
    runs on the engine's event loop as sample k finishes. `engine` streams (has `sample` and `run`)."""
    limits = limits_per_prompt(prompts, sampling, token_limits)
    count, n = len(prompts), sampling.n

    async def one(i: int, j: int) -> RolloutSample:
        seed = request_seed(sampling, i, j)
        sample = await engine.sample(prompts[i], sampling, seed, limits[i], (i, count))  # type: ignore[attr-defined]
        sample.prompt_index = i
        if on_sample is not None:
            on_sample(i * n + j, sample)
        return sample

    async def every_sample() -> list[RolloutSample]:
        return list(await asyncio.gather(*(one(i, j) for i in range(count) for j in range(n))))

    return engine.run(every_sample())  # type: ignore[attr-defined]


def generate_scored(
    engine: RolloutEngine, rows: list[PromptRow], sampling: Sampling, scorer: RewardScorer, tokenizer: Any
) -> tuple[list[RolloutSample], list[Outcome | None]]:
    """sampling.n samples of each row's prompt, and each sample's reward outcome (`scorer`'s call on the row's
    data_source, ground truth and extra info), scored in `scorer`'s pool as it finishes. With reward.on_error=raise
    the rows after a failed one have no outcome (None): the controller raises on the failed one."""

    def prepare(k: int, sample: RolloutSample) -> Any:  # in the pool's thread, off the engine's event loop
        row = rows[k // sampling.n]
        response = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        return scorer.call(k, row.data_source, response, row.ground_truth, row.extra_info)

    prompts = [row.prompt_token_ids for row in rows]
    return while_scoring(
        scorer, len(rows) * sampling.n, prepare, lambda put: stream_samples(engine, prompts, sampling, on_sample=put)
    )


def episodes_scored(
    loop: AgentLoop,
    engine: RolloutEngine,
    rows: list[PromptRow],
    groups: list[int],
    sampling: Sampling,
    scorer: RewardScorer,
    tokenizer: Any,
) -> list[Trajectory]:
    """The agent loop's episodes, each scored as it ends (its policy's tokens, as the Score stage decodes them) into
    `Trajectory.reward_outcome`. An episode its environment scored (a reward, or an error's 0) gets none: the
    controller then scores the batch itself when some other row needs the reward function, as without this."""

    def prepare(k: int, trajectory: Trajectory) -> Any:
        row = trajectory.row
        response = tokenizer.decode(trajectory.policy_ids, skip_special_tokens=True)
        return scorer.call(k, row.data_source, response, row.ground_truth, row.extra_info)

    def episodes(put: Callable[[int, Any], None]) -> list[Trajectory]:
        def ended(k: int, trajectory: Trajectory) -> None:
            if trajectory.reward is None:
                put(k, trajectory)

        return loop.run(engine, rows, groups, sampling, on_episode=ended)

    trajectories, outcomes = while_scoring(scorer, len(rows) * sampling.n, prepare, episodes)
    return [replace(t, reward_outcome=o) for t, o in zip(trajectories, outcomes, strict=True)]


def while_scoring(
    scorer: RewardScorer, size: int, prepare: Callable[[int, Any], Any], produce: Callable[[Callable], T]
) -> tuple[T, list[Outcome | None]]:
    """`produce(put)`'s result, and the outcomes of rows 0..size-1 that it `put(k, item)` as it made them (each
    turned into its reward call by `prepare`, in the pool's thread), scored in `scorer`'s pool meanwhile."""
    feed = Feed(prepare)
    # The pool's loop waits on its worker processes in a thread of its own while this one produces.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlkit-reward-feed") as thread:
        outcomes = thread.submit(scorer.outcomes, feed, size)
        try:
            result = produce(feed.put)
        finally:
            feed.close()
        return result, outcomes.result()
