"""The workers' side of multi-turn rollout: the agent loop that rollout.agent describes, and episodes on an engine.

The generation role (rlkit.core.rollout.generator) builds the loop once per worker, next to its
engine, for its `agent_episodes` (the rollout source's call instead of `generate` when
rollout.agent.loop is not single_turn) and `validation_episodes` (validation's: the same
episodes, or one-turn completions without an agent loop, through `run_episodes`, which
`rlkit eval` runs on its own engine too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlkit.core.agents.client_loop import ClientAgentLoop, agent_function
from rlkit.core.agents.envs import env_factory, load_env_class
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Limits
from rlkit.core.agents.openenv_env import episode_factory, is_openenv
from rlkit.core.agents.tool_env import ToolEnv, load_tools
from rlkit.core.agents.verifiers_env import VerifiersEpisode, is_verifiers, load_verifiers_env
from rlkit.core.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from rlkit.core.rollout.base import RolloutEngine, Sampling
    from rlkit.recipes.agent_schema import AgentConfig
    from rlkit.recipes.model_schema import DataConfig

# A tool turn's step waits for its tool calls, which run at once, each with call_timeout_s:
# the step itself gets this much more before it counts as hung.
_TOOL_STEP_MARGIN_S = 5.0


def build_agent_loop(agent: AgentConfig, data: DataConfig, tokenizer: Any) -> AgentLoop | ClientAgentLoop:
    """The loop `agent` (rollout.agent) describes, with its environment factory and limits (per turn, and the
    prompt and response lengths of `data`)."""
    limits = Limits(
        max_turns=agent.max_turns,
        max_tokens_per_turn=agent.max_tokens_per_turn or data.max_response_length,
        max_response_tokens=data.max_response_length,
        max_prompt_tokens=data.max_prompt_length,
    )
    if agent.loop == "tool":
        tools = load_tools(agent)
        tool_guard = Guard(agent.call_timeout_s)
        return AgentLoop(
            tokenizer,
            lambda: ToolEnv(tools, tool_guard, agent.tool_output_chars),
            limits,
            Guard(agent.call_timeout_s + _TOOL_STEP_MARGIN_S),
            tools=[t.schema for t in tools],
        )
    if agent.loop == "env":
        make_env = env_factory(load_env_class(agent.env or ""), agent.env_kwargs)
        return AgentLoop(tokenizer, make_env, limits, Guard(agent.call_timeout_s))
    if is_verifiers(agent.loop):
        verifiers_env = load_verifiers_env(agent.loop)
        return AgentLoop(tokenizer, lambda: VerifiersEpisode(verifiers_env), limits, Guard(agent.call_timeout_s))
    if is_openenv(agent.loop):
        make_env = episode_factory(agent.loop, agent.env_kwargs, agent.openenv_adapter, agent.call_timeout_s)
        return AgentLoop(tokenizer, make_env, limits, Guard(agent.call_timeout_s))
    return ClientAgentLoop(tokenizer, agent_function(agent.loop), limits, agent.call_timeout_s)


def run_episodes(
    engine: RolloutEngine,
    loop: AgentLoop | ClientAgentLoop | None,
    rows: list[Any],
    groups: list[int],
    sampling: Sampling,
) -> list[Trajectory]:
    """sampling.n episodes per row on `engine`, prompt-major (group: the row's entry in `groups`): the
    agent loop's, or with no loop (rollout.agent.loop=single_turn) one-turn completions."""
    if loop is not None:
        return loop.run(engine, rows, groups, sampling)
    samples = engine.generate([row.prompt_token_ids for row in rows], sampling)
    return [Trajectory.single_turn(rows[s.prompt_index], groups[s.prompt_index], s) for s in samples]
