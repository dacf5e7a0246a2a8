"""The workers' side of multi-turn rollout: the agent loop, built once per worker, next to its engine.

Policy workers (colocated placement) and rollout workers (split placement) both hold an engine;
`AgentEpisodes` gives either the `agent_episodes` call the rollout source makes instead of
`generate` when rollout.agent.loop is not single_turn, and `validation_episodes`, validation's
call (rlkit.core.controller.validation): the same episodes, or one-turn completions without an
agent loop, through `run_episodes`, which `rlkit eval` runs on its own engine too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlkit.core.agents.client_loop import ClientAgentLoop, agent_function
from rlkit.core.agents.envs import env_factory, load_env_class
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Limits
from rlkit.core.agents.tool_env import ToolEnv, load_tools
from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.state.shards import rng_state, set_rng_state

if TYPE_CHECKING:
    from rlkit.core.rollout.base import RolloutEngine, Sampling
    from rlkit.recipes.schema import RLConfig

# A tool turn's step waits for its tool calls, which run at once, each with call_timeout_s:
# the step itself gets this much more before it counts as hung.
_TOOL_STEP_MARGIN_S = 5.0


def build_agent_loop(config: RLConfig, tokenizer: Any) -> AgentLoop | ClientAgentLoop:
    """The loop rollout.agent describes, with its environment factory and limits."""
    agent, data = config.rollout.agent, config.data
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


class AgentEpisodes(PhaseReporter):
    """Mixed into a worker that has `engine`, `config`, `model_path` and `rank`."""

    _agent_loop: AgentLoop | ClientAgentLoop | None = None

    @in_phase("generate/agent")
    def agent_episodes(self, rows: list[Any], groups: list[int], sampling: Sampling) -> list[Trajectory]:
        """sampling.n episodes per row, run turn by turn on this worker's engine."""
        self.wake_engine()  # type: ignore[attr-defined]
        trajectories = self.agent_loop().run(self.engine, rows, groups, sampling)
        self.engine.sleep()
        return trajectories

    def validation_episodes(self, rows: list[Any], groups: list[int], sampling: Sampling) -> list[Trajectory]:
        """Validation's episodes on this worker's engine: the agent loop's (rollout.agent), or one-turn
        completions. This process's RNG states are put back afterwards (an engine may reseed them;
        the HF engine does), so validating never shifts what training draws next."""
        if not rows:  # fewer validation prompts than ranks
            return []
        state = rng_state()
        with self.reporting("validation"):
            self.wake_engine()  # type: ignore[attr-defined]
            try:
                loop = None if self.config.rollout.agent.loop == "single_turn" else self.agent_loop()
                return run_episodes(self.engine, loop, rows, groups, sampling)
            finally:
                self.engine.sleep()
                set_rng_state(state)

    def agent_loop(self) -> AgentLoop | ClientAgentLoop:
        """This worker's agent loop, built on first use."""
        if self._agent_loop is None:
            from transformers import AutoTokenizer

            self._agent_loop = build_agent_loop(self.config, AutoTokenizer.from_pretrained(self.model_path))
        return self._agent_loop
