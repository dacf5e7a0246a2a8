"""How the CLI prints a failed or interrupted run, and its exit codes (1 failed, 130 stopped)."""

from __future__ import annotations

import pytest
import typer

from rlkit.cli.common import run_failures
from rlkit.core.failures import WorkerFailure
from rlkit.core.interrupt import RunInterrupted


def _exit_code(fn) -> int:
    with pytest.raises(typer.Exit) as info:
        run_failures(fn)()
    return info.value.exit_code


def test_failure_prints_message_worker_traceback_and_next_step(capsys):
    def fails():
        failure = WorkerFailure("worker rank 1 raised ValueError during 'update_actor': [bad] row",
                                detail="Traceback (most recent call last):\n  ...\nValueError: [bad] row")
        failure.next_step = "The last complete checkpoint is step 4 (runs/x/checkpoints/step_00000004). " \
                            "Continue with: rlkit resume x"
        raise failure

    assert _exit_code(fails) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: worker rank 1 raised ValueError during 'update_actor': [bad] row"
    assert lines[1:4] == ["Traceback (most recent call last):", "  ...", "ValueError: [bad] row"]
    assert lines[4].endswith("Continue with: rlkit resume x")


def test_interrupted_run_prints_how_to_continue(capsys):
    def stopped():
        raise RunInterrupted("stopped by SIGINT after step 7. Continue with: rlkit resume x")

    assert _exit_code(stopped) == 130
    assert capsys.readouterr().err.strip() == "stopped by SIGINT after step 7. Continue with: rlkit resume x"


def test_ctrl_c_during_shutdown_still_prints_how_to_continue(capsys):
    def stopped_then_pressed_again():
        try:
            raise RunInterrupted("stopped by SIGINT after step 7. Continue with: rlkit resume x")
        finally:
            raise KeyboardInterrupt  # what the signal handler raises while Ray shuts down

    assert _exit_code(stopped_then_pressed_again) == 130
    assert capsys.readouterr().err.strip() == "stopped by SIGINT after step 7. Continue with: rlkit resume x"
