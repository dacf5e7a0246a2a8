"""Agents in your own code: `async def rollout(client, row) -> float`, with the official `openai` client.

rollout.agent.loop=path/file.py:fn. Each episode calls the function with an `openai.AsyncOpenAI`
client pointed at the worker's loopback endpoint (rlkit.core.agents.openai_server), carrying its token, and the row
as a dict; it may call `client.chat.completions.create(...)` any number of times (`model` may
be anything) and returns the episode's reward. Every episode of the worker runs at once; the
endpoint generates their waiting requests together. The trajectory is the episode's
conversation as the endpoint recorded it: the policy's tokens as sampled (loss mask 1), the
messages between them cut from the chat template (mask 0).

An exception, a return value that is not a finite number, or more than
max_turns x call_timeout_s seconds ends the episode with reward 0, as a failing environment does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from rlkit.core.agents.envs import row_dict
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import Limits
from rlkit.core.agents.openai_server import EpisodeServer
from rlkit.core.rollout.base import RolloutEngine, Sampling
from rlkit.core.rollout.trajectory import Trajectory


class ClientAgentLoop:
    def __init__(self, tokenizer: Any, agent_fn: Callable[..., Any], limits: Limits, call_timeout_s: float) -> None:
        self.agent_fn, self.limits = agent_fn, limits
        self.guard = Guard(call_timeout_s * limits.max_turns, what="rollout.agent.max_turns x call_timeout_s")
        self.server = EpisodeServer(tokenizer, limits, wait_s=self.guard.timeout_s)  # no request outlives its episode
        self._http: Any = None  # the clients' shared connection pool, made on the guard's event loop

    def run(self, engine: RolloutEngine, rows: list[Any], groups: list[int], sampling: Sampling) -> list[Trajectory]:
        """sampling.n episodes per row, prompt-major; this thread serves their requests until all returned."""
        episodes = [(row, group) for row, group in zip(rows, groups) for _ in range(sampling.n)]
        self.server.start(list(range(len(episodes))))
        futures = [self.guard.submit(self._episode, index, row) for index, (row, _) in enumerate(episodes)]
        for index, future in enumerate(futures):  # an episode that ends, however it ends, stops being waited for
            future.add_done_callback(lambda _, index=index: self.server.finish(index))
        self.server.serve(engine, sampling)
        return [
            self._trajectory(index, row, group, future.result(), sampling.log_probs)
            for index, ((row, group), future) in enumerate(zip(episodes, futures))
        ]

    async def _episode(self, index: int, row: Any) -> float:
        import openai

        if self._http is None:  # one connection pool for every episode (a client of its own costs ~20 ms)
            self._http = openai.DefaultAsyncHttpxClient()
        client = openai.AsyncOpenAI(
            base_url=self.server.base_url(index),
            api_key=self.server.token,
            max_retries=0,
            timeout=self.guard.timeout_s,
            http_client=self._http,
        )
        value = await self.agent_fn(client, row_dict(row))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(
                f"the agent function returned {value!r:.80} ({type(value).__name__}); expected the "
                "episode's reward as a finite number"
            )
        return float(value)

    def _trajectory(self, index: int, row: Any, group: int, outcome: Any, with_log_probs: bool) -> Trajectory:
        conversation = self.server.conversations[index]
        error = outcome.error
        if error is None and not conversation.prompt_ids:
            error = "the agent function made no chat completion request"
        prompt = conversation.prompt_ids or list(row.prompt_token_ids)
        finish = "error" if error else ("truncated" if conversation.truncated else "stop")
        return Trajectory(
            row=dataclasses.replace(row, prompt_token_ids=prompt),
            group=group,
            response_ids=conversation.response_ids,
            loss_mask=conversation.loss_mask,
            log_probs=conversation.log_probs if with_log_probs else [],
            finish_reason=finish,
            reward=0.0 if error else outcome.value,
            info={"turns": conversation.turns, "env_error": error, "restarts": conversation.restarts},
        )


def agent_function(value: str | Callable[..., Any]) -> Callable[..., Any]:
    """The `async def rollout(client, row)` that rollout.agent.loop names (or is); UserError if it is not one."""
    import inspect

    from rlkit.core.rewards.custom import resolve
    from rlkit.errors import UserError
    from rlkit.recipes.user_code import reference

    spec = reference(value)
    fn = resolve(value, "rollout.agent.loop")
    if not inspect.iscoroutinefunction(fn):
        raise UserError(
            f"rollout.agent.loop={spec!r}: {getattr(fn, '__name__', fn)} must be `async def "
            "rollout(client, row) -> float` (it awaits the client's requests)"
        )
    try:
        inspect.signature(fn).bind("client", "row")
    except TypeError:
        raise UserError(
            f"rollout.agent.loop={spec!r}: {fn.__name__}{inspect.signature(fn)} cannot be called as fn(client, row)"
        ) from None
    return fn
