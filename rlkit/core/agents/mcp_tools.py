"""MCP tool servers as agent tools: `rollout.agent.tools` entries `mcp:stdio:COMMAND ARGS` and `mcp:http://URL`.

Each server is started once per process, on first use (a rollout worker; the controller too, for the schemas
the prompts show), and its tools join rlkit's own: their schemas (the server's tools/list) go to the chat
template's `tools=`, their calls run under the same guard (rlkit.core.agents.guard). One client session per
server carries every episode's calls at once (MCP multiplexes requests), on an event loop thread of this module.
A call sends the episode's data row in the request's `_meta` under "rlkit/row" (rlkit's own tools get it
as their `row` parameter).

Failures: a result the server marks as an error, or a protocol error (an unknown tool, bad arguments) is
answered to the model as "error: ...", as a failing rlkit tool is; past rollout.agent.call_timeout_s the call
is cancelled and answered as a timeout. A server that is gone (its process exited, its connection closed)
fails the episode whose call found out (ToolUnavailable: scored 0, logged with its row) and is started again
on the next call; a server that cannot start fails the calls that waited for it.

Lifetime: close_servers() ends them (the controller at the end of a run; every process at exit). The SDK
starts a stdio server in a process group of its own, where it would outlive a killed worker (a Ray actor
is killed with SIGKILL), so on Linux it is started through a shim that asks the kernel to SIGTERM it when
the thread that started it (this module's, which lives as long as the process) ends.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import functools
import inspect
import json
import logging
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rlkit.core.agents.tools import Tool, ToolUnavailable
from rlkit.errors import UserError

logger = logging.getLogger("rlkit")

PREFIX = "mcp:"
ROW_META_KEY = "rlkit/row"
_STDERR_LINES = 12  # of a server's stderr, kept to explain why it stopped
_CLOSE_S = 10.0  # the SDK's own shutdown: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL
# Exec'd in the server's stead: the kernel sends SIGTERM when the parent thread ends (PR_SET_PDEATHSIG = 1);
# a parent already gone by then (a changed ppid) means no server at all.
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "os.getppid() == int(sys.argv[1]) or sys.exit('rlkit: the process that started this MCP server is gone')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
# The JSON-schema keywords whose values are schemas (a title there annotates a schema, not a property's name).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


@dataclass(frozen=True)
class McpSpec:
    text: str  # as written in rollout.agent.tools
    command: tuple[str, ...] = ()  # stdio
    url: str | None = None  # streamable HTTP


def is_mcp(spec: str) -> bool:
    return spec.startswith(PREFIX)


def parse_spec(spec: str, key: str) -> McpSpec:
    """'mcp:stdio:COMMAND ARGS' (split as a shell would, no shell run) or 'mcp:http(s)://...'; UserError otherwise."""
    rest = spec[len(PREFIX) :]
    if rest.startswith("stdio:"):
        try:
            command = tuple(shlex.split(rest[len("stdio:") :]))
        except ValueError as exc:
            raise UserError(f"{key}: {spec!r}: the command cannot be split into words ({exc})") from None
        if command:
            return McpSpec(spec, command=command)
    elif rest.startswith(("http://", "https://")):
        return McpSpec(spec, url=rest)
    raise UserError(
        f"{key}: {spec!r} names no MCP server; write 'mcp:stdio:COMMAND ARGS' (e.g. 'mcp:stdio:python "
        "server.py', started by rlkit) or 'mcp:http://HOST:PORT/mcp' (a running streamable-HTTP server)"
    )


def function_schema(tool: Any) -> dict[str, Any]:
    """An MCP tool (name, description, input schema) as the function schema the chat template's `tools=` takes."""
    parameters = _without_titles(tool.input_schema or {}) or {"type": "object", "properties": {}}
    description = inspect.cleandoc(tool.description or getattr(tool, "title", None) or "")
    return {"type": "function", "function": {"name": tool.name, "description": description, "parameters": parameters}}


