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

Python runs a signal's handler only between bytecodes: two presses that arrive while the
controller waits inside C code (a Ray call) reach the handler as one call. Every delivery
also writes a byte to the wakeup fd (`signal.set_wakeup_fd`), so the handler counts the
bytes and treats two presses as two, however close together.
"""

from __future__ import annotations

import signal
import socket
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from rlkit.core.cluster.failures import continue_hint

if TYPE_CHECKING:
    from rlkit.core.controller.controller import Controller
    from rlkit.core.state.run_dir import RunDir

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
        self._wakeup: tuple[socket.socket, socket.socket] | None = None  # (read end, write end)
        self._previous_wakeup_fd = -1

    def __enter__(self) -> StopOnSignal:
        self._install()
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            for end in self._wakeup:
                end.close()
            self._wakeup = None

    def finish_steps(self) -> None:
        self.finishing = True
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals only reach the main thread; an embedding application keeps its own handling
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)
        if self._wakeup is None:
            self._wakeup = socket.socketpair()
            for end in self._wakeup:
                end.setblocking(False)
            self._previous_wakeup_fd = signal.set_wakeup_fd(self._wakeup[1].fileno(), warn_on_full_buffer=False)
        else:  # taken back, as the handlers are, from whatever replaced it meanwhile
            signal.set_wakeup_fd(self._wakeup[1].fileno(), warn_on_full_buffer=False)

    def _deliveries(self) -> int:
        """Our signals delivered since the last call (at least 1: the one being handled)."""
        count = 0
        while self._wakeup is not None:
            try:
                data = self._wakeup[0].recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            count += sum(byte in SIGNALS for byte in data)
        return max(count, 1)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        presses = self._deliveries()
        if self.requested is None and self.finishing and presses == 1:
            self.requested = name
            then = (
                "saving a checkpoint and stopping"
                if self.save_on_interrupt
                else "stopping without a checkpoint (trainer.save_on_interrupt=false)"
            )
            self.notify(
                f"{name}: finishing the current step, then {then}; a second Ctrl-C (or SIGTERM) stops "
                "at once (the step in flight is lost; the last checkpoint stays)"
            )
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
    return RunInterrupted(
        f"stopped by {stop.requested} after step {step}{how}. {continue_hint(run.path, run.run_id)}", stop.requested
    )


def stopped_at_once(run: RunDir, stop: StopOnSignal, completed_steps: int) -> RunInterrupted:
    """A second signal (or one during start-up) abandoned whatever was in flight."""
    where = f"after step {completed_steps}" if stop.finishing else "during start-up"
    return RunInterrupted(
        f"stopped at once by {stop.requested or 'Ctrl-C'} {where}. {continue_hint(run.path, run.run_id)}",
        stop.requested,
    )
