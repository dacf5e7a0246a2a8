"""The multi-turn agent loop, run inside a rollout worker next to its engine.

Each of a worker's episodes is a coroutine of its own: its environment's calls run guarded, each on its
own (rlkit.core.agents.guard), and its turns go to the engine batched (every running episode's turn in
ONE `engine.generate` call: the default, and the deterministic schedule) or streamed (one request each,
as soon as asked: the async vLLM engine), rlkit.core.agents.turns. A turn's seed is its episode's
(`turn_seed`), so the schedule changes no request. Token ids are appended, never re-encoded: the
policy's as the engine sampled them (loss mask 1, with their log-probs), the environment's as the chat
template writes them (rlkit.core.agents.chat; loss mask 0, log-prob 0).

How an episode ends (Trajectory.finish_reason): "stop" when the environment says done;
"truncated" when it runs out of turns (rollout.agent.max_turns) or of tokens (the response,
every turn together, is cut at data.max_response_length); "error" when the environment
raised, timed out or returned something unusable, which scores it 0.

An environment with `truncate(action)` scores the episodes the loop cut (`action`: the cut turn's text
when step() never saw it, else None; it returns a number or None), and one with an `episode_metrics`
dict reports it with the episode (logged as the mean over the episodes that report each key).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from rlkit.core.agents.chat import TurnBoundary
from rlkit.core.agents.envs import as_messages, parse_step, row_dict
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.turns import BatchedTurns, StreamedTurns, turns_for
from rlkit.core.rollout.base import RolloutEngine, Sampling
from rlkit.core.rollout.event_loop import EventLoop
from rlkit.core.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

# Seeds of turn t's samples start t * this apart (a worker runs far fewer episodes).
_TURN_SEED_STRIDE = 1_000_003


def turn_seed(sampling: Sampling, turn: int, episode: int) -> int:
    """The seed of turn `turn` of the worker's episode `episode`: its own, whichever episodes share the call."""
    return sampling.seed + turn * _TURN_SEED_STRIDE + episode


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_tokens_per_turn: int
    max_response_tokens: int  # every turn together: data.max_response_length
    max_prompt_tokens: int  # a prompt an environment's reset() writes: data.max_prompt_length


@dataclass
class Episode:
    row: Any  # PromptRow
    group: int
    env: Any
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # the numbers the environment gave
    turns: int = 0
    last_turn: list[int] = field(default_factory=list)  # the policy's tokens of the turn being stepped
    stepped: bool = False  # the environment's step() has seen last_turn
    finish_reason: str | None = None  # None while running
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.finish_reason is None

    def append(self, ids: list[int], policy: bool, log_probs: list[float] | None = None) -> None:
        self.response_ids += ids
        self.loss_mask += [int(policy)] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)

    def fail(self, error: str) -> None:
        self.finish_reason, self.error = "error", error

    def trajectory(self, with_log_probs: bool) -> Trajectory:
        if self.error is not None:
            reward = 0.0
        else:
            reward = sum(self.rewards) if self.rewards else None
        row = (
            self.row
            if self.prompt_ids == self.row.prompt_token_ids
            else dataclasses.replace(self.row, prompt_token_ids=self.prompt_ids)
        )
        return Trajectory(
            row=row,
            group=self.group,
            response_ids=self.response_ids,
            loss_mask=self.loss_mask,
            log_probs=self.log_probs if with_log_probs else [],
            finish_reason=self.finish_reason,
            reward=reward,
            info={"turns": self.turns, "env_error": self.error, "env_metrics": self.env_metrics()},
        )

    def env_metrics(self) -> dict[str, float]:
        reported = getattr(self.env, "episode_metrics", None)
        if self.error is not None or not isinstance(reported, dict):
            return {}
        return {str(k): float(v) for k, v in reported.items() if isinstance(v, (int, float))}


