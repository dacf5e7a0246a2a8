"""Recorded rollouts (trainer.record_rollouts, on by default): the last steps' batches, as the actor update got them.

    runs/<id>/rollouts/step_00000003.parquet
      one row per sampled sequence: every tensor of the batch (token ids, masks, scores,
      rollout / old / reference log-probs, advantages, returns, ...) as fixed-width lists,
      and the row's prompt index, data source, ground truth and extra info;
      file metadata "rlkit": {"step", "metrics" (the step's logged metrics), "dtypes"}

`rlkit replay` runs the update again on it, `rlkit inspect` shows it. Values round-trip
exactly (float32 stays float32), which is what lets a replay reproduce a step bit for bit.

A ring of trainer.record_keep_steps steps: once step N is written, records of steps up to
N - keep are deleted (newer ones, left by a killed run whose steps the resumed run redoes, are
overwritten as it reaches them). A record is written to a hidden temporary file and renamed, so
a SIGKILL mid-write leaves at most that temporary file, which nothing reads and the next start of
the run deletes. Nothing a resume reads lives here: pruning touches only RUN/rollouts/.

The step's values are copied into an Arrow table at once (~0.1 s for a 786k-token step); compressing
and writing it (~1.5 s there) runs on a thread of its own while the next step goes on, one write in
flight at a time. A write that fails (a full disk) is logged and the run goes on: records are for
looking, nothing trains on them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

from rlkit.core.batch import Batch
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

logger = logging.getLogger("rlkit")
RECORDS_DIR = "rollouts"
METADATA_KEY = b"rlkit"
META_COLUMN = "meta/"  # prefix of the columns that hold Batch.meta
_STEP_FILE = re.compile(r"^step_(\d+)\.parquet$")


@dataclass
class Record:
    step: int
    batch: Batch
    metrics: dict[str, Any]


def record_path(run_path: Path, step: int) -> Path:
    return Path(run_path) / RECORDS_DIR / f"step_{step:08d}.parquet"


class RolloutRecorder:
    """Writes each step's batch when trainer.record_rollouts is on, keeping the last `keep_steps`
    (0: all); does nothing otherwise."""

    def __init__(self, run_path: Path | None, keep_steps: int = 0) -> None:
        self.run_path = run_path  # None: recording is off
        self.keep_steps = keep_steps
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="rlkit-record") if run_path is not None else None
        self._pending: tuple[int, Future[None]] | None = None  # the step being written

    @classmethod
    def for_run(cls, config: RLConfig, run_path: Path) -> RolloutRecorder:
        """The run's recorder; a write a killed run left half done is deleted first."""
        discard_partial_writes(run_path)
        on = config.trainer.record_rollouts
        return cls(run_path if on else None, config.trainer.record_keep_steps)

    @property
    def on(self) -> bool:
        """Steps are recorded: a step with engine log-probs but no old-log-prob pass also keeps the trainer's
        per-token log-probs, which its update hands back (UpdateInputs.keep_log_probs), for `rlkit inspect`."""
        return self.run_path is not None

    def record(self, step: int, batch: Batch, metrics: dict[str, Any]) -> Path | None:
        """Copy the step's batch and start writing it (wait() until it is on disk); the path it will have."""
        if self.run_path is None or self._writer is None:
            return None
        try:
            table = record_table(step, batch, metrics)
        except Exception as exc:  # noqa: BLE001 - as a failed write: this step goes unrecorded, training goes on
            _lost(step, exc)
            return None
        self.wait()
        path = record_path(self.run_path, step)
        self._pending = step, self._writer.submit(self._write, path, table, step)
        return path

    def wait(self) -> None:
        """Until the last record is on disk (or its write failed: logged, the run goes on)."""
        if self._pending is None:
            return
        (step, pending), self._pending = self._pending, None
        try:
            pending.result()
        except Exception as exc:  # noqa: BLE001 - a record is for looking: losing one must not stop training
            _lost(step, exc)

    def close(self) -> None:
        self.wait()
        if self._writer is not None:
            self._writer.shutdown()

    def _write(self, path: Path, table: pa.Table, step: int) -> None:
        write_table(path, table)
        if self.keep_steps and self.run_path is not None:
            for old in recorded_steps(self.run_path):
                if old <= step - self.keep_steps:
                    record_path(self.run_path, old).unlink(missing_ok=True)


def _lost(step: int, exc: Exception) -> None:
    logger.warning("recording step %d's rollouts failed (%s: %s); training goes on", step, type(exc).__name__, exc)


