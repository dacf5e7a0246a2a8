"""Telling a full disk apart from other failures of a write (a checkpoint's), wherever it was raised."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

NEARLY_FULL_BYTES = 16 << 20  # a failed write with less free space than this there is taken for a full disk


def os_error_behind(exc: BaseException | None, depth: int = 0) -> OSError | None:
    """The OSError behind `exc`: itself, a worker's cause (rlkit's WorkerFailure.cause), or one rank's
    failure inside torch's CheckpointException (whose `failures` maps rank -> (exception, traceback))."""
    if exc is None or depth > 5:
        return None
    if isinstance(exc, OSError):
        return exc
    if hasattr(exc, "cause"):  # a worker that died or was late has none; one that raised, its own exception
        return os_error_behind(exc.cause, depth + 1)
    for failure in (getattr(exc, "failures", None) or {}).values():
        found = os_error_behind(failure[0] if isinstance(failure, tuple) else failure, depth + 1)
        if found is not None:
            return found
    return os_error_behind(exc.__cause__ or exc.__context__, depth + 1)


def disk_full_error(folder: Path, exc: BaseException) -> OSError | None:
    """The OSError behind `exc` from writing into `folder`; or, when there is none but the disk there is
    (nearly) full, an ENOSPC naming `folder`: torch's zip writer (torch.save, so every DCP shard) turns
    a failed write into "RuntimeError: [enforce fail at inline_container.cc] unexpected pos", losing it."""
    error = os_error_behind(exc)
    if error is not None:
        return error
    free = free_bytes(folder)
    if free is not None and free < NEARLY_FULL_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))
    return None


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem of `path` (or of its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return None
