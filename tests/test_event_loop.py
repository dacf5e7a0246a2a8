"""rlkit.core.rollout.event_loop: coroutines run on a loop in a thread of its own, and never wait forever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlkit.core.rollout.event_loop import EventLoop

ROOT = Path(__file__).resolve().parent.parent

# An engine that closes itself when collected, as the async vLLM engine does, held by a module global: the interpreter
# collects it while it exits, when the loop's daemon thread no longer runs. A bench script that never closed its
# streamed replicas hung there (2026-12-06, on a CPU: vLLM's processes ended, the script never did).
LEFT_OPEN = """
from rlkit.core.rollout.event_loop import EventLoop

async def value(x):
    return x

class Engine:
    def __init__(self):
        self.events = EventLoop("engine-loop")

    def __del__(self):
        try:
            self.events.run(value(1))
        except RuntimeError as error:
            print("refused:", error, flush=True)

engine = Engine()
print("ran:", engine.events.run(value(7)), flush=True)
"""


async def _double(x: int) -> int:
    return 2 * x


def test_a_coroutine_runs_on_the_loops_thread_and_its_result_comes_back() -> None:
    events = EventLoop("test-loop")
    try:
        assert events.run(_double(21)) == 42
    finally:
        events.close()
    assert not events.thread.is_alive()


def test_asked_to_run_while_the_interpreter_exits_it_refuses_instead_of_hanging() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", LEFT_OPEN], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "ran: 7", "refused: the interpreter is exiting: the event loop 'engine-loop' no longer runs"]
