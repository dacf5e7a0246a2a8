"""A disk that fills during a checkpoint: the error says so and names the path, the partial write is removed,
status.json says failed (no Ray: a stand-in controller; a real full disk is a 4 MB tmpfs when we may mount one)."""

from __future__ import annotations

import errno
import json
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.core.cluster.failures import CheckpointWriteError, WorkerFailure
from rlkit.core.controller import loop
from rlkit.core.controller.controller import Controller, save_run_checkpoint
from rlkit.core.controller.preflight import RunInputs
from rlkit.core.state.run_dir import RunDir
from rlkit.core.state.checkpoint import MARKER, list_checkpoints
from rlkit.core.state.shards import save_shards, write_durably
from rlkit.recipes.loader import load_config
from rlkit.core.startup import StartupClock

FLOATS_BY_STEP = {1: 1_000, 2: 2_000_000}  # step 2's shard (8 MB) does not fit on the 4 MB disk


class ShardWriter:
    """A worker group that writes one shard per checkpoint, or fails as a full disk would when `full`."""

    def __init__(self, full: bool) -> None:
        self.full, self.step = full, 0

    def call(self, method, folder: str, phase: str) -> None:
        shard = Path(folder) / "rank_0.pt"
        shard.parent.mkdir(parents=True)
        if self.full and self.step == 2:
            shard.write_bytes(b"x" * 4096)  # what fitted before the disk filled
            raise WorkerFailure("worker rank 0 raised OSError during 'save checkpoint (policy)'",
                                cause=OSError(errno.ENOSPC, "No space left on device", str(shard)))
        write_durably(shard, torch.zeros(FLOATS_BY_STEP[self.step]))


class CheckpointingController:
    """The run loop's view of a controller: steps that log a reward, checkpoints through save_run_checkpoint."""

    TRAIN_KEY, VAL_KEY = Controller.TRAIN_KEY, Controller.VAL_KEY
    group: ShardWriter

    def __init__(self, config, run: RunDir, inputs: RunInputs) -> None:
        self.config, self.run, self.completed_steps = config, run, 0
        self.tokenizer = self.scorer = None
        self.startup = StartupClock.from_launch()  # the loop marks the first validation and step on it
        self.placement = SimpleNamespace(rollout=None)
        self.fast_paths = SimpleNamespace(describe=lambda: "fast paths: none (a stand-in)")

    def step(self, step: int) -> dict[str, float]:
        return {"reward/mean": 0.5}

    def checkpoint_groups(self) -> dict[str, ShardWriter]:
        return {"policy": self.group}

    def save_checkpoint(self, reason: str) -> Path:
        self.group.step = self.completed_steps
        return save_run_checkpoint(self.config, self.run, self.completed_steps, reason, self.checkpoint_groups(), {})

    def close(self) -> None:
        pass


def train_two_steps(runs_dir: Path, monkeypatch, full: bool) -> RunDir:
    CheckpointingController.group = ShardWriter(full)
    monkeypatch.setattr(loop, "Controller", CheckpointingController)
    config = load_config("grpo-demo", [f"trainer.runs_dir={runs_dir}", "trainer.logger=[jsonl]", "trainer.val_freq=0",
                                       "trainer.total_steps=2", "trainer.save_freq=1"])
    run = RunDir.create(config, "r")
    with pytest.raises(CheckpointWriteError) as failed:
        loop.run_training(config, run, RunInputs(model_path="", tokenizer=None, rows=[]))
    tmp = run.path / "checkpoints" / ".tmp-step_00000002"
    message = str(failed.value)
    assert message.startswith(f"could not write the checkpoint of step 2 to {tmp}: [Errno 28] No space left on "
                              "device"), message
    assert "(ENOSPC: " in message and " free there now; the last checkpoint took " in message
    assert not tmp.exists()  # the space is given back
    assert [c.step for c in list_checkpoints(run.path) if c.problem is None] == [1]
    status = json.loads((run.path / "status.json").read_text())
    assert status["status"] == "failed" and status["error"].startswith("CheckpointWriteError: " + message[:60])
    return run


def test_a_full_disk_reported_by_a_worker_fails_the_run_cleanly(tmp_path, monkeypatch) -> None:
    train_two_steps(tmp_path / "runs", monkeypatch, full=True)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 4 MB tmpfs (root only; skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_really_full_disk_fails_the_run_cleanly(small_disk, monkeypatch) -> None:
    run = train_two_steps(small_disk / "runs", monkeypatch, full=False)
    first = json.loads((run.path / "checkpoints" / "step_00000001" / MARKER).read_text())["files"]
    assert f"the last checkpoint took {sum(first.values()) / 1e3:.1f} kB)" in run.read_status()["error"]


def test_dcp_shards_on_a_full_disk_raise_an_oserror_that_crosses_ray(small_disk) -> None:
    model = torch.nn.Linear(1000, 1000)  # 4 MB of weights: the disk is full before the optimizer state
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(OSError) as full:
        save_shards(small_disk / "policy", 0, model=model, optimizer=optimizer)
    assert (full.value.errno, full.value.filename) == (errno.ENOSPC, str(small_disk / "policy" / "shards"))
    assert pickle.loads(pickle.dumps(full.value)).errno == errno.ENOSPC
