"""Where a run's numbers came from: rlkit's version and commit, package versions, data hashes, hardware.

`provenance.json` is written into the run directory when a run starts (fresh or resumed)
and copied into every checkpoint (rlkit.core.state.checkpoint), so a checkpoint says which
environment trained it. `rlkit resume` compares the checkpoint's record with the machine it
resumes on and warns, naming each difference: a resume that is exact on paper is not exact
on a different torch, a changed data file or other GPUs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import platform
from pathlib import Path
from typing import Any

from rlkit.core import environment
from rlkit.core.data.synthetic import SYNTHETIC_TRAIN_FILE
from rlkit.recipes.schema import RLConfig

PROVENANCE_FILE = "provenance.json"
logger = logging.getLogger("rlkit")


def data_files(config: RLConfig, run_path: Path) -> dict[str, Path]:
    """The data files a run reads, by the name the record keeps: data.train_files and data.val_files
    as configured, a generated synthetic task by its path inside the run directory (which may move)."""
    files = {f: Path(f).expanduser() for f in [*config.data.train_files, *config.data.val_files]}
    synthetic = Path(run_path) / SYNTHETIC_TRAIN_FILE
    if not config.data.train_files and synthetic.is_file():
        files = {str(SYNTHETIC_TRAIN_FILE): synthetic, **files}
    return files


def collect(config: RLConfig, run_path: Path) -> dict[str, Any]:
    """This process's environment, as the record a run directory and its checkpoints keep."""
    hashes = {}
    for name, file in data_files(config, run_path).items():
        try:
            hashes[name] = environment.file_sha256(file)
        except OSError as exc:
            hashes[name] = f"unreadable: {exc.strerror}"
    return {
        "rlkit": {"version": environment.rlkit_version(), **(environment.git_state() or {})},
        "python": platform.python_version(),
        "packages": environment.package_versions(),
        "data_files": hashes,
        "hardware": environment.hardware(),
        "written_at": dt.datetime.now().isoformat(timespec="seconds"),
    }


def write(run_path: Path, config: RLConfig) -> dict[str, Any]:
    """Record this environment in the run directory (new checkpoints copy it)."""
    record = collect(config, run_path)
    tmp = Path(run_path) / f".{PROVENANCE_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(Path(run_path) / PROVENANCE_FILE)
    return record


def read(folder: Path) -> dict[str, Any] | None:
    """The record in a run directory or checkpoint folder; None if it has none (older runs)."""
    try:
        return json.loads((Path(folder) / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed between two records, one phrase each (host, memory and times are not compared)."""
    changes = []

    def compare(what: str, a: Any, b: Any) -> None:
        if a != b:
            changes.append(f"{what} {_show(a)} -> {_show(b)}")

    compare("rlkit", old.get("rlkit", {}).get("version"), new.get("rlkit", {}).get("version"))
    compare("git commit", _commit(old), _commit(new))
    compare("python", old.get("python"), new.get("python"))
    old_packages, new_packages = old.get("packages", {}), new.get("packages", {})
    for package in sorted(set(old_packages) | set(new_packages)):
        compare(package, old_packages.get(package), new_packages.get(package))
    old_data, new_data = old.get("data_files", {}), new.get("data_files", {})
    for file in sorted(set(old_data) | set(new_data)):
        a, b = old_data.get(file), new_data.get(file)
        if a != b:
            changes.append(
                f"data file {file} "
                + ("is new" if a is None else "is gone" if b is None else f"sha256 {a[:12]} -> {b[:12]}")
            )
    old_hw, new_hw = old.get("hardware", {}), new.get("hardware", {})
    compare("CPU", old_hw.get("cpu"), new_hw.get("cpu"))
    compare("GPUs", _gpu_summary(old_hw), _gpu_summary(new_hw))
    return changes


def warn_if_changed(ckpt_path: Path, config: RLConfig, run_path: Path) -> list[str]:
    """Before a resume: log one warning naming what differs from the environment that wrote the checkpoint."""
    saved = read(ckpt_path)
    if saved is None:
        return []
    changes = differences(saved, collect(config, run_path))
    if changes:
        logger.warning(
            "the environment changed since checkpoint %s was written: %s. The resumed steps may "
            "differ from an uninterrupted run's (a resume is exact only in the same environment)",
            Path(ckpt_path).name,
            "; ".join(changes),
        )
    return changes


def summary_lines(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows for `rlkit runs show`."""
    rlkit = record.get("rlkit", {})
    commit = _commit(record)
    hw = record.get("hardware", {})
    rows = [
        ("rlkit", f"{rlkit.get('version', '?')}" + (f", commit {commit}" if commit else "")),
        ("python", str(record.get("python", "?"))),
        ("packages", ", ".join(f"{k} {v}" for k, v in record.get("packages", {}).items() if v)),
    ]
    rows += [(f"data {Path(f).name}", f"sha256 {h[:16]}  ({f})") for f, h in record.get("data_files", {}).items()]
    rows.append(
        (
            "hardware",
            f"{hw.get('host', '?')}: {hw.get('cpu', '?')} x{hw.get('cpu_count', '?')}, "
            f"{hw.get('memory_gib', '?')} GiB; GPUs: {_gpu_summary(hw) or 'none'}",
        )
    )
    rows.append(("recorded", str(record.get("written_at", "?"))))
    return rows


def _commit(record: dict[str, Any]) -> str | None:
    rlkit = record.get("rlkit", {})
    if not rlkit.get("commit"):
        return None
    return rlkit["commit"][:12] + (" (with local changes)" if rlkit.get("dirty") else "")


def _gpu_summary(hw: dict[str, Any]) -> str:
    names: dict[str, int] = {}
    for gpu in hw.get("gpus", []):
        key = f"{gpu.get('name')} ({gpu.get('memory_gib')} GiB)"
        names[key] = names.get(key, 0) + 1
    return ", ".join(f"{count} x {name}" for name, count in names.items())


def _show(value: Any) -> str:
    return "(none)" if value in (None, "") else str(value)
