"""MCP tool servers as agent tools (rlkit.core.agents.mcp_tools): specs, schema conversion, results, and the
demo server of tests/mcp_server_demo.py over stdio and streamable HTTP: calls, errors, timeouts, a server that
dies or never starts, and that no server outlives its run or its worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_helpers import ScriptedEngine, chatml_tokenizer, rows
from mcp_types import CallToolResult, ImageContent, TextContent
from mcp_types import Tool as McpToolInfo
from transformers import AutoTokenizer

from rlkit.core.agents import mcp_tools
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Limits
from rlkit.core.agents.report import episode_metrics
from rlkit.core.agents.tool_env import ToolEnv, load_tools
from rlkit.core.agents.tools import Tool, ToolUnavailable
from rlkit.core.data.synthetic import lookup
from rlkit.core.rollout.base import Sampling
from rlkit.core.tiny import TOOL_CALL_TOKEN
from rlkit.errors import UserError
from rlkit.recipes.agent_schema import AgentConfig

DEMO = Path(__file__).with_name("mcp_server_demo.py")
SPEC = f"mcp:stdio:{sys.executable} {DEMO}"
KEY = "rollout.agent.tools"


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def server_pids(log: Path) -> set[int]:
    return {int(line.split()[0]) for line in log.read_text().splitlines()} if log.exists() else set()


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_specs_name_a_command_or_a_url_and_anything_else_says_how():
    assert mcp_tools.parse_spec("mcp:stdio:python 'my server.py' --db x", KEY).command == (
        "python", "my server.py", "--db", "x")
    assert mcp_tools.parse_spec("mcp:http://127.0.0.1:8000/mcp", KEY).url == "http://127.0.0.1:8000/mcp"
    for bad in ("mcp:stdio:", "mcp:python server.py", "mcp:ftp://x"):
        with pytest.raises(UserError, match=f"{KEY}: '{bad}' names no MCP server; write 'mcp:stdio:COMMAND ARGS'"):
            mcp_tools.parse_spec(bad, KEY)
    with pytest.raises(UserError, match="cannot be split into words"):
        mcp_tools.parse_spec("mcp:stdio:python 'unclosed", KEY)


def test_an_mcp_tool_schema_becomes_a_function_schema_without_pydantic_titles():
    info = McpToolInfo(name="search", description="  Search notes.\n\n    Args:\n        title: Whose.\n  ",
                       input_schema={"type": "object", "title": "searchArguments", "required": ["title"],
                                     "properties": {"title": {"title": "Title", "type": "string"},
                                                    "tags": {"title": "Tags", "type": "array",
                                                             "items": {"title": "Tag", "type": "string"}},
                                                    "mode": {"anyOf": [{"title": "A", "type": "string"},
                                                                       {"type": "null"}], "default": None}}})
    assert mcp_tools.function_schema(info) == {"type": "function", "function": {
        "name": "search", "description": "Search notes.\n\nArgs:\n    title: Whose.",
        "parameters": {"type": "object", "required": ["title"], "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}}}}}
    bare = McpToolInfo(name="ping", input_schema={"type": "object"})
    assert mcp_tools.function_schema(bare)["function"] == {"name": "ping", "description": "",
                                                            "parameters": {"type": "object"}}


def test_results_become_the_text_the_model_reads():
    text = TextContent(type="text", text="42")
    image = ImageContent(type="image", data="AAAA", mime_type="image/png")
    assert mcp_tools.result_text(CallToolResult(content=[text, image])) == "42\n[image (image/png) not shown]"
    assert mcp_tools.result_text(CallToolResult(content=[], structured_content={"a": 1})) == '{"a": 1}'
    assert mcp_tools.result_text(CallToolResult(content=[text], is_error=True)) == "error: 42"
    assert mcp_tools.result_text(CallToolResult(content=[], is_error=True)) == (
        "error: the tool reported an error without a message")


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory):
    """The demo server's call log (its pid on each line); every server is closed after the module's tests."""
    log = tmp_path_factory.mktemp("mcp") / "calls.log"
    os.environ["RLKIT_MCP_DEMO_LOG"] = str(log)  # the server inherits this process's environment
    yield log
    os.environ.pop("RLKIT_MCP_DEMO_LOG")
    mcp_tools.close_servers()


def test_the_servers_tools_join_rlkits_own_with_their_schemas_and_start_once(demo_log):
    mcp_tools.close_servers()  # this test counts the servers it starts
    before = server_pids(demo_log)
    tools = load_tools(AgentConfig(loop="tool", tools=["python", SPEC]))
    assert [t.name for t in tools] == ["python", "calculator", "lookup", "misbehave"]
    assert tools[1].schema == {"type": "function", "function": {
        "name": "calculator", "description": 'Combine two integers with + or *.\n\nArgs:\n    a: The first number.\n'
                                             '    b: The second number.\n    op: "+" or "*".',
        "parameters": {"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}, "op": {"type": "string", "default": "+"}}}}}
    # The demo's calculator and rlkit's have one name: the model could not tell them apart.
    with pytest.raises(UserError, match="more than one tool is named calculator"):
        load_tools(AgentConfig(loop="tool", tools=[SPEC, "calculator"]))
    mcp_only = load_tools(AgentConfig(loop="tool", tools=[SPEC]))  # the same server, not a second one
    env = ToolEnv(mcp_only, Guard(2), 100)
    env.reset({"index": 3, "ground_truth": "8"})
    assert env.step(call("lookup"))[0][0]["content"] == "8"
    [pid] = server_pids(demo_log) - before
    assert mcp_tools._servers[SPEC].starts == 1 and not gone(pid)
    mcp_tools.close_servers()
    assert gone(pid)


def test_calls_errors_and_timeouts_are_answered_as_rlkits_own_tools_are(demo_log):
    tools = load_tools(AgentConfig(loop="tool", tools=[SPEC]))
    env = ToolEnv(tools, Guard(1.5), output_chars=100)
    env.reset({"index": 7, "ground_truth": "4", "extra_info": {"when": time}})  # not JSON: sent as its str()
    start = time.perf_counter()
    messages, reward, done = env.step(
        call("calculator", a=6, b=7, op="*") + call("lookup") + call("calculator", a=1, b=2, op="-")
        + call("calculator", a="x", b=1) + call("misbehave", how="sleep") + call("nope"))
    assert time.perf_counter() - start < 4  # every call at once; the sleeping one cut at 1.5 s
    answers = [m["content"] for m in messages]
    assert answers[:3] == ["42", "4", "error: Error executing tool calculator: unknown operator '-'; use + or *"]
    assert answers[3].startswith("error: Error executing tool calculator: 1 validation error for calculatorArgum")
    assert answers[3].endswith("more characters cut]")  # rollout.agent.tool_output_chars, as for any tool
    assert answers[4] == "error: TimeoutError: did not return within 1.5 s (rollout.agent.call_timeout_s)"
    assert answers[5] == "error: there is no tool 'nope'; the tools are calculator, lookup, misbehave"
    assert reward is None and done is False


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_demo_episode_is_the_same_with_lookup_served_over_mcp(tiny_tokenizer, demo_log):
    """The tiny demo's two turns: call `lookup`, answer its digit. The server's lookup reads the row from the
    call's _meta; the trajectories equal those of rlkit's own lookup token for token."""
    tok = tiny_tokenizer
    call_id = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN)

    def policy(context):  # call the tool first; then repeat the digit the tool answered
        return ([call_id], False) if call_id not in context else ([context[-3]], False)

    limits = Limits(max_turns=2, max_tokens_per_turn=1, max_response_tokens=8, max_prompt_tokens=32)
    served = [t for t in load_tools(AgentConfig(loop="tool", tools=[SPEC])) if t.name == "lookup"]
    runs = []
    for tools in (served, [Tool.from_function(lookup)]):
        loop = AgentLoop(tok, lambda tools=tools: ToolEnv(tools, Guard(5), 100), limits, Guard(6))
        runs.append(loop.run(ScriptedEngine(policy), rows(tok, ["secret?"] * 2, ["7", "3"]), [0, 1], Sampling(n=2)))
    assert [t.response_ids for t in runs[0]] == [t.response_ids for t in runs[1]]
    assert tok.decode(runs[0][2].response_ids[-1:]) == "3" and all(t.finish_reason == "stop" for t in runs[0])


def test_a_dead_server_fails_its_episode_with_its_row_and_is_started_again(tmp_path, demo_log, caplog):
    chatml_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tools = load_tools(AgentConfig(loop="tool", tools=[SPEC]))
    limits = Limits(max_turns=2, max_tokens_per_turn=64, max_response_tokens=200, max_prompt_tokens=64)
    loop = AgentLoop(tok, lambda: ToolEnv(tools, Guard(5), 100), limits, Guard(10))
    starts = mcp_tools._servers[SPEC].starts

    def episode(action: str):
        turn = tok.encode(action, add_special_tokens=False)
        [trajectory] = loop.run(ScriptedEngine(lambda context: (turn, True)), rows(tok, ["go"], ["5"]), [0],
                                Sampling(n=1))
        return trajectory

    dead = episode(call("misbehave", how="exit"))
    assert dead.finish_reason == "error" and dead.reward == 0.0
    error = dead.info["env_error"]
    assert "  | the demo server exits on request\n" in error
    assert error.rstrip().endswith(f"MCP server {SPEC!r} closed the connection during a call to misbehave; "
                                   "it is started again on the next call")
    with caplog.at_level("WARNING", logger="rlkit"):
        metrics = episode_metrics([dead], AgentConfig(max_error_rate=1.0), "step 1")
    assert metrics["agent/env_errors"] == 1.0
    assert "step 1: the environment failed on row 0 (data_source 'synthetic/lookup', extra_info.index 100" in caplog.text
    alive = episode(call("lookup"))  # a new server answers
    assert alive.finish_reason != "error" and "5" in tok.decode(alive.response_ids)
    pids = {line.split(" ", 1)[1]: int(line.split()[0]) for line in demo_log.read_text().splitlines()}
    assert pids["misbehave exit"] != pids["lookup row 0"] and gone(pids["misbehave exit"])
    assert mcp_tools._servers[SPEC].starts == starts + 1


def test_a_server_that_cannot_start_is_a_user_error_with_its_stderr():
    exits = f"mcp:stdio:{sys.executable} -c \"import sys; sys.exit('index file missing')\""
    with pytest.raises(UserError) as caught:
        load_tools(AgentConfig(loop="tool", tools=[exits]))
    message = str(caught.value)
    assert message.startswith(f"{KEY}: the MCP server's last stderr lines:\n  | index file missing\n")
    assert message.endswith(f"MCP server {exits!r} did not start: MCPError: Connection closed")
    with pytest.raises(UserError, match=r"(?s)No such file or directory.*did not start"):
        load_tools(AgentConfig(loop="tool", tools=["mcp:stdio:/nonexistent/mcp-server"]))
    hangs = f"mcp:stdio:{sys.executable} -c \"import time; time.sleep(30)\""
    with pytest.raises(UserError, match=r"did not start within 1 s \(rollout.agent.call_timeout_s\)"):
        load_tools(AgentConfig(loop="tool", tools=[hangs], call_timeout_s=1))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_streamable_http_server_serves_calls_and_its_loss_fails_the_call():
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(DEMO), "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and server.poll() is None, "the HTTP demo server did not start"
            time.sleep(0.2)
        spec = f"mcp:http://127.0.0.1:{port}/mcp"
        tools = load_tools(AgentConfig(loop="tool", tools=[spec]))
        env = ToolEnv(tools, Guard(5), 100)
        env.reset({"index": 0, "ground_truth": "2"})
        assert [m["content"] for m in env.step(call("calculator", a=2, b=3) + call("lookup"))[0]] == ["5", "2"]
        server.terminate()
        server.wait(10)
        with pytest.raises(ToolUnavailable, match="rlkit connects again on the next call"):
            env.step(call("calculator", a=2, b=3))
    finally:
        server.kill()
        mcp_tools.close_servers()


WORKER = f"""
import sys, time
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.tool_env import ToolEnv, load_tools
from rlkit.recipes.agent_schema import AgentConfig
env = ToolEnv(load_tools(AgentConfig(loop="tool", tools=[{SPEC!r}])), Guard(10), 100)
env.reset({{"index": 0}})
env.step('<tool_call>{{"name": "lookup", "arguments": {{}}}}</tool_call>')
print("ready", flush=True)
time.sleep(120)
"""


def test_a_killed_worker_takes_its_stdio_server_along(tmp_path):
    """A Ray actor is killed with SIGKILL: nothing of it runs to stop the server, the kernel does."""
    log = tmp_path / "calls.log"
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "RLKIT_MCP_DEMO_LOG": str(log), "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert worker.stdout.readline() == "ready\n"
        [pid] = server_pids(log)
        assert not gone(pid)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 10
        while not gone(pid):
            assert time.monotonic() < deadline, f"the MCP server {pid} outlived its worker"
            time.sleep(0.1)
    finally:
        worker.kill()
