"""Checkpoint folders: atomic writes, markers and manifests, choosing one to resume from, rotation."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlkit.core.state import checkpoint
from rlkit.core.state.checkpoint import (
    MARKER,
    checkpoint_at,
    discard_after,
    latest_checkpoint,
    list_checkpoints,
    step_dir_name,
    write_checkpoint,
)
from rlkit.errors import UserError


def fake_shards(folder: Path) -> None:
    """What the workers write, in miniature: a shard file per rank and DCP's metadata."""
    (folder / "policy" / "shards").mkdir(parents=True)
    (folder / "policy" / "shards" / "__0_0.distcp").write_bytes(b"x" * 1000)
    (folder / "policy" / "shards" / ".metadata").write_bytes(b"m" * 10)
    (folder / "policy" / "rank_0.pt").write_bytes(b"r" * 20)


def save(run: Path, step: int, keep_last: int = 10) -> Path:
    return write_checkpoint(run, step, reason="periodic", write_shards=fake_shards,
                            trainer_state={"sampler": {"epoch": 0, "position": 4 * step}},
                            controller_rng={"seed": step}, config_yaml="recipe: test\n", keep_last=keep_last)


def test_a_written_checkpoint_is_complete_and_lists_every_file_with_its_size(tmp_path: Path) -> None:
    path = save(tmp_path, 3)
    assert path == tmp_path / "checkpoints" / "step_00000003"
    manifest = json.loads((path / MARKER).read_text())
    assert manifest["step"] == 3
    assert manifest["files"]["policy/shards/__0_0.distcp"] == 1000
    assert set(manifest["files"]) == {"policy/shards/__0_0.distcp", "policy/shards/.metadata", "policy/rank_0.pt",
                                      "trainer_state.json", "config.yaml", "controller_rng.pt"}
    state = json.loads((path / "trainer_state.json").read_text())
    assert (state["step"], state["reason"], state["sampler"]) == (3, "periodic", {"epoch": 0, "position": 12})
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_write_killed_before_its_marker_leaves_only_a_tmp_folder_that_resume_ignores(tmp_path, monkeypatch,
                                                                                          caplog) -> None:
    save(tmp_path, 1)

    def killed(point: str, step: int | None = None) -> None:
        if point == "checkpoint-before-marker":
            raise SystemExit("killed")

    monkeypatch.setattr(checkpoint.faults, "reached", killed)
    with pytest.raises(SystemExit):
        save(tmp_path, 2)
    assert (tmp_path / "checkpoints" / ".tmp-step_00000002").is_dir()
    assert not (tmp_path / "checkpoints" / "step_00000002").exists()
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path).step == 1
    assert "ignoring .tmp-step_00000002: a checkpoint write that never finished" in caplog.text
    discard_after(tmp_path, 1)
    assert not (tmp_path / "checkpoints" / ".tmp-step_00000002").exists()


def test_a_folder_without_marker_is_skipped_with_a_warning(tmp_path, caplog) -> None:
    save(tmp_path, 1)
    (save(tmp_path, 2) / MARKER).unlink()
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path).step == 1
    assert "skipping checkpoint step_00000002: it has no COMPLETE marker" in caplog.text


def test_a_truncated_file_is_named_and_the_previous_checkpoint_is_used(tmp_path, caplog) -> None:
    save(tmp_path, 1)
    shard = save(tmp_path, 2) / "policy" / "shards" / "__0_0.distcp"
    shard.write_bytes(b"x" * 400)
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path).step == 1
    assert ("skipping checkpoint step_00000002: policy/shards/__0_0.distcp has 400 bytes, the manifest says 1000"
            in caplog.text)
    assert [(c.step, c.problem is None) for c in list_checkpoints(tmp_path)] == [(1, True), (2, False)]


def test_a_missing_file_is_named(tmp_path) -> None:
    (save(tmp_path, 1) / "policy" / "rank_0.pt").unlink()
    assert list_checkpoints(tmp_path)[0].problem == "policy/rank_0.pt is missing"


def test_no_usable_checkpoint_is_a_user_error_that_says_why(tmp_path) -> None:
    with pytest.raises(UserError, match=r"has no checkpoint \(checkpoints are written every"):
        latest_checkpoint(tmp_path)
    (save(tmp_path, 1) / MARKER).write_text("{not json")
    with pytest.raises(UserError, match="no usable checkpoint: step_00000001: its COMPLETE marker is unreadable"):
        latest_checkpoint(tmp_path)


def test_keep_last_deletes_the_oldest_complete_checkpoints(tmp_path) -> None:
    for step in range(1, 6):
        save(tmp_path, step, keep_last=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [4, 5]


def test_discard_after_removes_newer_checkpoints_the_resumed_run_will_rewrite(tmp_path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step)
    discard_after(tmp_path, 1)
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]


def test_saving_a_step_twice_keeps_the_first_complete_write(tmp_path) -> None:
    first = save(tmp_path, 4)
    stamp = (first / MARKER).stat().st_mtime_ns
    assert save(tmp_path, 4) == first
    assert (first / MARKER).stat().st_mtime_ns == stamp


def test_checkpoint_at_a_step_or_the_latest(tmp_path) -> None:
    for step in (2, 4):
        save(tmp_path, step)
    assert checkpoint_at(tmp_path, None).step == 4
    assert checkpoint_at(tmp_path, 2).path.name == step_dir_name(2)
    with pytest.raises(UserError, match=r"no checkpoint of step 3 .*\(checkpoints: 2, 4\)"):
        checkpoint_at(tmp_path, 3)
