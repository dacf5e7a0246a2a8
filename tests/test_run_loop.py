"""The run loop around the controller, with a stand-in controller (no Ray, no model)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.core.controller import loop
from rlkit.core.controller.controller import Controller
from rlkit.core.controller.preflight import RunInputs
from rlkit.core.state.run_dir import RunDir
from rlkit.core.controller.tracking import METRICS_FILE, read_metrics
from rlkit.core.state.checkpoint import RNG_FILE, write_checkpoint
from rlkit.core.state.shards import rng_state
from rlkit.recipes.loader import load_config
from rlkit.core.startup import StartupClock


class StandInController:
    """Steps that draw from the process's RNGs, and checkpoints that save them as the controller does."""

    seen_at_save: list[tuple[int, int]] = []  # (status.json step, last metrics.jsonl step) when a save starts
    TRAIN_KEY, VAL_KEY = Controller.TRAIN_KEY, Controller.VAL_KEY

    def __init__(self, config, run: RunDir, inputs: RunInputs) -> None:
        self.config, self.run, self.completed_steps = config, run, 0
        self.tokenizer = self.scorer = None  # no validation data: the loop builds no evaluator
        self.startup = StartupClock.from_launch()  # the loop marks the first validation and step on it
        self.placement = SimpleNamespace(rollout=None)
        self.fast_paths = SimpleNamespace(describe=lambda: "fast paths: none (a stand-in)")

    def step(self, step: int) -> dict[str, float]:
        return {"reward/mean": random.random() + float(torch.rand(()))}

    def checkpoint_groups(self) -> dict:
        return {}  # no workers

    def save_checkpoint(self, reason: str) -> Path:
        metrics = read_metrics(self.run.path / METRICS_FILE)
        self.seen_at_save.append((self.run.read_status()["step"], metrics[-1]["step"]))
        return write_checkpoint(self.run.path, self.completed_steps, reason=reason, write_shards=lambda folder: None,
                                trainer_state={}, controller_rng=rng_state(), config_yaml="", keep_last=5)

    def close(self) -> None:
        pass


@pytest.fixture
def stand_in(monkeypatch) -> type[StandInController]:
    monkeypatch.setattr(loop, "Controller", StandInController)
    StandInController.seen_at_save = []
    return StandInController


def run(tmp_path: Path, run_id: str, *overrides: str) -> RunDir:
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.val_freq=0",
                                       "trainer.total_steps=3", "trainer.save_freq=1", *overrides])
    run_dir = RunDir.create(config, run_id)
    loop.run_training(config, run_dir, RunInputs(model_path="", tokenizer=None, rows=[]))
    return run_dir


def test_status_shows_a_step_as_soon_as_its_metrics_are_written(stand_in, tmp_path) -> None:
    done = run(tmp_path, "r")
    # While step N's checkpoint is written, `rlkit runs show` already says step N (it said N - 1).
    assert stand_in.seen_at_save == [(1, 1), (2, 2), (3, 3)]
    status = done.read_status()
    assert (status["status"], status["step"], status["last_checkpoint"]) == ("finished", 3, 3)


def controller_rng(run_dir: RunDir, step: int) -> dict:
    return torch.load(run_dir.path / "checkpoints" / f"step_{step:08d}" / RNG_FILE, weights_only=True)


def test_the_controllers_rng_starts_from_the_seed(stand_in, tmp_path) -> None:
    random.seed(123)  # whatever the process did before must not matter
    first = run(tmp_path, "a")
    torch.rand(5)
    second = run(tmp_path, "b")
    other_seed = run(tmp_path, "c", "trainer.seed=1")
    a, b, c = (controller_rng(r, 2) for r in (first, second, other_seed))
    assert a["python"] == b["python"] and torch.equal(a["torch"], b["torch"])
    assert a["python"] != c["python"] and not torch.equal(a["torch"], c["torch"])
    rewards = [[m["reward/mean"] for m in read_metrics(r.path / METRICS_FILE)] for r in (first, second)]
    assert rewards[0] == rewards[1]
