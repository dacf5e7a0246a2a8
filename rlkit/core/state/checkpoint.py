"""Checkpoints of a run: layout, atomic writes, and choosing one to resume from.

    runs/<id>/checkpoints/
      step_00000006/          a complete checkpoint, renamed into place only once whole:
        COMPLETE              the marker, written last: a manifest of every file, its size and its sha256
        trainer_state.json    step, reason, sampler position, KL coefficient, seeds, world size
        controller_rng.pt     the controller's RNG states
        config.yaml           the resolved config this checkpoint was trained with
        provenance.json       rlkit version/commit, packages, data hashes, hardware (rlkit.core.state.provenance)
        policy/               the policy workers' shards (rlkit.core.state.shards)
        critic/               the critic workers' shards, when the run has a critic
      .tmp-step_00000007/     a write in progress, or one killed midway (ignored; removed on resume)

A folder without its marker, or whose file sizes do not match the manifest (a truncated copy, a
disk that filled up), is skipped with a warning and the previous checkpoint is used. The one
checkpoint a command is about to load (resume, export, eval, replay) is then verified in full
(`verify`): every file's sha256 must match the manifest and no file may be missing or extra, or
it is refused naming the file, before anything in it is read. Hashes are streamed, several files
at once, after the write (DCP writes the shards itself); the figures are in docs/resume.md.
Workers on several nodes write into the same folder, so runs_dir must be on a shared
filesystem for multi-node runs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlkit.core.cluster import faults
from rlkit.core.state.provenance import PROVENANCE_FILE
from rlkit.core.state.shards import write_durably
from rlkit.errors import UserError

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
RNG_FILE = "controller_rng.pt"
CONFIG_FILE = "config.yaml"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step_(\d+)$")
# Set to 1 to load a checkpoint written before manifests held sha256 hashes (rlkit < the hashed manifest).
ACCEPT_UNHASHED_ENV = "RLKIT_ACCEPT_UNHASHED_CHECKPOINTS"
_HASH_CHUNK = 8 << 20  # hashlib drops the GIL for big updates: files hash in parallel threads


class NoCheckpointError(UserError):
    """A run that never wrote a checkpoint."""


@dataclass
class Checkpoint:
    step: int
    path: Path
    problem: str | None = None  # why it cannot be used; None for a complete checkpoint

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.path / STATE_FILE).read_text())


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoints_dir(run_path: Path) -> Path:
    return Path(run_path) / CHECKPOINTS_DIR


def tmp_dir(run_path: Path, step: int) -> Path:
    """Where step `step` is written before it is complete."""
    return checkpoints_dir(run_path) / f"{TMP_PREFIX}{step_dir_name(step)}"


# -- writing --------------------------------------------------------------------------------
def write_checkpoint(
    run_path: Path,
    step: int,
    *,
    reason: str,
    write_shards: Callable[[Path], None],
    trainer_state: dict[str, Any],
    controller_rng: dict[str, Any],
    config_yaml: str,
    keep_last: int,
) -> Path:
    """Write step `step` into a temporary folder, mark it complete, rename it into place.

    `write_shards(folder)` has the workers write their shards under `folder`. A crash at any
    point leaves either the previous checkpoints untouched plus a `.tmp-` folder, or the new
    complete one: never a folder that looks complete but is not.
    """
    root = checkpoints_dir(run_path)
    final = root / step_dir_name(step)
    if final.exists() and validate(final) is None:
        return final  # this step is already saved (e.g. periodic, then again on interrupt)
    tmp = tmp_dir(run_path, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_shards(tmp)
    state = {**trainer_state, "step": step, "reason": reason, "written_at": _now()}
    _write_text(tmp / STATE_FILE, json.dumps(state, indent=2))
    _write_text(tmp / CONFIG_FILE, config_yaml)
    if (Path(run_path) / PROVENANCE_FILE).is_file():  # the environment that trained this step
        _write_text(tmp / PROVENANCE_FILE, (Path(run_path) / PROVENANCE_FILE).read_text())
    write_durably(tmp / RNG_FILE, controller_rng)
    faults.reached("checkpoint-before-marker", step)
    names = [str(p.relative_to(tmp)) for p in sorted(tmp.rglob("*")) if p.is_file()]
    files = {name: (tmp / name).stat().st_size for name in names}
    manifest = {"step": step, "files": files, "sha256": sha256_files(tmp, names)}
    _write_text(tmp / MARKER, json.dumps(manifest, indent=1))
    if final.exists():  # a damaged leftover of the same step
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    rotate(run_path, keep_last)
    return final


def rotate(run_path: Path, keep_last: int) -> list[int]:
    """Delete all but the newest `keep_last` complete checkpoints (and anything older); returns deleted steps."""
    found = list_checkpoints(run_path, check_files=False)
    complete = [c for c in found if c.problem is None]
    if len(complete) <= keep_last:
        return []
    oldest_kept = complete[-keep_last].step
    deleted = []
    for ckpt in found:
        if ckpt.step < oldest_kept:
            shutil.rmtree(ckpt.path, ignore_errors=True)
            deleted.append(ckpt.step)
    return deleted


def sha256_files(folder: Path, names: list[str]) -> dict[str, str]:
    """name -> hex sha256 of each file `folder/name`, read in chunks, several files at once."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda name: _sha256(folder / name), names)))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# -- reading --------------------------------------------------------------------------------
