"""Ctrl-C and SIGTERM: the first lets the current step finish, the second stops at once.

A step is many controller -> worker calls; cutting one in half leaves the workers' weights
ahead of the data position, so it could not be checkpointed. The first signal therefore only
sets a flag the run loop reads between steps: it then saves a checkpoint (when
trainer.save_on_interrupt) and stops. A second signal raises KeyboardInterrupt wherever the
controller is, abandoning the step: a resume continues from the last complete checkpoint.
Before the first step starts (model load, engine start) there is nothing to finish, so one
signal stops at once.

Ray workers run in their own process groups with SIGINT blocked, so a terminal's Ctrl-C
reaches only the controller, which shuts them down.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from rlkit.core.cluster.failures import continue_hint

if TYPE_CHECKING:
    from rlkit.core.controller.controller import Controller
    from rlkit.core.controller.run_dir import RunDir

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """The run stopped on a signal; the message says where, and how to continue."""

    def __init__(self, message: str, signal_name: str | None) -> None:
        super().__init__(message)
        # The shell's convention, 128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM.
        self.exit_code = 128 + signal.Signals[signal_name or "SIGINT"].value


class StopOnSignal:
    """Context manager owning SIGINT/SIGTERM for the run's lifetime (main thread only).

    `finish_steps()` switches from "stop now" (start-up) to "finish the step first"; call it
    once the workers are up, which also takes SIGTERM back from `ray.init`'s own handler.
    """

    def __init__(self, notify: Callable[[str], None], *, save_on_interrupt: bool) -> None:
        self.notify, self.save_on_interrupt = notify, save_on_interrupt
        self.requested: str | None = None  # name of the first signal, once one arrived
        self.finishing = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        self._install()
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def finish_steps(self) -> None:
        self.finishing = True
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals only reach the main thread; an embedding application keeps its own handling
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is None and self.finishing:
            self.requested = name
            then = "saving a checkpoint and stopping" if self.save_on_interrupt else \
                "stopping without a checkpoint (trainer.save_on_interrupt=false)"
            self.notify(f"{name}: finishing the current step, then {then}; press Ctrl-C again to stop at once")
            return
        self.requested = self.requested or name
        raise KeyboardInterrupt(name)


def stop_after_step(controller: Controller, run: RunDir, stop: StopOnSignal, *, saved: bool) -> RunInterrupted:
    """The step in flight has finished: checkpoint it (unless it was just saved, or not wanted)."""
    step = controller.completed_steps
    if stop.save_on_interrupt and not saved:
        controller.save_checkpoint("interrupt")
        run.write_status("running", step=step, last_checkpoint=step)
    how = "" if stop.save_on_interrupt else " without a checkpoint (trainer.save_on_interrupt=false)"
    return RunInterrupted(f"stopped by {stop.requested} after step {step}{how}. {continue_hint(run.path, run.run_id)}",
                          stop.requested)


def stopped_at_once(run: RunDir, stop: StopOnSignal, completed_steps: int) -> RunInterrupted:
    """A second signal (or one during start-up) abandoned whatever was in flight."""
    where = f"after step {completed_steps}" if stop.finishing else "during start-up"
    return RunInterrupted(f"stopped at once by {stop.requested or 'Ctrl-C'} {where}. "
                          f"{continue_hint(run.path, run.run_id)}", stop.requested)
