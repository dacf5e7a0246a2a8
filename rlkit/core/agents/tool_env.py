"""The `tool` loop: an environment that runs the policy's tool calls and answers with their results."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from rlkit.core.agents.guard import Guard
from rlkit.core.agents.tools import Tool, ToolCall, ToolDefinitionError, ToolUnavailable, parse_tool_calls
from rlkit.core.registrations import BUILTIN_TOOLS
from rlkit.errors import UserError
from rlkit.recipes.user_code import reference

if TYPE_CHECKING:
    from rlkit.recipes.agent_schema import AgentConfig

KEY = "rollout.agent.tools"


def load_tools(config: AgentConfig) -> list[Tool]:
    """The tools `rollout.agent.tools` names, each with its schema; UserError for a bad one. An MCP server
    ('mcp:...') brings all of its tools, and is started here (once per process: rlkit.core.agents.mcp_tools)."""
    from rlkit.core.agents.mcp_tools import is_mcp, server_tools
    from rlkit.core.rewards.custom import names_code, resolve

    tools: list[Tool] = []
    for spec in config.tools:
        if isinstance(spec, str) and is_mcp(spec):
            tools += server_tools(spec, config.call_timeout_s, KEY)
            continue
        if isinstance(spec, str) and spec in BUILTIN_TOOLS:
            fn = BUILTIN_TOOLS.get(spec)(config)
        elif names_code(spec):
            fn = resolve(spec, KEY)
        else:
            raise UserError(
                f"{KEY}: {BUILTIN_TOOLS.unknown_message(spec)}; name your own as 'path/file.py:function', "
                "or an MCP server as 'mcp:stdio:COMMAND' or 'mcp:http://HOST:PORT/mcp'"
            )
        try:
            tools.append(Tool.from_function(fn))
        except ToolDefinitionError as exc:
            raise UserError(f"{KEY}: {reference(spec)}: {exc}") from None
    names = [tool.name for tool in tools]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError(f"{KEY}: more than one tool is named {', '.join(twice)}; the model calls tools by name")
    return tools


def prompt_tools(config: AgentConfig) -> list[dict[str, Any]] | None:
    """The function schemas a prompt shows the policy (the chat template's `tools=`), for loop=tool."""
    return [tool.schema for tool in load_tools(config)] if config.loop == "tool" else None


class ToolEnv:
    """Runs every tool call of a turn (at once, each with its own deadline) and answers with one
    "tool" message per call; a turn without a call is the final answer and ends the episode.

    Rewards stay None: the reward functions score the episode (rollout source). `episode_metrics` counts the
    episode's calls and those answered with an error (logged as agent/tool_calls, agent/tool_errors: the mean per
    episode, val/agent/... in validation), so a curve shows whether the policy uses its tools.
    """

    def __init__(self, tools: list[Tool], guard: Guard, output_chars: int) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.guard, self.output_chars = guard, output_chars
        self.row: dict[str, Any] = {}
        self.episode_metrics = {"agent/tool_calls": 0, "agent/tool_errors": 0}

    def reset(self, row: dict[str, Any]) -> None:
        self.row = row
        self.episode_metrics = {"agent/tool_calls": 0, "agent/tool_errors": 0}

    def step(self, action: str) -> tuple[list[dict[str, Any]] | None, None, bool]:
        calls = parse_tool_calls(action)
        if not calls:
            return None, None, True
        answers = self.answers(calls)
        self.episode_metrics["agent/tool_calls"] += len(calls)
        self.episode_metrics["agent/tool_errors"] += sum(answer.startswith("error: ") for answer in answers)
        return (
            [
                {"role": "tool", "name": getattr(call, "name", "error"), "content": answer}
                for call, answer in zip(calls, answers)
            ],
            None,
            False,
        )

    def answers(self, calls: list[ToolCall | str]) -> list[str]:
        """Each call's result (or what went wrong) as text for the model."""
        answers: list[str | None] = []
        runnable: list[tuple[int, functools.partial]] = []
        for call in calls:
            prepared = self.prepare(call)
            if isinstance(prepared, str):
                answers.append(prepared)
            else:
                runnable.append((len(answers), prepared))
                answers.append(None)
        outcomes = self.guard.call_all([(fn, ()) for _, fn in runnable])
        for (index, _), outcome in zip(runnable, outcomes):
            if isinstance(outcome.exception, ToolUnavailable):  # not the model's doing: the episode fails
                raise outcome.exception
            if outcome.error is not None:
                answers[index] = f"error: {outcome.error.strip().splitlines()[-1]}"
            else:
                value = outcome.value
                answers[index] = self.cut(value if isinstance(value, str) else json.dumps(value, default=str))
        return answers  # type: ignore[return-value]  (every entry is filled above)

    def prepare(self, call: ToolCall | str) -> functools.partial | str:
        """The call bound to its tool, or an error message for the model."""
        if isinstance(call, str):
            return f"error: {call}"
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: there is no tool {call.name!r}; the tools are {', '.join(sorted(self.tools))}"
        return tool.bind(call.arguments, self.row)

    def cut(self, text: str) -> str:
        if len(text) <= self.output_chars:
            return text
        return f"{text[: self.output_chars]}\n[... {len(text) - self.output_chars} more characters cut]"
