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


def test_an_input_error_found_mid_run_also_says_how_to_continue(capsys):
    """A reward that fails in step 1 stops the run with exit code 2; the run loop adds how to go on."""
    from rlkit.cli.common import user_errors
    from rlkit.core.rewards.scoring import RewardError

    def reward_hangs():
        error = RewardError("reward failed on row 0 (...): timed out after 2 s (reward.timeout_s)")
        error.next_step = "No checkpoint was written yet, so there is nothing to resume. Start the run again " \
                          "under the same id with: rlkit train runs/x/config.yaml --run-id x"
        raise error

    with pytest.raises(typer.Exit) as info:
        user_errors(reward_hangs)()
    assert info.value.exit_code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: reward failed on row 0 (...): timed out after 2 s (reward.timeout_s)",
        "No checkpoint was written yet, so there is nothing to resume. Start the run again under the same id "
        "with: rlkit train runs/x/config.yaml --run-id x"]
