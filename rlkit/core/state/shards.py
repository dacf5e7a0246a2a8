"""What one worker writes into a checkpoint, and reads back on resume.

Every rank of a worker group calls `save_shards`/`load_shards` with the same folder at the
same time (torch.distributed.checkpoint is collective):
  <folder>/shards/     the FSDP2-sharded model and optimizer (DCP: one file per rank + .metadata);
                       only trainable weights (with LoRA: the adapters), frozen ones are the base model's
  <folder>/rank_<r>.pt what is local to a rank: RNG states and the LR scheduler

They are read back through rlkit.core.state.safe_load (DCP's pickled index and non-tensor
values without running code), after the controller verified the checkpoint's sha256 manifest.
DCP re-shards on load, but rlkit refuses a resume on another world size anyway (per-rank
RNG streams and rollout seeds would differ), so shards are read back by the rank that wrote them.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkit.core.state.disk_errors import disk_full_error

# torch.distributed.checkpoint is imported where shards are written and read: the controller imports
# this module (RNG states) through the worker classes, and has no use for DCP (~0.7 s to import).

SHARDS_DIR = "shards"
MODEL_KEY = "model"  # DCP keys are "model.<HF parameter name>" and "optim.<...>"
OPTIM_KEY = "optim"


def rng_state() -> dict[str, Any]:
    """The process's python, numpy and torch (CPU and CUDA) RNG states, loadable with weights_only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_rng(seed: int) -> None:
    """Seed the process's python, numpy and torch RNGs (the states `rng_state` saves)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_shards(
    folder: str | Path, rank: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None
) -> None:
    """Collective: every rank of the group at once. `scheduler` is None for a constant learning rate."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = _trainable_state(model, optimizer)
    try:
        dcp.save({MODEL_KEY: model_state, OPTIM_KEY: optim_state}, checkpoint_id=str(folder / SHARDS_DIR))
    except (Exception, CheckpointException) as exc:  # a full disk hidden in DCP's: an OSError crosses Ray intact
        error = disk_full_error(folder / SHARDS_DIR, exc)
        if error is None:
            raise
        raise OSError(error.errno, error.strerror, str(folder / SHARDS_DIR)) from exc
    local = {"rng": rng_state(), "scheduler": scheduler.state_dict() if scheduler is not None else None}
    write_durably(folder / f"rank_{rank}.pt", local)


def load_shards(
    folder: str | Path, rank: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    from rlkit.core.state import safe_load

    folder = Path(folder)
    model_state, optim_state = _trainable_state(model, optimizer)
    state = {MODEL_KEY: model_state, OPTIM_KEY: optim_state}
    safe_load.load(state, folder / SHARDS_DIR)
    # Frozen weights are not in a checkpoint: they stay what the model was built with.
    strict = not frozen_names(model)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state[MODEL_KEY],
        optim_state_dict=state[OPTIM_KEY],
        options=StateDictOptions(strict=strict),
    )
    local = torch.load(folder / f"rank_{rank}.pt", weights_only=True)
    if scheduler is not None:
        scheduler.load_state_dict(local["scheduler"])
    set_rng_state(local["rng"])


def frozen_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that do not train, tied aliases included (a tied LM head of a frozen embedding)."""
    return {name for name, param in model.named_parameters(remove_duplicate=False) if not param.requires_grad}


def _trainable_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The model's state dict without frozen weights (they come from the base model), and the optimizer's."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    frozen = frozen_names(model)
    return {k: v for k, v in model_state.items() if k not in frozen}, optim_state


def write_durably(path: Path, obj: Any) -> None:
    """torch.save + fsync: the bytes are on disk before the checkpoint's marker says so.

    Serialized in memory first (these are small: RNG states, a scheduler): torch's own file writer
    turns a full disk into "PytorchStreamWriter failed writing file", where Python's says ENOSPC."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with open(path, "wb") as handle:
        handle.write(buffer.getbuffer())
        handle.flush()
        os.fsync(handle.fileno())
