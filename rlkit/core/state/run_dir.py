"""A run's directory and the inputs it resolves: model path, data files."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml
from rlkit.recipes.schema import RLConfig

TINY_PREFIX = "rlkit:"
STATUS_FILE = "status.json"
# status.json "status": running -> finished | failed | interrupted; "running" with a dead pid
# means the process was killed (SIGKILL, OOM, power): `read_status` reports that as "dead".
STATUSES = ("running", "finished", "failed", "interrupted")
# A run id is one folder name under runs_dir: never a path, never `.` or `..` (nor anything holding `..`),
# so neither a typo nor a crafted id can create, clean or read a folder outside runs_dir.
_RUN_ID = re.compile(r"[A-Za-z0-9._-]+")
RUN_ID_RULE = "a run id is letters, digits, '.', '_' and '-' only, without '..' (and not '.')"


def check_run_id(run_id: str) -> str:
    """`run_id` if it names one folder directly under runs_dir; a UserError naming it and the rule otherwise."""
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id or run_id == ".":
        raise UserError(f"run id {run_id!r} is not allowed: {RUN_ID_RULE}")
    return run_id


def is_run_id(run_id: str) -> bool:
    try:
        check_run_id(run_id)
    except UserError:
        return False
    return True


@dataclass
class RunDir:
    run_id: str
    path: Path
    restarted: bool = False  # create() reused the directory of a run that never wrote a checkpoint

    @classmethod
    def create(cls, config: RLConfig, run_id: str | None = None) -> RunDir:
        """A new run directory; an existing one is reused only if its run never wrote a checkpoint
        (nothing there to resume), and refused otherwise."""
        run_id = check_run_id(run_id if run_id is not None else f"{config.recipe}-{dt.datetime.now():%Y%m%d-%H%M%S}")
        path = Path(config.trainer.runs_dir).expanduser() / run_id
        restarted = path.exists() and any(path.iterdir())
        if restarted:
            problem = cls(run_id, path).why_not_restartable()
            if problem:
                raise UserError(f"run directory {path} already exists and {problem}")
            for child in path.iterdir():  # the failed attempt's logs, metrics and status
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create run directory {path}: {exc.strerror}; set trainer.runs_dir") from None
        (path / "config.yaml").write_text(config_to_yaml(config))
        return cls(run_id, path, restarted)

    def why_not_restartable(self) -> str | None:
        """Why `rlkit train --run-id` may not start this existing directory afresh, or None."""
        from rlkit.core.cluster.failures import resume_command
        from rlkit.core.state.checkpoint import list_checkpoints

        if self.path.is_symlink():  # starting afresh empties the folder: never one that may lie outside runs_dir
            return f"is a symbolic link (to {os.readlink(self.path)}); pick another --run-id"
        if not (self.path / "config.yaml").is_file():
            return "is not a run directory (no config.yaml); pick another --run-id"
        status = self.read_status()
        if status.get("status") == "running":
            return f"its run is still running (pid {status.get('pid')} on {status.get('host')}); pick another --run-id"
        complete = [c.step for c in list_checkpoints(self.path) if c.problem is None]
        if complete:
            return (
                f"holds checkpoints (the last of step {complete[-1]}); continue it with "
                f"`{resume_command(self.path, self.run_id)}`, or pick another --run-id"
            )
        return None

    @classmethod
    def open(cls, run: str, runs_dir: str | Path = "runs") -> RunDir:
        """An existing run: a run id under `runs_dir`, or a path to the run directory (the caller's own path,
        taken as given; only an id is joined to runs_dir, and it must pass `check_run_id`)."""
        path = find_run(run, runs_dir)
        if path is None:
            check_run_id(run)
            known = [r.run_id for r in list_runs(runs_dir)]
            hint = f" (runs there: {', '.join(known[-5:])})" if known else ""
            raise UserError(
                f"no run {run!r} in {Path(runs_dir).expanduser()}{hint}; pass --runs-dir or the run directory's path"
            )
        return cls(path.name, path)

    def write_status(self, status: str, **fields: Any) -> None:
        """Atomically replace status.json, keeping fields not given (step, last checkpoint, ...)."""
        assert status in STATUSES, status
        record = {
            **self._raw_status(),
            **fields,
            "status": status,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "updated_at": dt.datetime.now().isoformat(timespec="seconds"),
        }
        tmp = self.path / f".{STATUS_FILE}.tmp"
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, self.path / STATUS_FILE)

    def read_status(self) -> dict[str, Any]:
        """status.json, with "running" turned into "dead" when its process is gone from this host."""
        record = self._raw_status()
        if (
            record.get("status") == "running"
            and record.get("host") == socket.gethostname()
            and not _pid_alive(int(record.get("pid", 0)))
        ):
            record["status"] = "dead"
        return record or {"status": "unknown"}

    def _raw_status(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / STATUS_FILE).read_text())
        except (OSError, ValueError):
            return {}


def find_run(run: str, runs_dir: str | Path) -> Path | None:
    """The directory of run `run` (a path to a run directory, or a valid run id under runs_dir), or None."""
    as_path = Path(run).expanduser()
    if run and (as_path / "config.yaml").is_file():
        return as_path
    under = Path(runs_dir).expanduser() / run
    return under if is_run_id(run) and (under / "config.yaml").is_file() else None


def list_runs(runs_dir: str | Path) -> list[RunDir]:
    """Run directories (those with a config.yaml) under runs_dir, oldest first."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        return []
    runs = [RunDir(p.name, p) for p in root.iterdir() if (p / "config.yaml").is_file()]
    return sorted(runs, key=lambda r: (r.path / "config.yaml").stat().st_mtime)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resolve_model_path(spec: str, key: str = "model.path") -> str:
    """'rlkit:tiny-qwen2' builds (once) a tiny offline model; a local directory as an absolute path (it is written
    into exports, e.g. a LoRA adapter's base_model_name_or_path, read from other folders); else a hub id."""
    if spec.startswith(TINY_PREFIX):
        name = spec[len(TINY_PREFIX) :]
        if name != "tiny-qwen2":
            raise UserError(f"{key}={spec!r}: the only built-in model is 'rlkit:tiny-qwen2'")
        from rlkit.core.bytecode import cache_root
        from rlkit.core.tiny import build_tiny_qwen2, is_current

        cache = cache_root() / name
        if not is_current(cache):
            build_tiny_qwen2(cache)
        return str(cache)
    local = Path(spec).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise UserError(f"{key}={spec}: the directory has no config.json (not a transformers model)")
        return str(local.resolve())
    return spec


def prepare_val_files(config: RLConfig, run_path: Path) -> list[str]:
    """The validation parquet files: data.val_files, or a synthetic task's test split when the run
    trains on that task with trainer.val_freq > 0; [] for no validation."""
    data = config.data
    if data.val_files:
        return [str(Path(f).expanduser()) for f in data.val_files]
    if data.synthetic_task and not data.train_files and config.trainer.val_freq > 0:
        return [_synthetic_split(config, run_path, "test", "val.parquet")]
    return []


def _synthetic_split(config: RLConfig, run_path: Path, split: str, name: str) -> str:
    """data.synthetic_task's `split` (deterministic in trainer.seed), written into RUN/data/."""
    from rlkit.core.data.builders import write_parquet
    from rlkit.core.data.synthetic import build_synthetic

    rows = build_synthetic(task=config.data.synthetic_task, seed=config.trainer.seed)[split]
    return str(write_parquet(rows, run_path / "data" / name))
