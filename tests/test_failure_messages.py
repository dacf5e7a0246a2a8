"""Fault-injection rules; Ray's death reports, missed deadlines and failed saves in plain words (no Ray started)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlkit.core.cluster import faults
from rlkit.core.cluster.failures import (
    CheckpointWriteError,
    WorkerException,
    WorkerFailure,
    checkpoint_write_failure,
    continue_hint,
    death_cause,
    headline,
    late_worker,
    portable,
    resume_command,
    with_portable_exceptions,
    worker_died,
    worker_raised,
    workers_late,
)
from rlkit.core.cluster.phases import WorkerPlace
from rlkit.core.state import disk_errors

# What Ray 2.x reports for an actor whose process got SIGKILL (copied from a real run).
KILLED = """The actor died unexpectedly before finishing this task.
\tclass_name: PolicyWorker
\tpid: 28065
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: \
Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the \
process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called."""


def test_rules_parse_action_point_and_occurrence():
    rules = faults.parse("kill:worker1.update_actor:2, sleep=2.5:worker0.setup/rollout-engine:1")
    assert rules == [faults.Rule("kill", "worker1.update_actor", 2),
                     faults.Rule("sleep=2.5", "worker0.setup/rollout-engine", 1)]


@pytest.mark.parametrize("spec", ["kill:worker0.generate", "explode:worker0.generate:1", "sleep=x:w:1", "kill::1"])
def test_malformed_rules_are_refused(spec):
    with pytest.raises(ValueError, match="is not ACTION:POINT:N"):
        faults.parse(spec)


def test_a_rule_fires_on_its_occurrence_only(monkeypatch):
    monkeypatch.setenv(faults.ENV, "raise:test.point:2")
    monkeypatch.setattr(faults, "_reached", type(faults._reached)())
    faults.reached("test.point")                     # first arrival: nothing
    faults.reached("other.point")
    with pytest.raises(faults.InjectedFault, match="raise at test.point #2"):
        faults.reached("test.point")
    faults.reached("test.point")                     # third: nothing again


def test_no_rule_no_effect(monkeypatch, capsys):
    monkeypatch.setattr(faults, "_reached", type(faults._reached)())
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.reached("worker0.update_actor") is None
    monkeypatch.setenv(faults.ENV, "")
    faults.reached("worker0.update_actor", step=1)
    assert not faults._reached  # unset or empty: the hook keeps no state and does nothing
    # A rule for another point never acts here (a kill would end this test process); it only counts.
    monkeypatch.setenv(faults.ENV, "kill:worker1.update_actor:1")
    faults.reached("worker0.update_actor")
    assert faults._reached == {"worker0.update_actor": 1}
    assert capsys.readouterr().err == ""  # no "rlkit fault injection:" line


def test_killed_actor_cause_in_plain_words():
    cause = death_cause(KILLED)
    assert cause.startswith("its process ended unexpectedly: killed by a signal (SIGKILL, the kernel's "
                            "out-of-memory killer) or crashed")
    assert cause.endswith("(Ray: Worker unexpectedly exits with a connection error code 2.)")


def test_memory_monitor_and_node_loss_causes():
    assert death_cause("Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the "
                       "node running low on memory. ").startswith("Ray killed it because its node ran out of memory")
    assert death_cause("The actor died because its node has died. Node Id: 123") == \
        "its node went away (machine down or Ray's node process died)"


def test_died_message_names_rank_node_host_phase_and_what_to_read():
    place = WorkerPlace(rank=3, host="gpu-7", pid=4242, phase="log_probs/ref", seconds_in_phase=1.0)
    failure = worker_died("worker", 3, 1, "ref log-probs", place, KILLED)
    assert str(failure).startswith("worker rank 3 (node 1, host gpu-7, pid 4242) died during 'ref log-probs' "
                                   "in its phase 'log_probs/ref': its process ended unexpectedly")
    assert "docs/troubleshooting.md" in str(failure)
    assert failure.detail == ""  # Ray's long text adds nothing here


def test_late_message_names_each_late_rank_and_the_key_to_raise():
    place = WorkerPlace(rank=1, host="h", pid=9, phase="generate", seconds_in_phase=61.4)
    late = [late_worker(1, 0, place), late_worker(2, 1, None)]
    message = str(workers_late("worker", "generate", 60, "trainer.phase_timeout_s", late, [0, 3]))
    assert message.startswith("'generate' did not finish within 60 s (trainer.phase_timeout_s): worker rank 1 "
                              "(node 0, host h, pid 9) still in 'generate' after 61 s; rank 2 (node 1) never "
                              "reported a phase; rank(s) [0, 3] finished.")
    assert "raise trainer.phase_timeout_s" in message


def test_a_full_disk_behind_a_workers_checkpoint_exception_is_a_checkpoint_write_error(tmp_path, monkeypatch):
    from torch.distributed.checkpoint.api import CheckpointException

    monkeypatch.setattr(disk_errors.shutil, "disk_usage", lambda path: SimpleNamespace(free=1_500_000))
    full = OSError(28, "No space left on device", str(tmp_path / "shards" / "__0_0.distcp"))
    raised = WorkerFailure("worker rank 0 raised CheckpointException",
                           cause=CheckpointException("save", {0: (full, None)}))
    failure = checkpoint_write_failure(tmp_path / ".tmp-step_00000008", 8, raised, needed_bytes=3_240_000_000)
    assert isinstance(failure, CheckpointWriteError)
    assert str(failure).startswith(f"could not write the checkpoint of step 8 to {tmp_path}/.tmp-step_00000008: "
                                   f"[Errno 28] No space left on device: '{tmp_path}/shards/__0_0.distcp' (ENOSPC: "
                                   "1.5 MB free there now; the last checkpoint took 3.2 GB). "
                                   "Earlier checkpoints are untouched; free space or fix the permissions there")
    assert checkpoint_write_failure(tmp_path, 8, PermissionError(13, "Permission denied", "x")) is not None


def test_a_worker_dying_while_saving_stays_a_worker_failure(tmp_path):
    died = worker_died("worker", 0, 0, "save checkpoint (policy)", None, KILLED)
    assert checkpoint_write_failure(tmp_path, 3, died) is None
    assert checkpoint_write_failure(tmp_path, 3, WorkerFailure("raised", cause=ValueError("bug"))) is None


def test_continue_hint_names_the_last_checkpoint_and_the_command(tmp_path, monkeypatch):
    from rlkit.core.state.checkpoint import MARKER, step_dir_name

    monkeypatch.delenv("RLKIT_RUNS_DIR", raising=False)
    run = tmp_path / "runs" / "my-run"
    monkeypatch.chdir(tmp_path)  # runs/ is the default --runs-dir here
    assert continue_hint(run, "my-run") == ("No checkpoint was written yet, so there is nothing to resume. Start the "
                                            f"run again under the same id with: rlkit train {run}/config.yaml "
                                            "--run-id my-run")
    ckpt = run / "checkpoints" / step_dir_name(4)
    ckpt.mkdir(parents=True)
    (ckpt / MARKER).write_text('{"step": 4, "files": {}}')
    assert continue_hint(run, "my-run") == (f"The last complete checkpoint is step 4 ({ckpt}). "
                                            "Continue with: rlkit resume my-run")
    monkeypatch.chdir(run)
    assert resume_command(run, "my-run") == f"rlkit resume my-run --runs-dir {tmp_path / 'runs'}"


def vllm_style_validation_error() -> Exception:
    """What vLLM 0.26 raised for max_model_len 528 > 256: a pydantic dataclass's ValidationError, whose
    input (ArgsKwargs) does not pickle, so it cannot cross Ray as it is."""
    from pydantic import model_validator
    from pydantic.dataclasses import dataclass

    @dataclass
    class ModelConfig:
        max_model_len: int

        @model_validator(mode="after")
        def check(self):
            raise ValueError(f"User-specified max_model_len ({self.max_model_len}) is greater than the derived "
                             "max_model_len (max_position_embeddings=256)")

    try:
        ModelConfig(max_model_len=528)
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no error")


class Flaky:
    def __init__(self, fail: bool) -> None:
        if fail:
            raise vllm_style_validation_error()

    def setup(self) -> None:
        raise vllm_style_validation_error()

    def plain(self) -> None:
        raise ValueError("row 7 is not a number")

    @staticmethod
    def helper(x: int) -> int:
        return x + 1


def test_an_exception_that_cannot_cross_ray_arrives_as_its_type_and_message():
    import pickle

    original = vllm_style_validation_error()
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle.dumps(original)
    converted = portable(original)
    assert isinstance(converted, WorkerException) and converted.type_name == "ValidationError"
    assert str(pickle.loads(pickle.dumps(converted))) == str(original)
    plain = ValueError("fine")
    assert portable(plain) is plain

    guarded = with_portable_exceptions(Flaky)
    assert guarded.__name__ == "Flaky" and issubclass(guarded, Flaky) and guarded.helper(1) == 2
    with pytest.raises(WorkerException) as info:
        guarded(fail=False).setup()
    assert isinstance(info.value.__cause__, type(original))  # the worker's traceback keeps the original
    with pytest.raises(WorkerException):
        guarded(fail=True)
    with pytest.raises(ValueError, match="row 7"):  # a picklable exception is raised as it is
        guarded(fail=False).plain()

    failure = worker_raised("worker", 0, 0, "setup", None, info.value, "Traceback ...")
    assert str(failure) == ("worker rank 0 (node 0) raised ValidationError during 'setup': 1 validation error "
                            "for ModelConfig: Value error, User-specified max_model_len (528) is greater than the "
                            "derived max_model_len (max_position_embeddings=256) [type=value_error, "
                            "input_value=ArgsKwargs((), {'max_model_len': 528}), input_type=ArgsKwargs]")


def test_vllm_seeing_another_process_on_its_gpu_gets_the_fix():
    # vLLM 0.26's assertion when another process allocated on the GPU while its engine went to sleep (H200)
    failure = worker_raised("worker", 0, 0, "generate", None, AssertionError("Memory usage increased after sleeping."),
                            "Traceback ...")
    assert str(failure) == ("worker rank 0 (node 0) raised AssertionError during 'generate': Memory usage increased "
                            "after sleeping. vLLM measures the whole GPU's free memory, and another process on this "
                            "GPU changed its use: give the run its GPUs alone (CUDA_VISIBLE_DEVICES; see "
                            "docs/troubleshooting.md, 'Another process on the GPU')")
    plain = worker_raised("worker", 0, 0, "generate", None, ValueError("row 7"), "")
    assert str(plain) == "worker rank 0 (node 0) raised ValueError during 'generate': row 7"


def test_headline_keeps_one_line_and_the_second_after_a_title():
    assert headline("row 7 is not a number\nmore") == "row 7 is not a number"
    assert headline("bad rows:\n  row 7\n  row 8") == "bad rows: row 7"
    assert headline("1 validation error for X\n  the reason\n    For further information visit https://x") == \
        "1 validation error for X: the reason"
    # what vLLM's SchedulerConfig raised for rollout.vllm.engine_kwargs={max_num_batched_tokens: -5}
    assert headline("1 validation error for SchedulerConfig\nmax_num_batched_tokens\n  Input should be greater "
                    "than or equal to 1 [type=greater_than_equal, input_value=-5, input_type=int]\n    For further "
                    "information visit https://errors.pydantic.dev/2.14/v/greater_than_equal") == (
        "1 validation error for SchedulerConfig: max_num_batched_tokens: Input should be greater than or equal "
        "to 1 [type=greater_than_equal, input_value=-5, input_type=int]")
    assert headline("x" * 500) == "x" * 397 + "..."