def _without_titles(schema: Any) -> Any:
    """The schema less its `title` annotations (pydantic writes one per property: tokens that tell the model
    nothing); a property that is named "title" stays."""
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            value = {name: _without_titles(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [_without_titles(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            value = [_without_titles(s) for s in value] if isinstance(value, list) else _without_titles(value)
        kept[key] = value
    return kept


def result_text(result: Any) -> str:
    """A tools/call result as the text the model reads: its text blocks, else its structured content; a
    result marked as an error becomes "error: ..."."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None) or getattr(getattr(block, "resource", None), "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:  # an image, audio, a binary resource: the policy reads text only
            parts.append(f"[{block.type} ({getattr(block, 'mime_type', None) or 'binary'}) not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, default=str))
    text = "\n".join(parts)
    if result.is_error:
        return f"error: {text or 'the tool reported an error without a message'}"
    return text


class McpTool(Tool):
    """A tool of an MCP server: the server checks the arguments; the row goes along in the call's `_meta`."""

    def bind(self, arguments: dict[str, Any], row: dict[str, Any]) -> functools.partial | str:
        return functools.partial(self.fn, arguments, row)


@dataclass(eq=False)
class _Connection:
    """One session with the server: its client, the task holding it open, the end of the server's stderr."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    client: Any = None
    task: asyncio.Task | None = None
    ended: bool = False
    stderr: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_STDERR_LINES))
    stderr_reader: threading.Thread | None = None

    async def stderr_tail(self) -> str:
        """The server's last stderr lines (each indented), once it has closed its end or after a second."""
        if self.stderr_reader is not None:
            await asyncio.to_thread(self.stderr_reader.join, 1.0)
        return "".join(f"  | {line.rstrip()}\n" for line in self.stderr)


class McpServer:
    """A server `spec` names, started (and started again once gone) on this module's event loop."""

    def __init__(self, spec: McpSpec, start_timeout_s: float) -> None:
        self.spec, self.start_timeout_s = spec, start_timeout_s
        self.starts = 0
        self._connection: _Connection | None = None
        self._lock: asyncio.Lock | None = None
        self._failure: tuple[float, str] | None = None  # (when, why) the last start failed

    def tools(self) -> list[McpTool]:
        """The server's tools (starting it if need be); ToolUnavailable when it does not start."""
        listed = _on_loop(self._list(), timeout_s=self.start_timeout_s + _CLOSE_S)
        call = functools.partial(_call_from_any_loop, self)
        return [McpTool(functools.partial(call, tool.name), function_schema(tool)) for tool in listed]

    async def _list(self) -> list[Any]:
        connection = await self._connect()
        listed, cursor = [], None
        while True:
            try:
                page = await asyncio.wait_for(connection.client.list_tools(cursor=cursor), self.start_timeout_s)
            except asyncio.TimeoutError:
                why = f"did not list its tools within {self.start_timeout_s:g} s (rollout.agent.call_timeout_s)"
                raise ToolUnavailable(f"MCP server {self.spec.text!r} {why}") from None
            listed += page.tools
            cursor = page.next_cursor
            if not cursor:
                return listed

    async def call(self, name: str, arguments: dict[str, Any], row: dict[str, Any]) -> str:
        """The model-readable result of one call; ToolUnavailable when the server is gone."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED
        from pydantic import ValidationError

        connection = await self._connect()
        meta = {ROW_META_KEY: json.loads(json.dumps(row, default=str))}
        try:
            result = await connection.client.call_tool(name, arguments, meta=meta)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:  # the server answered: an unknown tool, arguments it refused
                return f"error: {exc.message}"
            raise await self._lost(connection, f"closed the connection during a call to {name}") from None
        except ValidationError as exc:  # the server answered something that is not a tool result
            return f"error: the MCP server's answer is not a tool result ({exc.error_count()} problems)"
        except Exception as exc:  # noqa: BLE001 - the transport failed (a refused connection, a broken pipe)
            raise await self._lost(connection, f"failed during a call to {name}: {_leaf(exc)}") from None
        return result_text(result)

    async def _connect(self) -> _Connection:
        """The open session, after starting the server if it never ran or is gone. Calls waiting while a start
        fails share that failure instead of each trying again."""
        asked_at = time.monotonic()
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            connection = self._connection
            if connection is not None and not connection.ended:
                return connection
            if self._failure is not None and self._failure[0] >= asked_at:
                raise ToolUnavailable(self._failure[1])
            try:
                self._connection = await self._start()
            except ToolUnavailable as exc:
                self._failure = (time.monotonic(), str(exc))
                raise
            self.starts += 1
            if self.starts > 1:
                logger.warning("MCP server %s started again (start %d)", self.spec.text, self.starts)
            return self._connection

    async def _start(self) -> _Connection:
        connection = _Connection()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        connection.task = asyncio.ensure_future(self._hold(connection, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout_s)
        except asyncio.CancelledError:  # the call that started it passed its deadline: no session left behind
            connection.task.cancel()
            raise
        except asyncio.TimeoutError:
            connection.task.cancel()  # the SDK stops the process it started even when cancelled
            why = f"did not start within {self.start_timeout_s:g} s (rollout.agent.call_timeout_s)"
        except Exception as exc:  # noqa: BLE001 - whatever stopped the start: a missing command, a refused URL
            why = f"did not start: {_leaf(exc)}"
        else:
            return connection
        raise ToolUnavailable(await self._explain(connection, why))

    async def _hold(self, connection: _Connection, ready: asyncio.Future) -> None:
        """Open the session, then keep it open until asked to stop (the SDK's contexts live in one task)."""
        from mcp import Client
        from mcp_types import Implementation

        errlog = None
        try:
            if self.spec.url is not None:
                server: Any = self.spec.url
            else:
                server, errlog = self._stdio(connection)
            client = Client(server, cache=None, client_info=Implementation(name="rlkit", version="1"))
            async with client:
                connection.client = client
                ready.set_result(None)
                await connection.stop.wait()
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits for the start
            if not ready.done():
                ready.set_exception(exc)
        finally:
            connection.ended = True
            if errlog is not None:
                errlog.close()  # the server's end stays open while it lives: the reader sees EOF once it is gone
            if not ready.done():
                ready.cancel()

    def _stdio(self, connection: _Connection) -> tuple[Any, Any]:
        """The SDK's transport that starts the command (with this process's environment), and the write end of
        the pipe its stderr goes to, read into the connection's tail by a thread."""
        from mcp import StdioServerParameters, stdio_client

        read_fd, write_fd = os.pipe()
        connection.stderr_reader = threading.Thread(
            target=_read_lines, args=(read_fd, connection.stderr), name="rlkit-mcp-stderr", daemon=True
        )
        connection.stderr_reader.start()
        command, *args = self.spec.command
        if sys.platform == "linux":
            command, args = sys.executable, ["-c", _ORPHAN_GUARD, str(os.getpid()), command, *args]
        errlog = os.fdopen(write_fd, "w")
        return stdio_client(StdioServerParameters(command=command, args=args, env=dict(os.environ)), errlog), errlog

    async def _lost(self, connection: _Connection, what: str) -> ToolUnavailable:
        if self._connection is connection:
            self._connection = None
        connection.stop.set()  # its process, should it still run, is stopped
        again = "rlkit connects again" if self.spec.url is not None else "it is started again"
        why = f"{what}; {again} on the next call"
        return ToolUnavailable(await self._explain(connection, why))

    async def _explain(self, connection: _Connection, why: str) -> str:
        """Why the server stopped, with its last stderr lines first (the message's last line is the summary)."""
        tail = await connection.stderr_tail()
        head = f"the MCP server's last stderr lines:\n{tail}" if tail else ""
        return f"{head}MCP server {self.spec.text!r} {why}"

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.task is not None:
            connection.stop.set()
            _, pending = await asyncio.wait({connection.task}, timeout=_CLOSE_S)
            for task in pending:  # stuck in its start
                task.cancel()


def _read_lines(fd: int, tail: collections.deque) -> None:
    with open(fd, errors="replace") as stream:
        for line in stream:
            tail.append(line)


def _leaf(exc: BaseException) -> str:
    """The first real exception inside anyio's task-group wrappers, as 'Type: message'."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def _call_from_any_loop(server: McpServer, name: str, arguments: dict[str, Any], row: dict[str, Any]) -> str:
    """server.call on this module's loop, awaited from the guard's (cancelling this cancels the call there)."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(server.call(name, arguments, row), _loop()))


# -- one event loop and one server per spec, per process ----------------------------------------------------
_event_loop: asyncio.AbstractEventLoop | None = None
_servers: dict[str, McpServer] = {}
_registry_lock = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    global _event_loop
    with _registry_lock:
        if _event_loop is None:
            _event_loop = asyncio.new_event_loop()
            threading.Thread(target=_event_loop.run_forever, name="rlkit-mcp", daemon=True).start()
            atexit.register(close_servers)
        return _event_loop


def _on_loop(coroutine: Any, timeout_s: float) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, _loop()).result(timeout_s)


def server_tools(spec: str, start_timeout_s: float, key: str) -> list[McpTool]:
    """The tools of the server `spec` names, the server started once per process; UserError naming `key` when
    the spec is malformed, the mcp package missing, or the server does not start."""
    parsed = parse_spec(spec, key)
    try:
        import mcp  # noqa: F401 - only to say what to install
    except ImportError:
        raise UserError(f"{key}: {spec!r} needs the mcp package: pip install 'mcp>=2.3'") from None
    with _registry_lock:
        server = _servers.setdefault(spec, McpServer(parsed, start_timeout_s))
    try:
        return server.tools()
    except ToolUnavailable as exc:
        raise UserError(f"{key}: {exc}") from None


def close_servers() -> None:
    """Stop every MCP server this process started (stdin closed, then SIGTERM, then SIGKILL: the SDK's way)."""
    with _registry_lock:
        servers = list(_servers.values())
        _servers.clear()
    if servers and _event_loop is not None:
        _on_loop(_close_all(servers), timeout_s=_CLOSE_S + 5)


async def _close_all(servers: list[McpServer]) -> None:
    await asyncio.gather(*(server.close() for server in servers))