def discard_partial_writes(run_path: Path) -> None:
    """Delete the temporary files of records whose write was killed (they were never renamed into place)."""
    folder = Path(run_path) / RECORDS_DIR
    if folder.is_dir():
        for tmp in folder.glob(".step_*.tmp"):
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def write_record(path: Path, step: int, batch: Batch, metrics: dict[str, Any]) -> Path:
    """The batch as parquet, atomically (a killed run leaves no half-written step)."""
    return write_table(path, record_table(step, batch, metrics))


def record_table(step: int, batch: Batch, metrics: dict[str, Any]) -> pa.Table:
    """The batch's values (copied: the table does not share memory with the batch) and the step's metrics."""
    columns: dict[str, pa.Array] = {}
    for key, tensor in batch.tensors.items():
        # numpy has no bfloat16: stored as float32 (exact), read back as bfloat16 from "dtypes"
        wide = tensor.detach().float() if tensor.dtype == torch.bfloat16 else tensor.detach()
        values = wide.to("cpu", copy=True).contiguous().numpy()
        flat = pa.array(values.reshape(-1))
        columns[key] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1]) if values.ndim == 2 else flat
    for key, values in batch.meta.items():
        # default=str: a value JSON cannot hold (bytes, a date from a parquet column) is shown as text
        columns[META_COLUMN + key] = pa.array([json.dumps(v, default=str) for v in values])
    info = {
        "step": step,
        "metrics": {k: _plain(v) for k, v in metrics.items()},
        "dtypes": {k: str(t.dtype).removeprefix("torch.") for k, t in batch.tensors.items()},
    }
    return pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(info)})


def write_table(path: Path, table: pa.Table) -> Path:
    """Write to a hidden temporary file, then rename: the step's file is whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def read_record(run_path: Path, step: int | None = None) -> Record:
    """Step `step`'s record (default: the newest); UserError naming the file, the recorded steps and the option."""
    steps = recorded_steps(run_path)
    if not steps or (step is not None and step not in steps):
        raise UserError(missing_record_message(run_path, step, steps))
    step = steps[-1] if step is None else step
    try:
        table = pq.read_table(record_path(run_path, step))
    except FileNotFoundError:  # pruned by the running run since it was listed
        raise UserError(missing_record_message(run_path, step, recorded_steps(run_path))) from None
    info = json.loads(table.schema.metadata[METADATA_KEY])
    tensors, meta = {}, {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if name.startswith(META_COLUMN):
            meta[name[len(META_COLUMN) :]] = [json.loads(v) for v in column.to_pylist()]
            continue
        dtype = getattr(torch, info["dtypes"][name])
        if isinstance(column, pa.FixedSizeListArray):
            values = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
        else:
            values = column.to_numpy(zero_copy_only=False)
        tensors[name] = torch.from_numpy(np.array(values)).to(dtype)
    if "rollout_log_probs" in tensors and "rollout_log_prob_rows" not in tensors:  # recorded when all rows had them
        tensors["rollout_log_prob_rows"] = torch.ones(len(tensors["rollout_log_probs"]), dtype=torch.bool)
    return Record(step=int(info["step"]), batch=Batch(tensors, meta), metrics=info["metrics"])


def missing_record_message(run_path: Path, step: int | None, steps: list[int]) -> str:
    """Why step `step`'s record (None: any record) is not on disk, and which option to set."""
    run_path = Path(run_path)
    trainer = _saved_trainer_options(run_path)
    what = f"step {step}'s batch ({record_path(run_path, step)})" if step is not None else "no recorded step"
    if not steps:
        where = f"{run_path / RECORDS_DIR}/ holds no step_N.parquet"
        if trainer.get("record_rollouts") is False:
            return (
                f"run {run_path.name}: {what} is missing: {where}, the run trained with "
                "trainer.record_rollouts=false. Train, or resume, with trainer.record_rollouts=true"
            )
        return f"run {run_path.name}: {what} is missing: {where} (no step has finished since recording was on)"
    keep = trainer.get("record_keep_steps")
    why = (
        f"the run keeps only the last trainer.record_keep_steps={keep}"
        if isinstance(keep, int) and keep > 0 and step is not None and step < steps[-1]
        else "that step was not recorded"
    )
    return (
        f"run {run_path.name}: {what} is not on disk: {why} (recorded: {_ranges(steps)}). To keep more, "
        "train with trainer.record_keep_steps=0 (every step) or a larger number"
    )


def _saved_trainer_options(run_path: Path) -> dict[str, Any]:
    """The run's trainer.* options as its config.yaml saved them ({} when unreadable)."""
    try:
        saved = yaml.safe_load((run_path / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    trainer = saved.get("trainer") if isinstance(saved, dict) else None
    return trainer if isinstance(trainer, dict) else {}


def recorded_steps(run_path: Path) -> list[int]:
    folder = Path(run_path) / RECORDS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
