"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

DCP keeps its index (`.metadata`) as a plain pickle and loads the non-tensor values of a state dict
(the optimizer's param_groups: floats, bools, tuples) with `torch.load(weights_only=False)`: a crafted
checkpoint would run its payload while being read. Checkpoints are verified against their sha256
manifest before anything reads them (rlkit.core.state.checkpoint.verify); as a second wall, the
reader here unpickles `.metadata` with only the classes DCP's index is made of, and the planner loads
non-tensor values with `weights_only=True`, so even a checkpoint whose manifest was rewritten to match
cannot run code.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import io
import pathlib
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from rlkit.errors import UserError

METADATA_FILE = ".metadata"  # DCP's index, in the checkpoint folder
_ALLOWED = {
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # layout by name, as weights_only allows
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,  # where each item lies in a file
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{
        ("pathlib", name): getattr(pathlib, name)
        for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path")
    },
}
# The index itself: the dataclasses and enums of DCP's metadata module (plain data, no behaviour on build).
_METADATA_MODULE = dcp_metadata.__name__


class UnsafeCheckpointError(UserError, pickle.UnpicklingError):
    """A checkpoint's pickle names something its format never holds (refused like any unusable checkpoint)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        found = getattr(dcp_metadata, name, None) if module == _METADATA_MODULE else None
        if (
            isinstance(found, type)
            and found.__module__ == module
            and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum))
        ):
            return found
        raise UnsafeCheckpointError(f"{module}.{name} is not part of a DCP index")


def read_metadata(path: Path) -> Metadata:
    """The DCP index `path`, unpickled with only the classes it is made of."""
    with open(path, "rb") as handle:
        try:
            metadata = _MetadataUnpickler(handle).load()
        except UnsafeCheckpointError as exc:
            raise UnsafeCheckpointError(f"{path} is not a plain DCP index ({exc}); it was not loaded") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{path} holds a {type(metadata).__name__}, not a DCP index; it was not loaded")
    return metadata


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, with `.metadata` read by `read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:  # what DCP's own reader fills in
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, loading non-tensor values with weights_only=True (plain data only)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load(state: dict[str, Any], folder: Path, *, no_dist: bool = False) -> None:
    """`dcp.load(state, checkpoint_id=folder)` through the reader and planner above."""
    # Refused here, as a plain UserError: inside dcp.load it would arrive wrapped in a CheckpointException.
    read_metadata(folder / METADATA_FILE)
    with warnings.catch_warnings():
        if no_dist:  # "torch.distributed is not initialized": intended, one process reads all
            warnings.simplefilter("ignore", UserWarning)
        dcp.load(
            state,
            checkpoint_id=str(folder),
            storage_reader=SafeFileSystemReader(str(folder)),
            planner=SafeLoadPlanner(),
            no_dist=no_dist,
        )
