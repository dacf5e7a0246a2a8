"""Failures that stop a run, worded for the person who has to act on them.

These are not user errors (rlkit.errors.UserError, exit code 2): a worker died, hung or
raised, or a checkpoint could not be written. The CLI prints the message, then `detail`
(e.g. the worker's own traceback, which is what a bug report needs), and exits with code 1.
"""

from __future__ import annotations

import errno
import functools
import os
import pickle
import re
from pathlib import Path
from types import FunctionType
from typing import Any, Callable

from rlkit.core.cluster.phases import WorkerPlace
from rlkit.core.state.disk_errors import free_bytes, os_error_behind

TROUBLESHOOTING = "docs/troubleshooting.md"


class RunFailure(RuntimeError):
    """The run cannot go on, through no fault in its inputs."""

    def __init__(self, message: str, *, detail: str = "", cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.detail = detail  # long text kept for bug reports (a worker's traceback)
        self.cause = cause  # a worker's own exception, when it raised one
        self.next_step = ""  # how to continue; the run loop fills it in (it knows the run)


class WorkerFailure(RunFailure):
    """A worker died, missed its deadline, or raised; the message says which, where and why."""


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (disk full, unwritable run directory)."""


class WorkerException(RuntimeError):
    """A worker's exception that could not cross Ray (it does not pickle), as its type name and message."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name, self.message = type_name, message

    def __str__(self) -> str:
        return self.message


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a WorkerException carrying its type name and message.

    Ray pickles a worker's exception to send it to the controller; one that does not pickle
    (pydantic's ValidationError, one holding a lock or a socket) would arrive as Ray's own
    "isn't serializable" error with the real message buried in its text.
    """
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to round-trip means the same thing
        return WorkerException(type(exc).__name__, str(exc))
    return exc


def with_portable_exceptions(worker_cls: type) -> type:
    """A subclass of `worker_cls` whose methods (and __init__) raise only exceptions that pickle."""

    def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                converted = portable(exc)
                if converted is exc:
                    raise
                raise converted from exc  # the worker's traceback (Ray's text) keeps the original

        return call

    plain = {}  # instance methods by name, the most derived class's last (static and class methods stay as they are)
    for klass in reversed(worker_cls.__mro__):
        plain.update({name: member for name, member in vars(klass).items() if isinstance(member, FunctionType)})
    methods = {
        name: guarded(member) for name, member in plain.items() if not name.startswith("_") or name == "__init__"
    }
    return type(
        worker_cls.__name__,
        (worker_cls,),
        {**methods, "__module__": worker_cls.__module__, "__qualname__": worker_cls.__qualname__},
    )


def continue_hint(run_path: Path, run_id: str) -> str:
    """Where the run can continue from, and the command that does it."""
    from rlkit.core.state.checkpoint import latest_checkpoint
    from rlkit.errors import UserError

    try:
        ckpt = latest_checkpoint(run_path, warn=False)
    except UserError:
        return (
            "No checkpoint was written yet, so there is nothing to resume. Start the run again under the "
            f"same id with: {restart_command(run_path, run_id)}"
        )
    return (
        f"The last complete checkpoint is step {ckpt.step} ({ckpt.path}). "
        f"Continue with: {resume_command(run_path, run_id)}"
    )


def resume_command(run_path: Path, run_id: str, command: str = "resume") -> str:
    """`rlkit resume ID` (or another run command: export, runs show), with --runs-dir when the run
    is not under the default runs folder."""
    parent = _runs_dir_if_not_default(run_path)
    return f"rlkit {command} {run_id}" + (f" --runs-dir {parent}" if parent else "")


def restart_command(run_path: Path, run_id: str) -> str:
    """The command that trains a run without checkpoints again from its own resolved config, in the
    same directory (`rlkit train --run-id` reuses a run directory that holds no checkpoint)."""
    parent = _runs_dir_if_not_default(run_path)
    return f"rlkit train {Path(run_path) / 'config.yaml'} --run-id {run_id}" + (
        f" trainer.runs_dir={parent}" if parent else ""
    )


def _runs_dir_if_not_default(run_path: Path) -> Path | None:
    default = Path(os.environ.get("RLKIT_RUNS_DIR", "runs")).expanduser().resolve()
    parent = Path(run_path).expanduser().resolve().parent
    return None if parent == default else parent


def checkpoint_write_failure(
    tmp: Path, step: int, exc: BaseException, needed_bytes: int | None = None
) -> CheckpointWriteError | None:
    """A CheckpointWriteError when `exc` (from writing step `step` into `tmp`) is a filesystem error
    (raised here or by a worker), else None: a dead or hung worker stays a WorkerFailure. A full disk
    is said in words, with the space free there now and `needed_bytes` (the last checkpoint's size)."""
    error = os_error_behind(exc)
    if error is None:
        return None
    space = ""
    if error.errno == errno.ENOSPC:
        free = free_bytes(Path(tmp))
        needed = f"; the last checkpoint took {_size(needed_bytes)}" if needed_bytes else ""
        space = f" (ENOSPC: {_size(free)} free there now{needed})" if free is not None else ""
    return CheckpointWriteError(
        f"could not write the checkpoint of step {step} to {tmp}: {error}{space}. Earlier checkpoints are untouched; "
        f"free space or fix the permissions there (see {TROUBLESHOOTING}, 'A checkpoint could not be written')."
    )


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} bytes"


def describe_worker(rank: int, node: int, place: WorkerPlace | None) -> str:
    where = f"node {node}" + (f", host {place.host}, pid {place.pid}" if place else "")
    return f"rank {rank} ({where})"


def worker_died(
    group: str, rank: int, node: int, call_phase: str, place: WorkerPlace | None, ray_message: str
) -> WorkerFailure:
    inside = f" in its phase '{place.phase}'" if place and place.phase != call_phase else ""
    return WorkerFailure(
        f"{group} {describe_worker(rank, node, place)} died during '{call_phase}'{inside}: "
        f"{death_cause(ray_message)}. The run stops; it can continue from its last complete checkpoint "
        f"(see {TROUBLESHOOTING}, 'A worker died').",
        # Ray's full text only when it holds the worker's traceback (an error in its __init__).
        detail=_strip_ansi(ray_message) if "creation task" in ray_message else "",
    )


# Exceptions of other libraries whose message alone does not say what to do: (words in it, the fix).
KNOWN_CAUSES = [
    # vLLM's sleep mode and memory profiling compare the whole GPU's free memory before and after.
    (
        ("Memory usage increased after sleeping", "Error in memory profiling"),
        "vLLM measures the whole GPU's free memory, and another process on this GPU changed its use: give "
        f"the run its GPUs alone (CUDA_VISIBLE_DEVICES; see {TROUBLESHOOTING}, 'Another process on the GPU')",
    ),
]


def worker_raised(
    group: str,
    rank: int,
    node: int,
    call_phase: str,
    place: WorkerPlace | None,
    cause: BaseException,
    traceback_text: str,
) -> WorkerFailure:
    inside = f" (worker phase '{place.phase}')" if place and place.phase != call_phase else ""
    type_name = cause.type_name if isinstance(cause, WorkerException) else type(cause).__name__
    message = headline(str(cause))
    fixes = [fix for words, fix in KNOWN_CAUSES if any(w in str(cause) for w in words)]
    if fixes:
        message = message.rstrip(".") + "".join(f". {fix}" for fix in fixes)
    return WorkerFailure(
        f"{group} {describe_worker(rank, node, place)} raised {type_name} during '{call_phase}'{inside}: {message}",
        detail=_strip_ansi(traceback_text),
        cause=cause,
    )


_VALIDATION_TITLE = re.compile(r"^\d+ validation errors? for \S+$")


def headline(message: str, limit: int = 400) -> str:
    """An exception message on one line: its first line, and what follows when the first is only a
    title (pydantic's "1 validation error for ModelConfig" is followed by the field and its error)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or [""]
    if _VALIDATION_TITLE.match(lines[0]):  # then the field (if any) and its error, before the link
        detail = [line for line in lines[1:3] if not line.startswith("For further information")]
        text = ": ".join([lines[0], *detail])
    elif lines[0].endswith(":") and len(lines) > 1:
        text = f"{lines[0].rstrip(':')}: {lines[1]}"
    else:
        text = lines[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def workers_late(
    group: str, phase: str, timeout: float, timeout_key: str, late: list[str], finished: list[int]
) -> WorkerFailure:
    done = f"; rank(s) {finished} finished" if finished else ""
    return WorkerFailure(
        f"'{phase}' did not finish within {timeout:g} s ({timeout_key}): {group} {'; '.join(late)}{done}. "
        f"The run stops instead of waiting forever. If this phase is only slow, raise {timeout_key}; "
        f"if a worker hangs, see {TROUBLESHOOTING}, 'A phase timed out'."
    )


def late_worker(rank: int, node: int, place: WorkerPlace | None) -> str:
    if place is None:
        return f"{describe_worker(rank, node, place)} never reported a phase"
    return f"{describe_worker(rank, node, place)} still in '{place.phase}' after {place.seconds_in_phase:.0f} s"


# Ray's "Worker exit type" of a dead actor, in plain words.
_EXIT_TYPES = {
    "SYSTEM_ERROR": "its process ended unexpectedly: killed by a signal (SIGKILL, the kernel's out-of-memory "
    "killer) or crashed (e.g. SIGSEGV)",
    "NODE_OUT_OF_MEMORY": "Ray killed it because its node ran out of memory",
    "USER_ERROR": "its process exited because of an error",
    "INTENDED_USER_EXIT": "its process exited on request",
    "INTENDED_SYSTEM_EXIT": "Ray shut it down",
}


def death_cause(ray_message: str) -> str:
    """The cause of an actor's death in one sentence, with Ray's own wording in brackets."""
    text = _strip_ansi(ray_message)
    detail = re.search(r"Worker exit detail: (.+?\.)(?:\s|$)", text)
    ray_words = f" (Ray: {detail.group(1)})" if detail else ""
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    if "creation task" in text:
        return "its start-up (__init__) raised an error; the worker's traceback follows"
    if "OutOfMemoryError" in text or ("out of memory" in text.lower() and not exit_type):
        return "it ran out of memory" + ray_words
    if exit_type:
        name = exit_type.group(1)
        return _EXIT_TYPES.get(name, f"it exited ({name})") + ray_words
    if "node has died" in text or "node died" in text.lower():
        return "its node went away (machine down or Ray's node process died)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "Ray gave no reason"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)
