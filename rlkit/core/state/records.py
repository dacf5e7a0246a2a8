"""Recorded rollouts (trainer.record_rollouts): each step's batch, as the actor update received it.

    runs/<id>/rollouts/step_00000003.parquet
      one row per sampled sequence: every tensor of the batch (token ids, masks, scores,
      rollout / old / reference log-probs, advantages, returns, ...) as fixed-width lists,
      and the row's prompt index, data source, ground truth and extra info;
      file metadata "rlkit": {"step", "metrics" (the step's logged metrics), "dtypes"}

`rlkit replay` runs the update again on it, `rlkit inspect` shows it. Values round-trip
exactly (float32 stays float32), which is what lets a replay reproduce a step bit for bit.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

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
    """Writes each step's batch when trainer.record_rollouts is on; does nothing otherwise."""

    def __init__(self, run_path: Path | None) -> None:
        self.run_path = run_path  # None: recording is off

    @classmethod
    def for_run(cls, config: RLConfig, run_path: Path) -> RolloutRecorder:
        return cls(run_path if config.trainer.record_rollouts else None)

    def add_trainer_log_probs(
        self, batch: Batch, log_probs: Callable[[Batch, str], dict[str, torch.Tensor]], inputs: UpdateInputs
    ) -> None:
        """Right before the update, on a step with engine log-probs but no old-log-prob pass (`inputs`): keep the
        trainer's per-token log-probs too (`rlkit inspect` shows the gap per token). Not used by the update."""
        if self.run_path is not None and inputs.rollout_log_probs and inputs.old_log_probs_from_update:
            batch["trainer_log_probs"] = log_probs(batch, "actor")["log_probs"]

    def record(self, step: int, batch: Batch, metrics: dict[str, Any]) -> Path | None:
        if self.run_path is None:
            return None
        return write_record(record_path(self.run_path, step), step, batch, metrics)


def write_record(path: Path, step: int, batch: Batch, metrics: dict[str, Any]) -> Path:
    """The batch as parquet, atomically (a killed run leaves no half-written step)."""
    columns: dict[str, pa.Array] = {}
    for key, tensor in batch.tensors.items():
        values = tensor.detach().cpu().contiguous().numpy()
        flat = pa.array(values.reshape(-1))
        columns[key] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1]) if values.ndim == 2 else flat
    for key, values in batch.meta.items():
        columns[META_COLUMN + key] = pa.array([json.dumps(v) for v in values])
    info = {
        "step": step,
        "metrics": {k: _plain(v) for k, v in metrics.items()},
        "dtypes": {k: str(t.dtype).removeprefix("torch.") for k, t in batch.tensors.items()},
    }
    table = pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(info)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def read_record(run_path: Path, step: int | None = None) -> Record:
    """Step `step`'s record (default: the newest); UserError naming the recorded steps if there is none."""
    steps = recorded_steps(run_path)
    if not steps:
        raise UserError(f"run {Path(run_path).name} recorded no rollouts; train with trainer.record_rollouts=true")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise UserError(f"run {Path(run_path).name} has no recorded batch of step {step} (recorded: {_ranges(steps)})")
    table = pq.read_table(record_path(run_path, step))
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
    return Record(step=int(info["step"]), batch=Batch(tensors, meta), metrics=info["metrics"])


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
