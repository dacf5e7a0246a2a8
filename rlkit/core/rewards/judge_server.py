"""The judge's side of the code reward: runs inside the judge's own sandbox, never imported by rlkit.

rlkit.core.rewards.code copies this file in as the sandbox's program.py, next to prompt.py (the
problem's prompt: its imports and helper functions, such as HumanEval's `poly` or `encode_cyclic`,
which the tests use), tests.py (the data set's `check(candidate)`) and plain_data.py, and calls
`serve(entry_point)`. Only trusted code runs here; the candidate's program runs in another sandbox,
and its answers arrive as plain data. One line each way:
  first line out:  {"ready": true, "tests": [bool, ...]}  (per statement of check's body: holds an assert)
  in:  {"run": i}   out, when statement i has run:  {"done": i, "ok": bool, "error": "why it failed" (when not ok)}
  while statement i runs, for each call of `candidate`:
      out: {"call": {"args": <plain list>, "kwargs": <plain dict>}}
      in:  {"value": <plain>}, {"raised": "ExceptionName"} or {"failed": "why"}
"""

import ast
import builtins
import os

import plain_data


class CandidateFailed(BaseException):
    """The candidate gave no answer (too slow, dead, or off the protocol). A BaseException, so that
    a test's own `except Exception` cannot turn a missing answer into a pass."""


class CandidateRaised(Exception):
    """The candidate raised an exception that is not one of Python's builtin ones."""


def _raised(name: object) -> Exception:
    """The builtin exception the candidate says it raised (tests may expect one), else CandidateRaised."""
    kind = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind("raised by the candidate")
        except TypeError:  # one whose constructor needs more arguments (UnicodeDecodeError)
            pass
    return CandidateRaised(str(name)[:100])


def serve(entry_point: str) -> None:
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # the tests' own prints, if any, go to stderr

    def send(message: dict) -> None:
        replies.write(plain_data.dumps(message))
        replies.flush()

    def candidate(*args: object, **kwargs: object) -> object:
        send({"call": {"args": plain_data.encode(list(args)), "kwargs": plain_data.encode(kwargs)}})
        reply = plain_data.loads(requests.readline())
        if "value" in reply:
            return plain_data.decode(reply["value"])
        if "raised" in reply:
            raise _raised(reply["raised"])
        raise CandidateFailed(reply.get("failed"))

    scope = {"__name__": "judge"}
    with open("prompt.py") as source:
        exec(compile(source.read(), "prompt.py", "exec"), scope)
    with open("tests.py") as source:
        tree = ast.parse(source.read())
    check = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check")
    exec(compile(ast.Module([s for s in tree.body if s is not check], []), "tests.py", "exec"), scope)
    scope["candidate"] = scope[entry_point] = candidate  # as in HumanEval, where the tests see the program's names
    send({"ready": True, "tests": [any(isinstance(n, ast.Assert) for n in ast.walk(s)) for s in check.body]})
    for line in requests:
        index = plain_data.loads(line)["run"]
        statement = check.body[index]
        try:
            exec(compile(ast.Module([statement], []), "tests.py", "exec"), scope)
            send({"done": index, "ok": True})
        except BaseException as exc:  # noqa: BLE001 - a failed assert, an error, or a candidate without an answer
            send({"done": index, "ok": False, "error": _failure(exc, statement)})


def _failure(exc: BaseException, statement: ast.stmt) -> str:
    """A failed statement in words: the exception, and for a bare assert the assert's source."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, AssertionError) and not str(exc):
        failed = next((n for n in ast.walk(statement) if isinstance(n, ast.Assert)), statement)
        text += f" ({ast.unparse(failed)})"
    return text[:300]