def read_manifest(path: Path) -> dict[str, Any] | str:
    """The COMPLETE marker's manifest of checkpoint folder `path`, or what is wrong with it (in words)."""
    marker = path / MARKER
    if not marker.is_file():
        return "it has no COMPLETE marker (the write was interrupted)"
    try:
        manifest = json.loads(marker.read_text())
        if not isinstance(manifest["files"], dict) or not isinstance(manifest.get("sha256", {}), dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return "its COMPLETE marker is unreadable"
    return manifest


def validate(path: Path, check_files: bool = True) -> str | None:
    """None for a complete checkpoint, else what is wrong with it (in words). Sizes only: `verify` hashes."""
    manifest = read_manifest(path)
    if isinstance(manifest, str):
        return manifest
    files: dict[str, int] = manifest["files"]
    if check_files:
        for name, size in files.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            actual = file.stat().st_size
            if actual != size:
                return f"{name} has {actual} bytes, the manifest says {size} (truncated or overwritten)"
    return None


def verify(ckpt: Checkpoint) -> Checkpoint:
    """`ckpt` if every file in it is the one its manifest hashed, and nothing else is there; a UserError
    naming the file otherwise. Called before a command reads anything from the checkpoint."""
    manifest = read_manifest(ckpt.path)
    if isinstance(manifest, str):
        raise UserError(f"checkpoint {ckpt.path} cannot be used: {manifest}")
    on_disk = sorted(str(p.relative_to(ckpt.path)) for p in ckpt.path.rglob("*") if p.is_file())
    extra = [name for name in on_disk if name != MARKER and name not in manifest["files"]]
    if extra:
        raise UserError(
            f"checkpoint {ckpt.path} holds {ckpt.path / extra[0]}, which its manifest does not list "
            "(added after it was written); it was not loaded: remove that file if you trust the rest"
        )
    missing = [name for name in manifest["files"] if name not in on_disk]
    if missing:
        raise UserError(f"checkpoint {ckpt.path} is missing {ckpt.path / missing[0]}; it was not loaded")
    if "sha256" not in manifest:
        if os.environ.get(ACCEPT_UNHASHED_ENV) != "1":
            raise UserError(
                f"checkpoint {ckpt.path} has no sha256 manifest (written by an older rlkit), so it cannot "
                f"be verified; if you trust where it came from, set {ACCEPT_UNHASHED_ENV}=1 to load it"
            )
        logger.warning(
            "loading checkpoint %s without verifying it: its manifest has no sha256 (%s=1)",
            ckpt.path,
            ACCEPT_UNHASHED_ENV,
        )
        return ckpt
    expected: dict[str, str] = manifest["sha256"]
    unhashed = [name for name in manifest["files"] if name not in expected]
    if unhashed:
        raise UserError(
            f"checkpoint {ckpt.path}: its manifest has no sha256 for {ckpt.path / unhashed[0]}; it was not loaded"
        )
    actual = sha256_files(ckpt.path, list(manifest["files"]))  # names all found inside the folder above
    changed = [name for name in actual if actual[name] != expected[name]]
    if changed:
        raise UserError(
            f"checkpoint {ckpt.path}: {ckpt.path / changed[0]} does not match the sha256 its manifest "
            "recorded (changed or corrupted since it was written); it was not loaded. Delete the "
            "checkpoint folder to fall back to the previous one"
        )
    return ckpt


def last_checkpoint_bytes(run_path: Path) -> int | None:
    """The size of the newest complete checkpoint (by its manifest), roughly what the next one needs."""
    complete = [c for c in list_checkpoints(run_path, check_files=False) if c.problem is None]
    if not complete:
        return None
    manifest = read_manifest(complete[-1].path)
    return sum(manifest["files"].values()) if isinstance(manifest, dict) else None


def list_checkpoints(run_path: Path, check_files: bool = True) -> list[Checkpoint]:
    """Every step_* folder of a run, oldest first, each with its problem (None = usable)."""
    root = checkpoints_dir(run_path)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append(Checkpoint(int(match.group(1)), child, validate(child, check_files)))
    return sorted(found, key=lambda c: c.step)


def interrupted_writes(run_path: Path) -> list[Path]:
    root = checkpoints_dir(run_path)
    return sorted(p for p in root.glob(f"{TMP_PREFIX}*") if p.is_dir()) if root.is_dir() else []


def latest_checkpoint(run_path: Path, *, warn: bool = True) -> Checkpoint:
    """The newest complete checkpoint; damaged newer ones are skipped with a warning each."""
    found = list_checkpoints(run_path)
    if warn:
        for tmp in interrupted_writes(run_path):
            logger.warning(
                "ignoring %s: a checkpoint write that never finished (the run stopped while saving)", tmp.name
            )
    for ckpt in reversed(found):
        if ckpt.problem is None:
            return ckpt
        if warn:
            logger.warning("skipping checkpoint %s: %s", ckpt.path.name, ckpt.problem)
    if found:
        raise UserError(
            f"run {run_path} has no usable checkpoint: " + "; ".join(f"{c.path.name}: {c.problem}" for c in found)
        )
    raise NoCheckpointError(
        f"run {run_path} has no checkpoint (checkpoints are written every trainer.save_freq steps and at the end)"
    )


def checkpoint_at(run_path: Path, step: int | None) -> Checkpoint:
    """Step `step`'s checkpoint, or the latest complete one, verified (`verify`); errors say which steps exist."""
    if step is None:
        return verify(latest_checkpoint(run_path))
    found = {c.step: c for c in list_checkpoints(run_path)}
    if step not in found:
        have = ", ".join(str(s) for s in found) or "none"
        raise UserError(f"run {run_path} has no checkpoint of step {step} (checkpoints: {have})")
    if found[step].problem:
        raise UserError(f"checkpoint of step {step} in {run_path} cannot be used: {found[step].problem}")
    return verify(found[step])


def discard_after(run_path: Path, step: int) -> None:
    """Before resuming from `step`: remove interrupted writes and unusable newer checkpoints.

    They would collide with the checkpoints the resumed run writes for the same steps.
    """
    for tmp in interrupted_writes(run_path):
        shutil.rmtree(tmp, ignore_errors=True)
    for ckpt in list_checkpoints(run_path, check_files=False):
        if ckpt.step > step:
            logger.warning("removing checkpoint %s: the resumed run retrains that step", ckpt.path.name)
            shutil.rmtree(ckpt.path, ignore_errors=True)


# -- small durable-write helpers -----------------------------------------------------------
def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")
