"""A multi-turn verifiers 0.4 environment for the tests (`verifiers:tests/vf_guess.py:guess_env`): the env
answers each guess with "higher" or "lower" for up to three guesses over vf_arith's tasks, and records
the guesses it needed (finalize)."""

from __future__ import annotations

import verifiers.v1 as vf


class GuessConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(2):
                if segment.terminated or segment.last_reply == task.data.answer:
                    break
                guess = segment.last_reply
                segment = await chat.turn("higher" if not guess.isdigit() or guess < task.data.answer else "lower")

    async def finalize(self, task, episode):
        for trace in episode.traces:
            trace.record_metric("guesses", float(trace.num_turns))


def guess_env() -> GuessEnv:
    return GuessEnv(GuessConfig(taskset={"id": "vf_arith"}))
