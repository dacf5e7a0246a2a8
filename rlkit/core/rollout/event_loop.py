"""An asyncio event loop in a thread of its own, for code that is called synchronously (a Ray actor's method,
the in-process workers, a notebook's cell that already runs a loop) and runs coroutines: the async vLLM
engine's client (rlkit.core.rollout.vllm_async) and the agent loop's episodes (rlkit.core.agents.turns)."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class EventLoop:
    """A loop running in a daemon thread; `run` waits in the calling thread for a coroutine's result."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if sys.is_finalizing():
            # The interpreter's exit (an engine collected then, by its finalizer): daemon threads no longer run, so
            # the result would never come and the process would hang instead of ending.
            coroutine.close()
            raise RuntimeError(f"the interpreter is exiting: the event loop {self.thread.name!r} no longer runs")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        """Stop the loop; its thread ends (joined unless this is that thread: a finalizer may run there)."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self.thread:
                self.thread.join(timeout=10)
