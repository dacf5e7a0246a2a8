"""Checkpoints are verified before they are read, and their pickles cannot run code (no Ray, no training)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_export_files import checkpointed_run

from rlkit.core.controller.offline_eval import resolve_target
from rlkit.core.controller.resume import resume_run
from rlkit.core.state import checkpoint, safe_load
from rlkit.core.state.checkpoint import MARKER, checkpoint_at, write_checkpoint
from rlkit.core.train.export import export_hf
from rlkit.core.state.shards import MODEL_KEY, SHARDS_DIR
from rlkit.errors import UserError

METADATA = Path("policy") / SHARDS_DIR / ".metadata"


def dcp_checkpoint(run: Path, step: int = 1) -> Path:
    """A real DCP checkpoint of a two-element tensor and a float (a param_groups-like value), via write_checkpoint."""
    def shards(folder: Path) -> None:
        state = {MODEL_KEY: {"w": torch.tensor([1.0, 2.0])}, "optim": {"lr": 0.5}}
        dcp.save(state, checkpoint_id=str(folder / "policy" / SHARDS_DIR), no_dist=True)
        (folder / "policy" / "rank_0.pt").write_bytes(b"r" * 20)

    return write_checkpoint(run, step, reason="final", write_shards=shards, trainer_state={}, controller_rng={},
                            config_yaml="recipe: test\n", keep_last=3)


class CreatesFile:
    """Unpickling this creates `path`: what a crafted checkpoint's payload would do."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def rehash(folder: Path) -> None:
    """What an attacker who can write the checkpoint does: make the manifest match the files again."""
    manifest = json.loads((folder / MARKER).read_text())
    for name in manifest["files"]:
        manifest["files"][name] = (folder / name).stat().st_size
        manifest["sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / MARKER).write_text(json.dumps(manifest))


def test_the_manifest_holds_every_files_sha256(tmp_path) -> None:
    folder = dcp_checkpoint(tmp_path)
    manifest = json.loads((folder / MARKER).read_text())
    names = ["config.yaml", "controller_rng.pt", "policy/rank_0.pt", "policy/shards/.metadata",
             "policy/shards/__0_0.distcp", "trainer_state.json"]
    assert sorted(manifest["sha256"]) == sorted(manifest["files"]) == names
    assert manifest["sha256"]["policy/rank_0.pt"] == "882c9656cf8a964d384d9d839b6a2747cc8323c2f0c87b59bf06af39bd5bb51e"
    assert checkpoint.verify(checkpoint_at(tmp_path, 1)).step == 1
    loaded = {MODEL_KEY: {"w": torch.zeros(2)}, "optim": {"lr": 0.0}}
    safe_load.load(loaded, folder / "policy" / SHARDS_DIR, no_dist=True)
    assert loaded[MODEL_KEY]["w"].tolist() == [1.0, 2.0] and loaded["optim"]["lr"] == 0.5


def test_a_changed_missing_or_extra_file_is_refused_by_name(tmp_path) -> None:
    folder = dcp_checkpoint(tmp_path)
    (folder / "policy" / "rank_0.pt").write_bytes(b"R" * 20)  # same size: only the hash sees it
    with pytest.raises(UserError) as changed:
        checkpoint_at(tmp_path, 1)
    assert str(changed.value) == (f"checkpoint {folder}: {folder}/policy/rank_0.pt does not match the sha256 its "
                                  "manifest recorded (changed or corrupted since it was written); it was not loaded. "
                                  "Delete the checkpoint folder to fall back to the previous one")
    (folder / "policy" / "rank_0.pt").write_bytes(b"r" * 20)
    (folder / "policy" / SHARDS_DIR / "__1_0.distcp").write_bytes(b"")
    with pytest.raises(UserError, match=r"holds .*/policy/shards/__1_0\.distcp, which its manifest does not list"):
        checkpoint_at(tmp_path, None)
    (folder / "policy" / SHARDS_DIR / "__1_0.distcp").unlink()
    (folder / "trainer_state.json").unlink()
    with pytest.raises(UserError, match="checkpoint of step 1 in .* cannot be used: trainer_state.json is missing"):
        checkpoint_at(tmp_path, 1)


def test_a_checkpoint_without_hashes_is_refused_unless_accepted(tmp_path, monkeypatch, caplog) -> None:
    folder = dcp_checkpoint(tmp_path)
    manifest = json.loads((folder / MARKER).read_text())
    del manifest["sha256"]  # as rlkit wrote manifests before they held hashes
    (folder / MARKER).write_text(json.dumps(manifest))
    with pytest.raises(UserError) as refused:
        checkpoint_at(tmp_path, 1)
    assert str(refused.value) == (f"checkpoint {folder} has no sha256 manifest (written by an older rlkit), so it "
                                  "cannot be verified; if you trust where it came from, set "
                                  "RLKIT_ACCEPT_UNHASHED_CHECKPOINTS=1 to load it")
    monkeypatch.setenv("RLKIT_ACCEPT_UNHASHED_CHECKPOINTS", "1")
    with caplog.at_level(logging.WARNING):
        assert checkpoint_at(tmp_path, 1).path == folder
    assert f"loading checkpoint {folder} without verifying it" in caplog.text


def test_a_crafted_metadata_pickle_never_runs(tiny_model_dir, tmp_path) -> None:
    run = checkpointed_run(tmp_path, tiny_model_dir)
    folder = run.path / "checkpoints" / "step_00000001"
    control, marker = tmp_path / "control", tmp_path / "pwned"
    # The payload is live: DCP's own reader runs it.
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / ".metadata").write_bytes(pickle.dumps(CreatesFile(control)))
    dcp.FileSystemReader(str(tmp_path / "copy")).read_metadata()
    assert control.exists()

    crafted = pickle.dumps(CreatesFile(marker))  # padded to the real index's size: only the hash tells them apart
    (folder / METADATA).write_bytes(crafted + b"\0" * ((folder / METADATA).stat().st_size - len(crafted)))
    mismatch = r"policy/shards/\.metadata does not match the sha256"
    with pytest.raises(UserError, match=mismatch):
        export_hf(run, tmp_path / "hf")
    with pytest.raises(UserError, match=mismatch):  # the checkpoint resume would load: refused before any worker
        resume_run(str(run.path), [])
    with pytest.raises(UserError, match=mismatch):
        resolve_target(str(run.path), step=None, overrides=[], runs_dir=tmp_path / "runs")
    assert not marker.exists() and not (tmp_path / "hf").exists()

    rehash(folder)  # the manifest now vouches for the payload: the restricted unpickler still refuses it
    with pytest.raises(UserError) as refused:
        export_hf(run, tmp_path / "hf")
    assert str(refused.value) == (f"{folder / METADATA} is not a plain DCP index (io.open is not part of a DCP "
                                  "index); it was not loaded")
    with pytest.raises(UserError, match="is not a plain DCP index"):  # what a resumed worker reads it with
        safe_load.load({MODEL_KEY: {}}, folder / "policy" / SHARDS_DIR)
    assert not marker.exists()


def test_non_tensor_values_load_only_as_plain_data(tmp_path) -> None:
    marker = tmp_path / "pwned"
    payload = io.BytesIO()
    torch.save(CreatesFile(marker), payload)
    payload.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        safe_load.SafeLoadPlanner().load_bytes(None, payload)
    assert not marker.exists()
