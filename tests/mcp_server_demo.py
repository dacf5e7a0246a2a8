"""A small MCP server for the tests (stdio by default; `--http PORT` serves streamable HTTP instead).

Tools: `calculator` (integer arithmetic), `lookup` (the secret digit of the episode's row, which rlkit sends
in the call's `_meta` as "rlkit/row"; the tiny agent demo's tool), and `misbehave` (fails on purpose:
raises, sleeps, or exits the process). With RLKIT_MCP_DEMO_LOG set, each call appends a line there.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("rlkit-test-tools", log_level="WARNING")


def _record(line: str) -> None:
    log = os.environ.get("RLKIT_MCP_DEMO_LOG")
    if log:
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {line}\n")


@server.tool()
def calculator(a: int, b: int, op: str = "+") -> int:
    """Combine two integers with + or *.

    Args:
        a: The first number.
        b: The second number.
        op: "+" or "*".
    """
    _record(f"calculator {a} {op} {b}")
    if op not in ("+", "*"):
        raise ToolError(f"unknown operator {op!r}; use + or *")
    return a + b if op == "+" else a * b


@server.tool()
def lookup(ctx: Context) -> str:
    """Look up the secret digit of this task."""
    row = (ctx.request_context.meta or {}).get("rlkit/row") or {}
    _record(f"lookup row {row.get('index')}")
    return str(row.get("ground_truth", "?"))


@server.tool()
def misbehave(how: str) -> str:
    """Fail on purpose: 'raise', 'sleep' (60 s) or 'exit' (the server process ends).

    Args:
        how: Which failure.
    """
    _record(f"misbehave {how}")
    if how == "sleep":
        time.sleep(60)
    if how == "exit":
        print("the demo server exits on request", file=sys.stderr, flush=True)
        os._exit(3)
    raise ToolError(f"misbehaving as asked: {how}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
