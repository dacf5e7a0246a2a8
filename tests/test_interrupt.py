"""Signal handling of a run: stop now during start-up, finish the step once training, stop now on a second."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from rlkit.core.controller.interrupt import StopOnSignal


def test_during_start_up_one_signal_stops_at_once():
    notes: list[str] = []
    with StopOnSignal(notes.append, save_on_interrupt=True) as stop:
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            signal.raise_signal(signal.SIGINT)
    assert stop.requested == "SIGINT" and notes == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_while_training_the_first_signal_asks_to_finish_the_step_and_the_second_stops(signum):
    notes: list[str] = []
    with StopOnSignal(notes.append, save_on_interrupt=True) as stop:
        stop.finish_steps()
        signal.raise_signal(signum)
        assert stop.requested == signum.name
        assert notes == [f"{signum.name}: finishing the current step, then saving a checkpoint and stopping; "
                         "a second Ctrl-C (or SIGTERM) stops at once (the step in flight is lost; the last "
                         "checkpoint stays)"]
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_notice_says_when_no_checkpoint_will_be_saved():
    notes: list[str] = []
    with StopOnSignal(notes.append, save_on_interrupt=False) as stop:
        stop.finish_steps()
        signal.raise_signal(signal.SIGTERM)
    assert "then stopping without a checkpoint (trainer.save_on_interrupt=false)" in notes[0]


def test_previous_handlers_come_back():
    """Whatever handlers were installed before (a shell may start us with SIGINT ignored) return."""
    def mine(signum, frame):
        pass

    def mine_int(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    before_int = signal.signal(signal.SIGINT, mine_int)
    try:
        with StopOnSignal(lambda _: None, save_on_interrupt=True) as stop:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what ray.init does in between
            stop.finish_steps()
            assert signal.getsignal(signal.SIGTERM) == stop._handle
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is mine_int
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_int)


def busy_in_c(seconds: float) -> None:
    """Run C code for about `seconds` without returning to the interpreter, so Python runs no
    signal handler meanwhile (as while the controller waits inside a Ray call)."""
    start = time.perf_counter()
    sum(range(10**6))
    n = int(10**6 * seconds / max(time.perf_counter() - start, 1e-6))
    sum(range(n))


def test_two_presses_50ms_apart_stop_at_once_even_when_python_sees_one():
    notes: list[str] = []
    with StopOnSignal(notes.append, save_on_interrupt=True) as stop:
        stop.finish_steps()
        presses = subprocess.Popen(["sh", "-c", f"sleep 0.2; kill -INT {os.getpid()}; sleep 0.05; kill -INT {os.getpid()}"])
        try:
            with pytest.raises(KeyboardInterrupt, match="SIGINT"):
                busy_in_c(3.0)  # both presses land in here: the handler then runs once
        finally:
            presses.wait()
    assert notes == []  # no "finishing the current step": the second press was counted


def test_the_wakeup_fd_is_given_back():
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    with StopOnSignal(lambda _: None, save_on_interrupt=True) as stop:
        stop.finish_steps()
    assert signal.set_wakeup_fd(before) == before
