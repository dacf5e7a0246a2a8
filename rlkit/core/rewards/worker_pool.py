"""The process pool that runs reward calls: one call at a time per worker, each under a deadline.

A worker is a `python -c` child; a call that outlives the deadline has its worker killed and
replaced while the others go on. A call's return value is checked here, in the worker: a score
that is not a finite number within +-MAX_ABS_SCORE is invalid (rlkit.core.rewards.scoring says
what the scorer does with failed and invalid rows).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from rlkit.errors import UserError

MAX_ABS_SCORE = 1e6  # a larger score is a bug or a forgery: in float32 advantages its square overflows
STARTUP_TIMEOUT_S = 120.0
# A dict reward may say why its score is low in words ({"score": 0.0, "reason": "timeout: ..."}): not a number, so not
# logged as reward/<key>; `rlkit eval-reward` shows it per row. The text up to its first ": " is its kind.
REASON_KEY = "reason"
MAX_REASON_CHARS = 500
# fn(data_source, response, ground_truth, extra_info) -> float | dict
Call = tuple[Callable[..., Any], tuple[str, str, str, dict[str, Any]]]


class RewardError(UserError):
    """A reward call failed; the message names the row, data_source, function and error."""


@dataclass
class Outcome:
    score: float | None
    details: dict[str, float]
    error: str | None
    seconds: float
    invalid: str | None = None  # why the return value is not a usable score
    reason: str | None = None  # the reward's own word on its score (a dict's "reason" key): why it is low


class _Invalid(ValueError):
    """A return value that is not a usable score."""


def _number(value: Any, what: str, limit: float = math.inf) -> float:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise _Invalid(f"{what} is {value!r:.80} ({type(value).__name__}), not a number")
    try:
        number = float(value)
    except Exception as exc:  # noqa: BLE001 - an int too large for a float, or a __float__ that fails
        raise _Invalid(f"{what} is not a float ({type(exc).__name__}: {exc})") from None
    if not math.isfinite(number):
        raise _Invalid(f"{what} is {number}, not a finite number")
    if abs(number) > limit:
        raise _Invalid(f"{what} is {number:g}, beyond +-{limit:g}")
    return number


def _normalize(result: Any) -> tuple[float, dict[str, float], str | None]:
    """(score, the dict's other numbers, its "reason" text) of a return value."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"returned a dict without a 'score' key (keys: {sorted(map(str, result))})")
        reason = result.get(REASON_KEY)
        if reason is not None and not isinstance(reason, str):
            raise _Invalid(f"key {REASON_KEY!r} is {reason!r:.80} ({type(reason).__name__}), not a string")
        numbers = {k: v for k, v in result.items() if k not in ("score", REASON_KEY)}
        details = {str(k): _number(v, f"key {k!r}") for k, v in numbers.items()}
        return _number(result["score"], "'score'", MAX_ABS_SCORE), details, reason and reason[:MAX_REASON_CHARS]
    return _number(result, "the return value", MAX_ABS_SCORE), {}, None


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _run(call: Call) -> Outcome:
    fn, args = call
    start = time.perf_counter()
    try:
        result = fn(*args)
    except Exception as exc:
        return Outcome(None, {}, _describe(exc), time.perf_counter() - start)
    seconds = time.perf_counter() - start
    try:
        score, details, reason = _normalize(result)
        return Outcome(score, details, None, seconds, reason=reason)
    except _Invalid as exc:
        return Outcome(None, {}, None, seconds, invalid=str(exc))
    except ValueError as exc:  # the function's shape, which no response changes: a bug to stop on
        return Outcome(None, {}, f"bad return value: {exc}", seconds)


def _worker_main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    conn = Connection(fd)
    conn.send("ready")
    while True:
        try:
            call = pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionError):  # the controller is gone
            return
        except Exception as exc:  # the function cannot be imported here
            conn.send(Outcome(None, {}, f"cannot load the function in a reward worker: {_describe(exc)}", 0.0))
            continue
        if call is None:
            return
        conn.send(_run(call))


class _Worker:
    """A `python -c` child on one end of a socket pair. Not multiprocessing: that re-imports the
    caller's __main__ script in every child (and fails without an `if __name__` guard)."""

    def __init__(self) -> None:
        parent, child = socket.socketpair()
        command = f"from rlkit.core.rewards.worker_pool import _worker_main; _worker_main({child.fileno()})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", command], pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.ready = False
        self.spawned = time.monotonic()
        self.row: int | None = None  # the row it is scoring
        self.started = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class Feed:
    """Reward calls that arrive while the pool scores: another thread `put`s each row's (call, function name),
    or an item `prepare` turns into them in the pool's thread, then `close`s it. The pool waits on its socket
    (`fileno`) beside the workers' connections, so a row is dispatched the moment it arrives."""

    def __init__(self, prepare: Callable[[int, Any], tuple[Call, str]] | None = None) -> None:
        self.prepare = prepare
        self.items: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)  # a full buffer already wakes the pool: a put never blocks on it
        self.closed = False  # the pool's view: the closing mark was taken

    def put(self, row: int, item: Any) -> None:
        self.items.put((row, item))
        self._wake()

    def close(self) -> None:
        self.items.put(None)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # OSError: the pool already took the closing mark
            self._wake_write.send(b"\0")

    def fileno(self) -> int:
        return self._wake_read.fileno()

    def take(self) -> list[tuple[int, tuple[Call, str]]]:
        """The rows put since the last take, prepared (in the calling thread)."""
        if self.closed:
            return []
        with contextlib.suppress(BlockingIOError):
            while self._wake_read.recv(4096):
                pass
        taken = []
        while not self.items.empty():
            entry = self.items.get()
            if entry is None:
                self.closed = True
                self._wake_read.close()
                self._wake_write.close()
                break
            row, item = entry
            taken.append((row, self.prepare(row, item) if self.prepare else item))
        return taken


