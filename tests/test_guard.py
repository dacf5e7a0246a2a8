"""rlkit.core.agents.guard: user calls run concurrently in threads that are kept for the next calls."""

from __future__ import annotations

import asyncio
import threading
import time

from rlkit.core.agents import guard as guard_module
from rlkit.core.agents.guard import Guard, _SpareThreads


def test_a_batch_of_calls_runs_at_once_and_the_next_batch_reuses_the_threads(monkeypatch) -> None:
    spare = _SpareThreads(60.0)  # this test's own: the process's may hold other tests' waiting threads
    monkeypatch.setattr(guard_module, "_threads", spare)
    guard = Guard(5.0)
    started = threading.Barrier(8, timeout=5)  # all 8 calls must be running at the same time to pass it

    def call(i: int) -> tuple[int, int]:
        started.wait()
        return i, threading.get_ident()

    first = guard.call_all([(call, (i,)) for i in range(8)])
    assert [o.value[0] for o in first] == list(range(8)) and all(o.error is None for o in first)
    threads = {o.value[1] for o in first}
    assert len(threads) == 8
    started.reset()
    # A thread offers itself for the next call just after its result reached the caller: wait until all have.
    deadline = time.monotonic() + 5
    while len(spare._waiting) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    second = guard.call_all([(call, (i,)) for i in range(8)])
    assert {o.value[1] for o in second} == threads  # no new thread was started


def test_a_hung_call_keeps_its_thread_and_the_calls_after_it_run_elsewhere() -> None:
    guard = Guard(0.3)
    release, hung_thread = threading.Event(), []

    def hang() -> None:
        hung_thread.append(threading.get_ident())
        release.wait(10)

    assert "did not return within 0.3 s" in guard.call_all([(hang, ())])[0].error
    seen = guard.call_all([(threading.get_ident, ()) for _ in range(3)])
    assert all(o.error is None for o in seen) and hung_thread[0] not in {o.value for o in seen}
    release.set()


def test_a_thread_without_work_exits_after_its_idle_time() -> None:
    spare = _SpareThreads(idle_s=0.1)
    done = threading.Event()
    spare.run(done.set)
    assert done.wait(5)
    named = [t for t in threading.enumerate() if t.name == "rlkit-user-call"]
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in named) and spare._waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert spare._waiting == []  # its inbox is gone: the next call starts a new thread
    again = threading.Event()
    spare.run(again.set)
    assert again.wait(5)


def test_a_sync_call_awaited_from_an_event_loop_runs_without_the_guards_loop_and_keeps_its_deadline() -> None:
    """The agent loop's calls: a sync function's thread is awaited on the caller's loop (two thread hand-offs, not
    four); its deadline, its errors as outcomes, and what it returns that is awaitable (awaited on the guard's
    loop, where code that never yields cannot block the caller) stay as before."""
    guard = Guard(0.3)
    release = threading.Event()

    def fails() -> None:
        raise ValueError("bad action")

    async def answer() -> int:
        return 42

    async def calls() -> list:
        return [await guard.call_async(lambda x: x + 1, 1), await guard.call_async(fails),
                await guard.call_async(release.wait, 10)]

    value, failed, hung = asyncio.run(calls())
    release.set()
    assert value.value == 2 and value.error is None
    assert "ValueError: bad action" in failed.error and isinstance(failed.exception, ValueError)
    assert "did not return within 0.3 s" in hung.error
    assert guard._loop is None  # none of them needed the guard's own loop

    made_by_a_plain_function = asyncio.run(guard.call_async(lambda: answer()))
    assert made_by_a_plain_function.value == 42 and guard._loop is not None
