"""rollout.agent checked before Ray starts: environment and tool code imports, has the right shape,
and the tokenizer's chat template can write tool/environment messages. Exit code 2, one line."""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from rlkit.core.agents.chat import TurnBoundary
from rlkit.core.agents.client_loop import agent_function
from rlkit.core.agents.envs import load_env_class
from rlkit.core.agents.openenv_env import check_openenv, is_openenv
from rlkit.core.agents.tool_env import load_tools
from rlkit.core.agents.verifiers_env import is_verifiers, load_verifiers_env
from rlkit.core.rewards.custom import names_code
from rlkit.core.sandbox.isolation import SETTING, require_isolation
from rlkit.errors import UserError
from rlkit.recipes.user_code import reference

if TYPE_CHECKING:
    from rlkit.recipes.agent_schema import AgentConfig
    from rlkit.recipes.reward_schema import RewardConfig, RewardModelConfig

logger = logging.getLogger(__name__)

LOOPS = ("single_turn", "tool", "env")
WEAK_SANDBOX_WARNING = (
    f"{SETTING}=weak: model-written code runs as a plain child process with resource limits "
    "only, without a security boundary (it can read and write what this user can and reach "
    "the network)"
)


def check_agent(agent: AgentConfig, tokenizer: Any, *, max_response_length: int, model_path: str) -> None:
    """UserError naming the rollout.agent key and the fix, for anything that would fail in the workers
    (`max_response_length`: data.max_response_length; `model_path`: model.path, named when its tokenizer's chat
    template cannot write the loop's messages)."""
    if not names_code(agent.loop) and agent.loop not in LOOPS:
        raise UserError(
            f"rollout.agent.loop={agent.loop!r}: choose one of {', '.join(LOOPS)}, verifiers:ENV (a verifiers "
            "environment), openenv:<env> (an OpenEnv environment), or your own `async def rollout(client, row)` "
            "as path/file.py:function"
        )
    if agent.openenv_adapter and not is_openenv(agent.loop):
        raise UserError(
            f"rollout.agent.openenv_adapter is set but rollout.agent.loop={agent.loop} never uses it; drop it"
        )
    if agent.loop == "single_turn":
        for key, value in (("env", agent.env), ("tools", agent.tools)):
            if value:
                raise UserError(
                    f"rollout.agent.{key} is set but rollout.agent.loop=single_turn never uses it; "
                    f"set rollout.agent.loop={'env' if key == 'env' else 'tool'}"
                )
        return
    if agent.max_tokens_per_turn is not None and agent.max_tokens_per_turn > max_response_length:
        raise UserError(
            f"rollout.agent.max_tokens_per_turn={agent.max_tokens_per_turn} is more than the whole "
            f"response may hold (data.max_response_length={max_response_length})"
        )
    tools, role = None, "tool"
    if is_verifiers(agent.loop):  # a verifiers environment: it writes user messages
        role = "user"
        if agent.env or agent.tools:
            raise UserError(
                f"rollout.agent.env and rollout.agent.tools are not used by rollout.agent.loop={agent.loop} "
                "(the verifiers environment answers the policy's turns); drop them"
            )
        load_verifiers_env(agent.loop)
    elif is_openenv(agent.loop):
        role = "user"
        check_openenv(agent)
    elif agent.loop not in LOOPS:  # an agent function: it writes its own messages
        if agent.env or agent.tools:
            raise UserError(
                "rollout.agent.env and rollout.agent.tools are not used by an agent function "
                f"(rollout.agent.loop={reference(agent.loop)}); drop them"
            )
        agent_function(agent.loop)
    elif agent.loop == "env":
        role = "user"
        if agent.tools:
            raise UserError(
                "rollout.agent.tools is set but rollout.agent.loop=env never uses it (the environment "
                "answers the policy's turns); drop it or set rollout.agent.loop=tool"
            )
        if not agent.env:
            raise UserError("rollout.agent.loop=env needs rollout.agent.env=path/file.py:ClassName")
        cls = load_env_class(agent.env)
        try:
            inspect.signature(cls).bind(**agent.env_kwargs)
        except TypeError as exc:
            raise UserError(
                f"rollout.agent.env_kwargs={agent.env_kwargs} do not fit {cls.__name__}{inspect.signature(cls)}: {exc}"
            ) from None
    else:
        if not agent.tools:
            raise UserError(
                "rollout.agent.loop=tool needs rollout.agent.tools: the built-in calculator or python, "
                "or your own as path/file.py:function"
            )
        tools = [tool.schema for tool in load_tools(agent)]
    try:
        TurnBoundary(tokenizer, tools).delta([{"role": role, "content": "probe"}])
    except Exception as exc:  # noqa: BLE001 - a template can fail in many ways (jinja, a missing role)
        raise UserError(
            f"rollout.agent.loop={reference(agent.loop)}: the chat template of model.path={model_path} cannot "
            f"write a {role!r} message ({type(exc).__name__}: {exc}); use a chat model whose template "
            "has that role"
        ) from None
    if tools and ignores_tools(tokenizer, tools):
        logger.warning(
            "rollout.agent.tools: the chat template of model.path=%s writes the same prompt with and without "
            "tools=, so the model is never shown %s; it can only call them if it learned their names and format "
            "elsewhere (SFT). Use a chat model whose template renders tools (Qwen2.5, Llama 3.1+, ...)",
            model_path,
            ", ".join(tool["function"]["name"] for tool in tools),
        )


def ignores_tools(tokenizer: Any, tools: list[dict[str, Any]]) -> bool:
    """Whether the chat template drops the tool list: a prompt rendered with `tools` equals one without."""
    probe = [{"role": "user", "content": "probe"}]
    with_tools = tokenizer.apply_chat_template(probe, tools=tools, add_generation_prompt=True, tokenize=False)
    return with_tools == tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)


def uses_sandbox(
    agent: AgentConfig, reward: RewardConfig, reward_model: RewardModelConfig, data_sources: set[str]
) -> bool:
    """Whether the run starts sandboxes: the python tool, or HumanEval's tests scored by their rule (no
    reward model, no reward function of the user's)."""
    from rlkit.core.rewards.code import HUMANEVAL

    scored_by_rule = not reward_model.path and not reward.function
    return (agent.loop == "tool" and "python" in agent.tools) or (scored_by_rule and HUMANEVAL in data_sources)


def check_sandbox(
    agent: AgentConfig, reward: RewardConfig, reward_model: RewardModelConfig, data_sources: set[str]
) -> str | None:
    """How the run's sandbox isolates (None: it uses none); SandboxUnavailable, one line naming
    rollout.agent.sandbox.isolation, where isolation is asked for and this machine cannot build it."""
    if not uses_sandbox(agent, reward, reward_model, data_sources):
        return None
    if agent.sandbox.isolation == "weak":
        return WEAK_SANDBOX_WARNING
    require_isolation()
    return "sandbox: model code runs isolated (bubblewrap namespaces, an unprivileged uid, no network)"
