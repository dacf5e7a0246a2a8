"""Built-in tools, named in `rollout.agent.tools`: `calculator` and `python` (the sandbox)."""

from __future__ import annotations

import ast
import operator
from typing import TYPE_CHECKING, Any, Callable

from rlkit.core.sandbox.process import Limits, run_python

if TYPE_CHECKING:
    from rlkit.recipes.agent_schema import AgentConfig

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 1000  # 10 ** 10 ** 10 would take the process down


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: The expression, e.g. "(12 + 7) * 3 / 4".
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {_MAX_EXPONENT})")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def calculator_tool(config: AgentConfig) -> Callable[..., Any]:
    return calculator


MODEL_PROGRAM_NICE = 10


def python_tool(config: AgentConfig) -> Callable[..., Any]:
    sandbox = config.sandbox
    limits = Limits(
        wall_s=sandbox.wall_s,
        cpu_s=sandbox.cpu_s,
        memory_mb=sandbox.memory_mb,
        processes=sandbox.processes,
        disk_mb=sandbox.disk_mb,
        # below the rollout worker's own priority: a model's program that spins must not take the host's cores from
        # the engine loop it runs beside (on one GPU the rollout's pace is that loop's, docs/benchmarks.md)
        nice=MODEL_PROGRAM_NICE,
    )

    def python(code: str) -> str:
        """Run a Python program in a sandbox (no network, limited time and memory) and return what it prints.

        Args:
            code: The program's source code; print() what you want to see.
        """
        result = run_python(code, limits)
        parts = [result.stdout.rstrip(), result.stderr.rstrip(), "" if result.ok else f"[{result.describe()}]"]
        return "\n".join(part for part in parts if part) or "(the program printed nothing)"

    return python
