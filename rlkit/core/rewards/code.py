"""Code rewards: the share of a problem's unit tests a response's program passes, run in the sandbox.

HumanEval's tests are one `check(candidate)` function of asserts. Each top-level statement of
its body that holds an assert is one test (a `for` loop of asserts is one test); statements
without one (imports, setup) run first in order. Tests run one by one, each with its own
time limit, so a solution that fails or hangs on one test still gets the others counted.

The program is the problem's prompt (its imports and helper functions, and the stub) followed
by the response: a whole function (a ```python block, or plain code that defines the entry
point) replaces the stub; anything else is read as the stub's body, HumanEval's completion
format. An empty response scores 0. The harness runs in the same process as the program it
tests, so a program written to forge its result could; this measures solutions, it does not
defend against them.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from rlkit.core.agents.sandbox import Limits, run_python
from rlkit.core.rewards.registry import REWARD_FNS

HUMANEVAL = "openai/humaneval"
PER_TEST_S = 3           # each test's own alarm
LIMITS = Limits(wall_s=8.0, cpu_s=8, memory_mb=1024)  # the whole program: below reward.timeout_s (10 s)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)

# Runs inside the sandbox: the program, then each test of `check`, reporting one JSON line.
_HARNESS = r'''
import ast, json, signal
NONCE, ENTRY, PER_TEST_S = {nonce!r}, {entry!r}, {per_test}
def report(passed, total, error=None):
    print(NONCE + json.dumps({{"passed": passed, "total": total, "error": error}}), flush=True)
tree = ast.parse(open("tests.py").read())
check = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check")
statements = [(s, any(isinstance(n, ast.Assert) for n in ast.walk(s))) for s in check.body]
total = sum(is_test for _, is_test in statements)
def on_alarm(signum, frame):
    raise TimeoutError("test took longer than %d s" % PER_TEST_S)
signal.signal(signal.SIGALRM, on_alarm)
solution = {{"__name__": "solution"}}
try:
    signal.alarm(PER_TEST_S)
    exec(compile(open("solution.py").read(), "solution.py", "exec"), solution)
    signal.alarm(0)
    candidate = solution[ENTRY]
except BaseException as exc:
    report(0, total, "the program does not run: %s: %s" % (type(exc).__name__, exc))
    raise SystemExit(0)
scope = solution  # as HumanEval runs them: the tests see the program's own functions (poly, encode_cyclic, ...)
exec(compile(ast.Module([s for s in tree.body if s is not check], []), "tests.py", "exec"), scope)
scope["candidate"] = candidate
passed = 0
for statement, is_test in statements:
    signal.alarm(PER_TEST_S)
    try:
        exec(compile(ast.Module([statement], []), "tests.py", "exec"), scope)
        passed += is_test
    except BaseException:
        if not is_test:
            break  # setup failed: the remaining tests cannot run
    finally:
        signal.alarm(0)
report(passed, total)
'''


def program_for(response: str, prompt: str, entry_point: str) -> str | None:
    """The program to test, or None for an empty response."""
    if not response.strip():
        return None
    blocks = _FENCE.findall(response)
    code = next((b for b in blocks if f"def {entry_point}" in b), blocks[0] if blocks else response)
    if re.search(rf"^def {re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return f"{prompt}\n\n{code}"  # a whole function: it replaces the prompt's stub
    return prompt + response  # HumanEval's completion format: the stub's body


def run_tests(program: str, tests: str, entry_point: str, limits: Limits = LIMITS) -> dict[str, Any]:
    """Run `tests` (a `check(candidate)` function) against `program` in the sandbox."""
    nonce = f"RLKIT-RESULT-{secrets.token_hex(8)}:"
    harness = _HARNESS.format(nonce=nonce, entry=entry_point, per_test=PER_TEST_S)
    result = run_python(harness, limits, files={"solution.py": program, "tests.py": tests})
    lines = [line for line in result.stdout.splitlines() if line.startswith(nonce)]
    if not lines:
        return {"score": 0.0, "passed": 0.0, "tests": 0.0, "sandbox_killed": 1.0}
    report = json.loads(lines[-1][len(nonce):])
    return {"score": report["passed"] / max(report["total"], 1), "passed": float(report["passed"]),
            "tests": float(report["total"]), "sandbox_killed": 0.0}


@REWARD_FNS.register(HUMANEVAL)
def humaneval_reward(response: str, ground_truth: str, extra_info: dict[str, Any]) -> dict[str, float]:
    """Share of the problem's tests passed; ground_truth holds its `check` function, extra_info
    its `prompt` and `entry_point` (`rlkit prep-data humaneval`)."""
    program = program_for(response, extra_info["prompt"], extra_info["entry_point"])
    if program is None:
        return {"score": 0.0, "passed": 0.0, "tests": 0.0, "sandbox_killed": 0.0}
    return run_tests(program, ground_truth, extra_info["entry_point"])
