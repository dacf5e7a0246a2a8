"""Code rewards: the share of a problem's unit tests a response's program passes, judged where the program
cannot reach.

HumanEval's tests are one `check(candidate)` function of asserts. Each top-level statement of its
body that holds an assert is one test (a `for` loop of asserts is one test); statements without one
(imports, setup) run in order too, and when one fails the remaining tests cannot run. The score is
passed / total.

The program is the problem's prompt (its imports and helper functions, and the stub) followed by the
response: a whole function (a ```python block, or plain code that defines the entry point) replaces
the stub; anything else is read as the stub's body, HumanEval's completion format. An empty
response scores 0.

Two processes, each in a sandbox of its own (rlkit.core.sandbox.process), with this reward worker
between them:
- the candidate (candidate_server.py): the program, and a small server that reads a call's arguments
  as one line of plain data, calls the entry point and writes its result (or the exception's type
  name) as one line. Nothing in it is trusted; the program may replace the server.
- the judge (judge_server.py): the data set's tests and the prompt's helper functions (which
  HumanEval's tests use: `poly`, `encode_cyclic`), with `candidate` bound to a proxy that asks for
  each call through this process and decodes the answer (rlkit.core.rewards.plain_data).
So no object of the candidate's (an always-equal `__eq__`, a patched builtin, a frame, an exit code,
a printed line) reaches a comparison: the tests compare plain values they decoded themselves, and
no secret exists for the candidate to read. The candidate can only answer each call, one line, in
turn: a line out of turn, one that does not decode or is over plain_data.MAX_LINE_BYTES, no answer
by the test's deadline (PER_TEST_S), or a dead candidate fails that call, and the candidate is
killed and started afresh for the next call, so one hang does not fail every later test. The
judge gets a sandbox of its own rather than running here because it computes on the candidate's
values (a test may build a string or loop on what the candidate returned): in a sandbox that is
bounded by its limits, and a judge that hangs or dies fails its test and is restarted, where here it
would take the reward worker (and with reward.on_error=raise, the run) with it. It also keeps the
data set's code off the host as before. Every wait ends by the row's budget, `limits.wall_s` (the
judge's by _JUDGE_GRACE_S more), and both sandboxes are killed when the row is scored. The candidate
runs at a lower CPU priority than the judge (CANDIDATE_NICE), so its spinning cannot starve the judge. The reward
declares its range, [0, 1], so the scorer clamps it (rlkit.core.rewards.scoring).

A score below 1 comes with a "reason" (worker_pool.REASON_KEY; `rlkit eval-reward` shows it per row):
the first failed test and why, "KIND: WHERE: DETAIL", KIND one of empty response, does not run (the
program raised while loading), timeout (no answer by the deadline), memory limit (MemoryError: the
address-space limit), output limit (a write over limits.output_bytes fails, or an answer line is too
long), cpu limit, signal (killed by one), exit (the program exited), exception (a call raised), test
failed (an assert or the test's own error, as the judge reports it). The candidate's words in it are
display only: no score reads them.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlkit.core.rewards import plain_data
from rlkit.core.rewards.registry import score_range
from rlkit.core.sandbox.process import Limits, SandboxedProcess, start_python

HUMANEVAL = "openai/humaneval"
PER_TEST_S = 3.0  # each statement of `check`, the candidate's calls included
LIMITS = Limits(wall_s=8.0, cpu_s=8, memory_mb=1024)  # wall_s: the whole row, below reward.timeout_s (10 s)
# The candidate runs 10 nice values below the judge: a program that spins while loading (or in a call) cannot starve
# the judge's start on a busy host into a row error ("the tests do not run"); it only runs slower itself.
CANDIDATE_NICE = 10
_JUDGE_GRACE_S = 0.5  # how long the judge may take to report a test after the candidate's deadline
_EXIT_GRACE_S = 0.5  # how long a candidate that stopped answering may take to exit, for its exit status
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_HERE = Path(__file__).parent
_SOURCES = {name: (_HERE / name).read_text() for name in ("candidate_server.py", "judge_server.py", "plain_data.py")}


Reason = tuple[str, str]  # (kind, detail)


def _exception_kind(name: str, message: str) -> str:
    """The reason's kind of an exception the program raised: a sandbox limit shows up as one."""
    if name == "MemoryError":
        return "memory limit"
    if name == "OSError" and "File too large" in message:  # RLIMIT_FSIZE: Python ignores SIGXFSZ, the write fails
        return "output limit"
    return "exception"


