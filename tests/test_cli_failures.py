"""How the CLI prints a failed or interrupted run, and its exit codes (1 failed, 130/143 stopped)."""

from __future__ import annotations

import pytest
import typer

from rlkit.cli.common import run_failures
from rlkit.core.cluster.failures import WorkerFailure
from rlkit.core.controller.interrupt import RunInterrupted


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


@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupted_run_prints_how_to_continue(capsys, name, code):
    def stopped():
        raise RunInterrupted(f"stopped by {name} after step 7. Continue with: rlkit resume x", name)

    assert _exit_code(stopped) == code
    assert capsys.readouterr().err.strip() == f"stopped by {name} after step 7. Continue with: rlkit resume x"


def test_ctrl_c_during_shutdown_still_prints_how_to_continue(capsys):
    def stopped_then_pressed_again():
        try:
            raise RunInterrupted("stopped by SIGINT after step 7. Continue with: rlkit resume x", "SIGINT")
        finally:
            raise KeyboardInterrupt  # what the signal handler raises while Ray shuts down

    assert _exit_code(stopped_then_pressed_again) == 130
    assert capsys.readouterr().err.strip() == "stopped by SIGINT after step 7. Continue with: rlkit resume x"
