"""The `rollout.agent.*` section of a recipe: multi-turn episodes with tools or an environment."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rlkit.recipes.user_code import UserCode


class SandboxConfig(BaseModel):
    """A sandboxed Python program: the `python` tool's limits (code rewards use their own), and for both the
    isolation."""

    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(10.0, gt=0, description="Wall-clock seconds before the program is killed.")
    cpu_s: int = Field(5, ge=1, description="CPU seconds (RLIMIT_CPU) before the kernel stops the program.")
    memory_mb: int = Field(
        1024, ge=64, description="Address-space limit (RLIMIT_AS) in MiB; a larger allocation fails inside the program."
    )
    processes: int = Field(
        16,
        ge=1,
        description="Processes and threads the program may run at once (RLIMIT_NPROC "
        "of its own uid); a fork past it fails inside the program.",
    )
    disk_mb: int = Field(64, ge=1, description="Size in MiB of the program's working folder (a private tmpfs).")
    isolation: Literal["namespaces", "weak"] = Field(
        "namespaces",
        description="How every sandbox of the run (the python tool and code rewards) is isolated. namespaces: "
        "bubblewrap namespaces, an unprivileged uid, only /usr and the interpreter mounted read-only "
        "(docs/security.md); a run that needs the sandbox refuses to start where the machine cannot "
        "build it. weak: a plain child process with resource limits, no security boundary (warned "
        "about at start and on every step).",
    )


class AgentConfig(BaseModel):
    """How one episode runs: one completion, or turns of policy tokens and tool/environment replies.

    Episodes of a step run on the rollout workers, many at once: each turn, every running
    episode of a worker is generated in one engine call. The whole response (every turn,
    policy and tool tokens together) is capped at data.max_response_length tokens; an
    episode that would pass it is cut there and marked finish_reason "truncated".
    """

    model_config = ConfigDict(extra="forbid")

    loop: UserCode = Field(
        "single_turn",
        description="single_turn: one completion per sample (no agent code). tool: the policy calls "
        "rollout.agent.tools in the Hermes/Qwen2.5 `<tool_call>{json}</tool_call>` format and sees "
        "their results as tool messages; a turn without a call ends the episode. env: "
        "rollout.agent.env answers every turn (reset/step). verifiers:ENV: a verifiers 0.4 environment (an "
        "installed id, or path/file.py:fn returning a vf.Env) answers, its rubric is the reward. "
        "rollout.agent.env answers every turn (reset/step). 'openenv:<env>': an OpenEnv environment answers, "
        "in-process ('path/file.py:ClassName', 'package.module:ClassName') or at a server's URL. "
        "'path/file.py:fn': your "
        "`async def rollout(client, row) -> float` drives each episode through an openai client "
        "served by the rollout worker (docs/agents.md). From Python, the function itself (docs/python_api.md).",
    )
    env: UserCode | None = Field(
        None,
        description="loop=env: your environment class as 'path/file.py:ClassName' (or a registered name, or the "
        "class itself from Python), "
        "with reset(row) -> observation and step(action) -> (observation, reward, done); "
        "methods may be async. One instance per episode.",
    )
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the environment class.")
    openenv_adapter: str | None = Field(
        None,
        description="loop=openenv:<env>: your class 'path/file.py:ClassName' defining any of reset_kwargs(row), "
        "action(text, row) -> the Action's fields, observation(fields, row) -> the next user turn; rlkit's "
        "defaults for the rest (docs/agents.md, OpenEnv).",
    )
    tools: list[UserCode] = Field(
        default_factory=list,
        description="loop=tool: built-in tools (calculator, python) and your own as 'path/file.py:function' "
        "(or the function itself from Python) "
        "(JSON schema from its type hints and docstring; a parameter named `row` receives the "
        "episode's data row and is not shown to the model), and MCP servers, each bringing all its tools: "
        "'mcp:stdio:COMMAND ARGS' (started once per rollout worker, stopped at the end of the run) or "
        "'mcp:http://HOST:PORT/mcp' (a running streamable-HTTP server); the row goes in each call's "
        "_meta as 'rlkit/row' (docs/agents.md).",
    )
    max_turns: int = Field(
        4, ge=1, description="Policy turns per episode; an episode still running after them is marked truncated."
    )
    max_tokens_per_turn: int | None = Field(
        None,
        ge=1,
        description="Most tokens the policy generates in one turn; None = data.max_response_length. A turn "
        "cut here is still handed to the environment (closed by the "
        "template's end-of-turn tokens).",
    )
    call_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds one environment reset/step or tool call may take (an agent function: "
        "max_turns x this in all); past it the episode ends with reward 0 (a tool call: an "
        "error message to the model) and is counted in agent/env_errors.",
    )
    max_error_rate: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Share of a step's episodes whose environment failed (exception, timeout, "
        "bad return value) above which the run stops with the first error; below it "
        "each failed episode scores 0 and is logged with its row and traceback.",
    )
    tool_output_chars: int = Field(
        2000, ge=1, description="Characters of a tool's result shown to the model; the rest is cut and marked."
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