class _NoAnswer(Exception):
    """A sandboxed program did not give the next line in time, or gave one that is not a protocol line."""

    def __init__(self, why: str, late: bool = False) -> None:
        super().__init__(why)
        self.late = late


class _Channel:
    """One sandboxed program's stdin and stdout as protocol lines, each wait bounded by a deadline."""

    def __init__(self, program: SandboxedProcess) -> None:
        self.program = program
        self._in, self._out = program.stdin.fileno(), program.stdout.fileno()
        os.set_blocking(self._in, False)
        self._buffer = b""

    def send(self, message: dict[str, Any], deadline: float) -> None:
        data = memoryview(plain_data.dumps(message))
        while data:
            if not select.select([], [self._in], [], max(0.0, deadline - time.monotonic()))[1]:
                raise _NoAnswer("it stopped reading its input", late=True)
            try:
                data = data[os.write(self._in, data) :]
            except BlockingIOError:
                continue
            except OSError:
                raise _NoAnswer("it ended") from None

    def receive(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            if len(self._buffer) > plain_data.MAX_LINE_BYTES:
                raise _NoAnswer(f"a line over {plain_data.MAX_LINE_BYTES} bytes")
            if not select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise _NoAnswer("no answer in time", late=True)
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                raise _NoAnswer("it ended" + (" with a partial line" if self._buffer else ""))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return plain_data.loads(line)
        except plain_data.NotPlain as exc:
            raise _NoAnswer(str(exc)) from None


class _Trial:
    """One program against one problem's tests: the two sandboxes and the calls between them."""

    def __init__(self, program: str, prompt: str, tests: str, entry_point: str, limits: Limits) -> None:
        self.limits, self.end = limits, time.monotonic() + limits.wall_s
        serve = f"\nserve({entry_point!r})\n"
        self._candidate_source = (
            _SOURCES["candidate_server.py"] + serve,
            replace(limits, nice=limits.nice + CANDIDATE_NICE),
            {"solution.py": program, "plain_data.py": _SOURCES["plain_data.py"]},
        )
        self._judge_source = (
            _SOURCES["judge_server.py"] + serve,
            limits,
            {"prompt.py": prompt, "tests.py": tests, "plain_data.py": _SOURCES["plain_data.py"]},
        )
        self.candidate: _Channel | None = None
        self.judge: _Channel | None = None
        self.statements: list[bool] = []  # per statement of check's body: is it a test
        self.calls = self.restarts = 0
        self.late = False  # the current statement's candidate call ran out of time
        self.call_failure: Reason | None = None  # the current statement's candidate call gave no answer: why
        self.raised: tuple[str, str] | None = None  # ... or raised: (exception name, message)

    def run(self) -> dict[str, float | str]:
        self.candidate = _Channel(start_python(*self._candidate_source))
        self._start_judge()
        failed_start = self._start_failure(self.candidate, min(time.monotonic() + PER_TEST_S, self.end))
        if failed_start is not None:
            kind, detail = failed_start
            result = {"score": 0.0, "passed": 0.0, "tests": float(sum(self.statements)), "runs": 0.0}
            return {**result, "timed_out": 0.0, "reason": f"{kind}: loading the program: {detail}"}
        passed = timed_out = 0
        first_failure: str | None = None
        for index, is_test in enumerate(self.statements):
            if time.monotonic() < self.end:
                ok, late, failure = self._statement(index)
            else:
                ok, late, failure = False, True, ("timeout", f"the row's {self.limits.wall_s:g} s ran out")
            passed += ok and is_test
            timed_out += late and is_test and not ok
            if not ok and first_failure is None:
                where = f"test {sum(self.statements[: index + 1])}" if is_test else "a setup statement of the tests"
                first_failure = f"{failure[0]}: {where}: {failure[1]}"
            if not ok and not is_test:
                break  # setup failed: the remaining tests cannot run
        total = sum(self.statements)
        result: dict[str, float | str] = {
            "score": passed / max(total, 1),
            "passed": float(passed),
            "tests": float(total),
            "runs": 1.0,
            "timed_out": float(timed_out),
        }
        if first_failure is not None:
            result["reason"] = first_failure + (f" ({total - passed} of {total} tests failed)" if total > 1 else "")
        return result

    def close(self) -> None:
        for channel in (self.candidate, self.judge):
            if channel is not None:
                channel.program.close()

    def _start_judge(self) -> None:
        """Start the judge (its startup runs only trusted code: failing there is the data's or the machine's fault)."""
        self.judge = _Channel(start_python(*self._judge_source))
        try:
            ready = self.judge.receive(self.end)
            self.statements = [bool(is_test) for is_test in ready["tests"]]
        except (_NoAnswer, KeyError, TypeError) as exc:
            result = self.judge.program.finish()
            raise RuntimeError(f"the tests do not run ({exc}): {result.stderr.strip()[-500:]}") from None

    def _start_failure(self, candidate: _Channel, deadline: float) -> Reason | None:
        """None when the candidate loaded its program and serves calls; else why not."""
        try:
            ready = candidate.receive(deadline)
        except _NoAnswer as exc:
            return _no_answer_reason(candidate, exc)
        if ready.get("ready") is True:
            return None
        error = str(ready.get("error"))[:300]
        kind = _exception_kind(error.partition(":")[0], error)
        return ("does not run" if kind == "exception" else kind), error

    def _statement(self, index: int) -> tuple[bool, bool, Reason]:
        """(passed, ran out of time, why it failed) for statement `index` of check's body."""
        deadline = min(time.monotonic() + PER_TEST_S, self.end)
        self.late, self.call_failure, self.raised = False, None, None
        try:
            if self.judge is None:  # the last statement killed it: a fresh one, its setup statements run again
                self._start_judge()
                for setup in (i for i in range(index) if not self.statements[i]):
                    self._judge_runs(setup, deadline)
            ok, error = self._judge_runs(index, deadline)
            return ok, self.late, self._failure(error)
        except _NoAnswer as exc:
            if self.judge is not None:
                self.judge.program.close()
                self.judge = None
            late = self.late or exc.late
            return False, late, self._failure(f"the tests gave no verdict in time ({exc})" if late else str(exc))

    def _failure(self, judge_error: str | None) -> Reason:
        """Why the current statement failed: the candidate's missing answer or exception, else the judge's word."""
        if self.call_failure is not None:
            return self.call_failure
        if self.raised is not None:
            name, message = self.raised
            return _exception_kind(name, message), f"the program raised {name}" + (f": {message}" if message else "")
        return "test failed", judge_error or "the tests failed"

    def _judge_runs(self, index: int, deadline: float) -> tuple[bool, str | None]:
        """Whether statement `index` passed, and the judge's words on its failure."""
        assert self.judge is not None
        self.judge.send({"run": index}, deadline + _JUDGE_GRACE_S)
        while True:
            message = self.judge.receive(deadline + _JUDGE_GRACE_S)
            if "call" in message:
                self.judge.send(self._call(message["call"], deadline), deadline + _JUDGE_GRACE_S)
            elif message.get("done") == index:
                error = message.get("error")
                return message.get("ok") is True, error if isinstance(error, str) else None
            else:
                raise _NoAnswer(f"the judge said {str(message)[:80]}")

    def _call(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        """The candidate's answer to one call, as the judge's proxy reads it."""
        self.calls += 1
        try:
            if self.candidate is None:  # the last call killed it
                self.restarts += 1
                self.candidate = _Channel(start_python(*self._candidate_source))
                failed_start = self._start_failure(self.candidate, deadline)
                if failed_start is not None:
                    self.call_failure = failed_start[0], f"restarting the program: {failed_start[1]}"
                    raise _NoAnswer("it did not start again", late=time.monotonic() >= deadline)
            self.candidate.send({"id": self.calls, **request}, deadline)
            reply = self.candidate.receive(deadline)
            if reply.get("id") != self.calls:
                raise _NoAnswer("a line out of turn")
            if "value" in reply:
                return {"value": reply["value"]}
            if isinstance(reply.get("raised"), str):
                message = reply.get("message")
                self.raised = reply["raised"][:100], message[:200] if isinstance(message, str) else ""
                return {"raised": reply["raised"][:100]}
            raise _NoAnswer("neither a value nor an exception")
        except _NoAnswer as exc:
            self.late = self.late or exc.late
            if self.candidate is not None:
                self.call_failure = self.call_failure or _no_answer_reason(self.candidate, exc)
                self.candidate.program.close()
                self.candidate = None
            return {"failed": str(exc)}


def _no_answer_reason(channel: _Channel, exc: _NoAnswer) -> Reason:
    """Why a sandboxed program gave no answer: our deadline, the sandbox's kill cause, or its own end."""
    if exc.late:
        return "timeout", f"no answer within {PER_TEST_S:g} s"
    if "a line over" in str(exc):
        return "output limit", f"an answer line over {plain_data.MAX_LINE_BYTES} bytes"
    try:  # a program that ended has its exit status at once; one that only closed its output has none
        channel.program.process.wait(timeout=_EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
        return "exception", f"the program broke the call protocol ({exc})"
    ended = channel.program.finish()
    return ended.kind, f"the program ended: {ended.describe()}"


def program_for(response: str, prompt: str, entry_point: str) -> str | None:
    """The program to test, or None for an empty response."""
    if not response.strip():
        return None
    blocks = _FENCE.findall(response)
    code = next((b for b in blocks if f"def {entry_point}" in b), blocks[0] if blocks else response)
    if re.search(rf"^def {re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return f"{prompt}\n\n{code}"  # a whole function: it replaces the prompt's stub
    return prompt + response  # HumanEval's completion format: the stub's body


def run_tests(
    program: str, prompt: str, tests: str, entry_point: str, limits: Limits = LIMITS
) -> dict[str, float | str]:
    """Judge `program` by `tests` (a `check(candidate)` function, with `prompt`'s helper functions in scope):
    score (passed / tests), passed, tests, runs (1 when the program loaded and defined the entry point),
    timed_out (tests failed by a deadline), and below a full score the reason (the first failure)."""
    trial = _Trial(program, prompt, tests, entry_point, limits)
    try:
        return trial.run()
    finally:
        trial.close()


@score_range(0.0, 1.0)
def humaneval_reward(response: str, ground_truth: str, extra_info: dict[str, Any]) -> dict[str, float | str]:
    """Share of the problem's tests passed; ground_truth holds its `check` function, extra_info
    its `prompt` and `entry_point` (`rlkit prep-data humaneval`)."""
    prompt, entry_point = extra_info["prompt"], extra_info["entry_point"]
    program = program_for(response, prompt, entry_point)
    if program is None:
        result = {"score": 0.0, "passed": 0.0, "tests": 0.0, "runs": 0.0, "timed_out": 0.0}
        return {**result, "reason": "empty response: no code to run"}
    return run_tests(program, prompt, ground_truth, entry_point)
