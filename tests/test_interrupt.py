"""Signal handling of a run: stop now during start-up, finish the step once training, stop now on a second."""

from __future__ import annotations

import signal

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
                         "press Ctrl-C again to stop at once"]
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