class AgentLoop:
    """Runs a worker's share of episodes with one environment instance each, every episode a coroutine of its
    own: reset, then turns (the engine's sample, the environment's step) until it ends. Its turns reach the
    engine batched or streamed (rlkit.core.agents.turns); user code runs guarded, each call on its own."""

    def __init__(
        self,
        tokenizer: Any,
        make_env: Callable[[], Any],
        limits: Limits,
        guard: Guard,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.tokenizer, self.make_env, self.limits, self.guard = tokenizer, make_env, limits, guard
        self.boundary = TurnBoundary(tokenizer, tools)
        self.events = EventLoop("rlkit-agent-episodes")  # the batched schedule's episodes run here
        weakref.finalize(self, self.events.close)  # its thread goes with the loop (another run may follow here)

    def run(
        self,
        engine: RolloutEngine,
        rows: list[Any],
        groups: list[int],
        sampling: Sampling,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """sampling.n episodes per row, prompt-major, as trajectories (group = the row's entry in `groups`).
        `on_episode(k, trajectory)` runs as episode k ends (its environment closed), while others still run."""
        episodes = [
            Episode(row, group, None, list(row.prompt_token_ids))
            for row, group in zip(rows, groups)
            for _ in range(sampling.n)
        ]
        turns = turns_for(engine, self.events, len(episodes))
        turns.run(self.run_all(turns, episodes, sampling, on_episode))
        return [e.trajectory(sampling.log_probs) for e in episodes]

    async def run_all(
        self,
        turns: BatchedTurns | StreamedTurns,
        episodes: list[Episode],
        sampling: Sampling,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:  # an unexpected error stops the other episodes too
                for key, episode in enumerate(episodes):
                    tasks.create_task(self.run_episode(turns, key, episode, sampling, on_episode))
        except BaseExceptionGroup as failed:  # the engine's failure, raised as it is (a worker failure names it)
            raise failed.exceptions[0] from None

    async def run_episode(
        self,
        turns: BatchedTurns | StreamedTurns,
        key: int,
        episode: Episode,
        sampling: Sampling,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> None:
        try:
            await self.start(episode)
            for turn in range(self.limits.max_turns):
                if not episode.running:
                    break
                await self.generate(turns, key, episode, sampling, turn)
                if episode.running:
                    await self.step(episode, last=turn == self.limits.max_turns - 1)
        finally:
            turns.ended()
        if episode.finish_reason == "truncated":
            await self.truncate(episode)
        await self.close(episode)
        if on_episode is not None:
            on_episode(key, episode.trajectory(sampling.log_probs))

    async def start(self, episode: Episode) -> None:
        """A fresh environment, reset with the episode's row."""
        outcome = await self.guard.call_async(self.make_env)
        episode.env = outcome.value
        if outcome.error is not None:
            episode.fail(f"creating the environment failed:\n{outcome.error}")
            return
        outcome = await self.guard.call_async(episode.env.reset, row_dict(episode.row))
        if outcome.error is not None:
            episode.fail(f"reset failed:\n{outcome.error}")
        elif outcome.value is not None:  # the environment writes the prompt itself
            try:
                prompt = self.boundary.render_prompt(as_messages(outcome.value, "reset"))
            except ValueError as exc:
                episode.fail(str(exc))
                return
            if len(prompt) > self.limits.max_prompt_tokens:
                episode.fail(
                    f"reset returned a prompt of {len(prompt)} tokens > data.max_prompt_length="
                    f"{self.limits.max_prompt_tokens}"
                )
                return
            episode.prompt_ids = prompt

    async def close(self, episode: Episode) -> None:
        """An environment with a close() gives back what it holds (a server's session) once its episode ended;
        a failure there is logged and costs nothing: the episode is already scored."""
        if not callable(getattr(episode.env, "close", None)):
            return
        outcome = await self.guard.call_async(episode.env.close)
        if outcome.error is not None:
            logger.warning("closing the environment of row %s failed:\n%s", episode.row.index, outcome.error)

    async def generate(
        self, turns: BatchedTurns | StreamedTurns, key: int, episode: Episode, sampling: Sampling, turn: int
    ) -> None:
        """The episode's next turn; a turn longer than the episode's remaining token budget is cut there and
        ends it (truncated)."""
        limits = self.limits
        budget = min(limits.max_tokens_per_turn, limits.max_response_tokens - len(episode.response_ids))
        sample = await turns.sample(
            key, episode.prompt_ids + episode.response_ids, turn_seed(sampling, turn, key), budget, sampling
        )
        tokens = sample.token_ids[:budget]
        episode.append(tokens, policy=True, log_probs=sample.log_probs[:budget] if sampling.log_probs else None)
        episode.turns += 1
        episode.last_turn, episode.stepped = tokens, False
        if len(sample.token_ids) > budget or (
            len(episode.response_ids) >= limits.max_response_tokens and not sample.finished
        ):
            episode.finish_reason = "truncated"

    async def step(self, episode: Episode, last: bool) -> None:
        """The environment answers the episode's turn; its answer joins the trajectory as mask-0 tokens."""
        action = self.tokenizer.decode(episode.last_turn, skip_special_tokens=True)
        outcome = await self.guard.call_async(episode.env.step, action)
        episode.stepped = True
        if outcome.error is not None:
            episode.fail(f"step failed:\n{outcome.error}")
            return
        try:
            messages, reward, done = parse_step(outcome.value)
        except ValueError as exc:
            episode.fail(str(exc))
            return
        if reward is not None:
            episode.rewards.append(reward)
        if done:
            episode.finish_reason = "stop"
        elif last:
            episode.finish_reason = "truncated"
        else:
            self.answer(episode, messages)

    async def truncate(self, episode: Episode) -> None:
        """An environment that scores a cut episode (truncate) does; a failure there is the episode's, as in step."""
        if not callable(getattr(episode.env, "truncate", None)):
            return
        action = None if episode.stepped else self.tokenizer.decode(episode.last_turn, skip_special_tokens=True)
        outcome = await self.guard.call_async(episode.env.truncate, action)
        if outcome.error is not None:
            episode.fail(f"truncate failed:\n{outcome.error}")
            return
        try:
            _, reward, _ = parse_step((None, outcome.value, True))
        except ValueError as exc:
            episode.fail(str(exc).replace("step returned", "truncate returned"))
            return
        if reward is not None:
            episode.rewards.append(reward)

    def answer(self, episode: Episode, messages: list[dict[str, Any]]) -> None:
        try:
            ids = self.boundary.after_turn(episode.last_turn, messages)
        except Exception as exc:  # noqa: BLE001 - e.g. a template that refuses a role: the episode's fault
            episode.fail(
                f"the chat template cannot write the environment's messages {messages!r:.200}: "
                f"{type(exc).__name__}: {exc}"
            )
            return
        room = self.limits.max_response_tokens - len(episode.response_ids)
        episode.append(ids[:room], policy=False)
        if len(ids) >= room:  # no token left for the policy's next turn
            episode.finish_reason = "truncated"
