"""Tools: schemas from type hints and docstrings, Hermes tool-call parsing, and the tool loop's
answers when a call is malformed, unknown, wrong, failing, slow or long."""

from __future__ import annotations

import os
import time
from typing import Literal, Optional

import pytest

from rlkit.core.agents.builtin_tools import calculator
from rlkit.core.registrations import BUILTIN_TOOLS
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.tool_env import ToolEnv, load_tools
from rlkit.core.agents.tools import (
    Tool,
    ToolCall,
    ToolDefinitionError,
    function_schema,
    parse_tool_calls,
)
from rlkit.errors import UserError
from rlkit.recipes.agent_schema import AgentConfig


def search(query: str, limit: int = 3, mode: Literal["fast", "exact"] = "fast", tags: Optional[list[str]] = None,
           row: dict | None = None) -> str:
    """Search the notes.

    Longer text that the schema leaves out.

    Args:
        query: What to look for,
            over two lines.
        limit (int): How many hits.
        mode: Speed or precision.
        tags: Only notes with these tags.

    Returns:
        The hits, one per line.
    """
    return f"{query}|{limit}|{mode}|{tags}|{(row or {}).get('index')}"


def test_schema_comes_from_type_hints_and_the_docstring_and_hides_row():
    assert function_schema(search) == {"type": "function", "function": {
        "name": "search", "description": "Search the notes.",
        "parameters": {"type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "What to look for, over two lines."},
            "limit": {"type": "integer", "description": "How many hits."},
            "mode": {"type": "string", "enum": ["fast", "exact"], "description": "Speed or precision."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Only notes with these tags."}}}}}


def _undocumented(x: int) -> int:
    return x


def _untyped(x) -> int:
    """Has no hint."""
    return x


def _star(*values: int) -> int:
    """Takes *args."""
    return 0


def _odd(x: set) -> int:
    """A set has no JSON type."""
    return 0


@pytest.mark.parametrize("fn, message", [(_undocumented, "has no docstring"), (_untyped, "has no type hint"),
                                         (_star, "plain named parameter"), (_odd, "no JSON equivalent")])
def test_functions_that_cannot_be_tools_say_why(fn, message):
    with pytest.raises(ToolDefinitionError, match=message):
        function_schema(fn)


def test_hermes_tool_calls_are_parsed_and_malformed_ones_described():
    text = ('let me check <tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
            "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call>"
            '<tool_call>{"name": "f", "arguments": 3}</tool_call><tool_call>{"name": "g"')
    calls = parse_tool_calls(text)
    assert calls[:2] == [ToolCall("search", {"query": "x"}), ToolCall("calculator", {"expression": "1+1"})]
    assert calls[2].startswith("the tool call is not valid JSON (Expecting property name enclosed in double quotes")
    assert calls[3] == 'a tool call must be a JSON object {"name": ..., "arguments": {...}}'
    assert calls[4] == "the \"arguments\" of the call to 'f' must be a JSON object"
    assert calls[5] == "a <tool_call> is not closed by </tool_call>"
    assert parse_tool_calls("The answer is 4.") == []


def _slow(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


def test_the_tool_loop_answers_every_call_even_bad_ones():
    tools = [Tool.from_function(fn) for fn in (search, calculator, _slow)]
    env = ToolEnv(tools, Guard(0.5), output_chars=12)
    env.reset({"index": 7})

    def call(name, **arguments):
        import json
        return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'

    start = time.perf_counter()
    messages, reward, done = env.step(call("search", query="q", limit=2) + call("calculator", expression="6*7")
                                      + call("calculator", expression="1/0") + call("nope") + call("search")
                                      + call("_slow", seconds=5) + "<tool_call>{bad</tool_call>"
                                      + call("search", query="a" * 40))
    assert time.perf_counter() - start < 3  # the slow call was cut at its deadline
    assert reward is None and done is False and all(m["role"] == "tool" for m in messages)
    answers = [m["content"] for m in messages]
    assert answers[0] == "q|2|fast|Non\n[... 3 more characters cut]"  # "q|2|fast|None|7" (row index 7), cut at 12
    assert answers[1] == "42"
    assert answers[2] == "error: ZeroDivisionError: division by zero"
    assert answers[3] == "error: there is no tool 'nope'; the tools are _slow, calculator, search"
    assert answers[4] == "error: wrong arguments for search: missing a required argument: 'query'"
    assert answers[5] == "error: TimeoutError: did not return within 0.5 s (rollout.agent.call_timeout_s)"
    assert answers[6].startswith("error: the tool call is not valid JSON")
    assert env.step("no call: the answer is 42") == (None, None, True)
    # 8 calls, 5 answered with an error (not the two searches with a query, nor 6*7); a new episode counts from 0.
    assert env.episode_metrics == {"agent/tool_calls": 8, "agent/tool_errors": 5}
    env.reset({"index": 8})
    assert env.episode_metrics == {"agent/tool_calls": 0, "agent/tool_errors": 0}


def test_the_row_reaches_a_tool_that_asks_for_it():
    env = ToolEnv([Tool.from_function(search)], Guard(2.0), output_chars=100)
    env.reset({"index": 7})
    messages, _, _ = env.step('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>')
    assert messages[0]["content"] == "q|3|fast|None|7"


def test_calculator_is_exact_and_refuses_anything_but_arithmetic():
    assert calculator("(12 + 7) * 3 / 4") == "14.25"
    assert calculator("2 ** 100") == str(2 ** 100)
    assert calculator("-(7 // 2) % 5") == "2"  # Python's modulo: -3 % 5
    for bad, message in (("__import__('os')", "not arithmetic"), ("10 ** 10 ** 10", "exponent"), ("x + 1", "not arithmetic")):
        with pytest.raises(ValueError, match=message):
            calculator(bad)


def test_python_tool_runs_in_the_sandbox_and_reports_how_it_ended():
    python = BUILTIN_TOOLS.get("python")(AgentConfig(sandbox={"wall_s": 2, "cpu_s": 1, "memory_mb": 256}))
    assert python("print(sum(range(10)))") == "45"
    assert python("import socket; socket.create_connection(('1.1.1.1', 53))").endswith(
        "OSError: [Errno 101] Network is unreachable\n[exit code 1]")
    assert python("while True: pass").rsplit("\n", 1)[-1] in ("[killed: wall-clock limit]", "[killed: CPU-time limit]")
    assert python("x = 1") == "(the program printed nothing)"
    assert python("import os; print(os.nice(0))") == str(os.nice(0) + 10)  # below the rollout worker's priority


def test_tools_are_named_by_builtin_name_or_file(tmp_path):
    (tmp_path / "mine.py").write_text('def double(x: int) -> int:\n    """Twice x.\n\n    Args:\n        x: A number.\n'
                                      '    """\n    return 2 * x\n\ndef bad(x):\n    return x\n')
    tools = load_tools(AgentConfig(loop="tool", tools=["calculator", f"{tmp_path}/mine.py:double"]))
    assert [t.name for t in tools] == ["calculator", "double"]
    with pytest.raises(UserError, match="unknown built-in tool 'calculater'.*did you mean 'calculator'"):
        load_tools(AgentConfig(tools=["calculater"]))
    with pytest.raises(UserError, match="mine.py:bad: tool 'bad' has no docstring"):
        load_tools(AgentConfig(tools=[f"{tmp_path}/mine.py:bad"]))
    with pytest.raises(UserError, match="more than one tool is named calculator"):
        load_tools(AgentConfig(tools=["calculator", "calculator"]))
