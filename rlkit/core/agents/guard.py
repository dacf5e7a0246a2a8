"""Calls into user code (environments, tools) with a deadline: a failure is an outcome, never a crash.

Every call of a batch starts at once, each in a daemon thread of its own (sync code) or on one
background event loop (async code), so calls neither wait for each other nor for a free
pool slot. A thread whose call returned waits a while for the next call (_SpareThreads): starting
a thread costs a hand-over of the GIL, which on a busy machine took ~5 ms each, 0.3 s of each step of
the agent demo's 64 episodes. A call past its deadline is abandoned: its result, should it ever come, is
dropped. Python cannot kill a thread, so a sync call that never returns keeps its thread;
an async call is cancelled. Code that can spin forever belongs in the sandbox
(rlkit.core.sandbox.process), which kills a whole process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

# Extra seconds the caller waits beyond the deadline for async code that blocks the event loop
# (and so cannot be timed out from inside it).
_GRACE_S = 1.0
# How long a thread whose call returned waits for another call before it exits.
_SPARE_IDLE_S = 60.0


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # the exception's traceback, or why the call timed out
    exception: BaseException | None = None  # what the call raised, for a caller that tells kinds apart


class Guard:
    """Runs batches of user calls, each with `timeout_s` seconds; `what` names the setting in messages."""

    def __init__(self, timeout_s: float, what: str = "rollout.agent.call_timeout_s") -> None:
        self.timeout_s, self.what = timeout_s, what
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        return self.call_all([(fn, args)])[0]

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Start fn(*args) with its deadline; the future's result is its Outcome."""
        return asyncio.run_coroutine_threadsafe(self._guarded(fn, args), self._event_loop())

    async def call_async(self, fn: Callable[..., Any], *args: Any) -> Outcome:
        """fn(*args) with its deadline, awaited from another event loop (an agent episode's, which runs beside
        the others: rlkit.core.agents.loop).

        A sync function runs in a spare thread awaited on the caller's own loop: two hand-offs between threads
        instead of four through the guard's loop, which for 512 episodes of 3 turns were 0.6 of the agent loop's
        1.0 s of host time a rollout on 2 cores (docs/agents.md). Async code, and what a sync function returns
        that is awaitable, run on the guard's loop, where code that never yields cannot block the caller's."""
        if not inspect.iscoroutinefunction(fn):
            outcome = await self._guarded(fn, args, await_result=False)
            if not isinstance(outcome.value, _Awaitable):
                return outcome
            fn, args = _awaited, (outcome.value.awaitable,)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(fn, *args)), self.timeout_s + _GRACE_S)
        except asyncio.TimeoutError:  # the guard's event loop is blocked by async code that does not yield
            return Outcome(error=self._timeout_message())

    def call_all(self, calls: list[tuple[Callable[..., Any], tuple]]) -> list[Outcome]:
        """Run every call concurrently; each outcome holds its value or its error."""
        if not calls:
            return []
        futures = [self.submit(fn, *args) for fn, args in calls]
        concurrent.futures.wait(futures, timeout=self.timeout_s + _GRACE_S)
        outcomes = []
        for future in futures:
            if future.done() and not future.cancelled():
                outcomes.append(future.result())
            else:  # the event loop is blocked by async code that does not yield
                future.cancel()
                outcomes.append(Outcome(error=self._timeout_message()))
        return outcomes

    async def _guarded(self, fn: Callable[..., Any], args: tuple, await_result: bool = True) -> Outcome:
        task = asyncio.ensure_future(self._invoke(fn, args, await_result))
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            task.cancel()
            return Outcome(error=self._timeout_message())
        error = task.exception()  # user code may raise anything: it costs one call
        if error is not None:
            return Outcome(error="".join(traceback.format_exception(error)).rstrip(), exception=error)
        return Outcome(value=task.result())

    async def _invoke(self, fn: Callable[..., Any], args: tuple, await_result: bool = True) -> Any:
        """fn(*args)'s value; an awaitable that a sync function returned is awaited too, or with
        `await_result=False` handed back as an `_Awaitable` (for the guard's loop to await)."""
        try:
            if inspect.iscoroutinefunction(fn):
                return await fn(*args)
            result = await _in_thread(fn, args)
            if not inspect.isawaitable(result):
                return result
            return await result if await_result else _Awaitable(result)
        except (KeyboardInterrupt, SystemExit, StopIteration) as exc:  # would stop the event loop itself
            raise RuntimeError(f"the call raised {type(exc).__name__}({exc})") from exc

    def _timeout_message(self) -> str:
        return f"TimeoutError: did not return within {self.timeout_s:g} s ({self.what})"

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="rlkit-agent-calls", daemon=True).start()
        return self._loop


@dataclass
class _Awaitable:
    """What a sync user function returned that is awaitable (a coroutine made by a plain function)."""

    awaitable: Any


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class _SpareThreads:
    """Daemon threads for sync user calls: a call goes to a thread that is waiting for work, or to a new
    one when none is. A call never waits for a busy thread, so a hung call holds up nothing but its own
    thread (which it keeps, as before: Python cannot kill a thread)."""

    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._waiting: list[queue.SimpleQueue] = []  # the inbox of each thread waiting for a call

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._waiting.pop() if self._waiting else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="rlkit-user-call", daemon=True).start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            try:
                job = inbox.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._waiting:  # nobody took this thread meanwhile: it exits
                        self._waiting.remove(inbox)
                        return
                job = inbox.get()  # taken just now: the call is on its way
            job()
            with self._lock:
                self._waiting.append(inbox)


_threads = _SpareThreads(_SPARE_IDLE_S)


def _in_thread(fn: Callable[..., Any], args: tuple) -> asyncio.Future:
    """fn(*args) in a thread of its own; the future resolves with its result unless cancelled first."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile: the late result is dropped
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as the call's outcome
            if isinstance(exc, StopIteration):  # a future cannot hold it
                exc = RuntimeError(f"the call raised StopIteration({exc})")
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    _threads.run(target)
    return future