class WorkerPool:
    """Worker processes that each score one call at a time; hung or dead ones are replaced.

    Rows go to whichever worker is free, so hung calls on different workers time out at the
    same time, and a replacement starts while the other workers go on scoring.
    """

    def __init__(self, size: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.workers = [_Worker() for _ in range(size)]

    def run(self, calls: list[Call], names: list[str], *, stop_on_error: bool) -> list[Outcome | None]:
        """One outcome per call; with `stop_on_error`, the first failure stops the batch (the
        rows not scored by then stay None)."""
        feed = Feed()
        for row, (call, name) in enumerate(zip(calls, names, strict=True)):
            feed.put(row, (call, name))
        feed.close()
        return self.run_feed(feed, len(calls), stop_on_error=stop_on_error)

    def run_feed(self, feed: Feed, size: int, *, stop_on_error: bool) -> list[Outcome | None]:
        """Rows 0..size-1 scored as `feed` brings them (from another thread, while they are still being made);
        returns when the feed is closed and every row it brought has an outcome, or at the first failure with
        `stop_on_error`."""
        try:
            return self._run(feed, size, stop_on_error)
        finally:  # Ctrl-C, a call that cannot be sent, or an early stop: drop calls still running
            for i, worker in enumerate(self.workers):
                if worker.row is not None:
                    self._replace(i)

    def _run(self, feed: Feed, size: int, stop_on_error: bool) -> list[Outcome | None]:
        outcomes: list[Outcome | None] = [None] * size
        todo: deque[int] = deque()
        calls: dict[int, tuple[Call, str]] = {}
        while True:
            for row, call in feed.take():
                todo.append(row)
                calls[row] = call
            self._dispatch(todo, calls)
            busy = {w.conn: w for w in self.workers if not w.ready or w.row is not None}
            if feed.closed and not todo and not any(w.row is not None for w in busy.values()):
                return outcomes
            now = time.monotonic()
            ends = [
                w.started + self.timeout_s if w.row is not None else w.spawned + STARTUP_TIMEOUT_S
                for w in busy.values()
            ]
            timeout = max(0.0, min(ends) - now) if ends else None
            for ready in wait([*busy, *([] if feed.closed else [feed])], timeout=timeout):
                if ready is not feed:
                    self._receive(busy[ready], outcomes)  # type: ignore[index]
            self._enforce_deadlines(outcomes)
            if stop_on_error and any(o is not None and o.error is not None for o in outcomes):
                return outcomes

    def _dispatch(self, todo: deque[int], calls: dict[int, tuple[Call, str]]) -> None:
        for worker in self.workers:
            if worker.ready and worker.row is None and todo:
                row = todo.popleft()
                call, name = calls.pop(row)
                try:
                    worker.conn.send(call)
                except Exception as exc:
                    raise RewardError(
                        f"reward function {name} cannot be sent to the reward worker processes "
                        f"({_describe(exc)}); define it at module level of an importable file"
                    ) from exc
                worker.row, worker.started = row, time.monotonic()

    def _enforce_deadlines(self, outcomes: list[Outcome | None]) -> None:
        """Kill and replace workers whose call outlived reward.timeout_s; a worker that never
        started is a broken environment, not a slow reward."""
        now = time.monotonic()
        for i, worker in enumerate(self.workers):
            if worker.row is not None and now - worker.started > self.timeout_s:
                outcomes[worker.row] = Outcome(
                    None,
                    {},
                    f"timed out after {self.timeout_s:g} s (reward.timeout_s); its worker was "
                    "killed (raise reward.timeout_s if the function is only slow)",
                    now - worker.started,
                )
                self._replace(i)
            elif not worker.ready and now - worker.spawned > STARTUP_TIMEOUT_S:
                raise RewardError(
                    f"a reward worker process (pid {worker.process.pid}) did not start within "
                    f"{STARTUP_TIMEOUT_S:.0f} s: the machine is overloaded or `{sys.executable} -c "
                    "'import rlkit.core.rewards.worker_pool'` hangs there"
                )

    def _receive(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            code = worker.process.wait()
            if worker.row is None:
                raise RewardError(
                    f"a reward worker process exited while starting (exit code {code}); "
                    f"`{sys.executable} -c 'import rlkit.core.rewards.worker_pool'` shows why"
                ) from None
            outcomes[worker.row] = Outcome(None, {}, f"the reward worker process died (exit code {code})", 0.0)
            self._replace(self.workers.index(worker))
            return
        if message == "ready":
            worker.ready = True
        else:
            outcomes[worker.row] = message  # type: ignore[index]
            worker.row = None

    def _replace(self, i: int) -> None:
        self.workers[i].kill()
        self.workers[i] = _Worker()

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=1.0)  # a clean exit first; kill() reaps either way
            worker.kill()
        self.workers = []
