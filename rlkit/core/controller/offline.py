"""The offline controller: training on rows of a data set (objectives sft, dpo), no rollout engine.

`OfflineController.step` reads like the dataflow: the sampler's next batch of rows -> a token
batch with the loss mask on the trained tokens (the row kind of the objective,
rlkit.core.data.offline) -> for dpo, the frozen reference's log-probs of it (no gradient, once
per batch, before any update) -> mini-batches, each split evenly over the workers with its global
token counts -> the workers' `update_offline` (the shared optimize loop with the objective's
micro-step, rlkit.core.train.offline_worker) -> metrics. The run loop (rlkit.core.controller.loop)
drives it exactly as it drives the RL Controller: the same checkpoints (the policy's shards,
the sampler's position, the controller RNG), resume, validation schedule and metrics sinks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.batch import Batch, pad_to_ranks, shard_minibatches
from rlkit.core.cluster.backend import Backend, Group, start_backend
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.controller.controller import (
    load_worker_shards,
    save_run_checkpoint,
    worker_log_probs,
)
from rlkit.core.controller.preflight import RunInputs
from rlkit.core.data.dataset import PromptSampler
from rlkit.core.data.offline import row_kind
from rlkit.core.rollout.source import timed
from rlkit.core.startup import StartupClock
from rlkit.core.state import checkpoint
from rlkit.core.state.run_dir import RunDir
from rlkit.core.state.shards import set_rng_state
from rlkit.core.train.actor import Actor
from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.recipes.schema import RLConfig, with_resolved_budget


class OfflineController:
    # The metrics the run's closing summary compares, first steps against last.
    TRAIN_KEY, VAL_KEY = "actor/loss", "val/loss"

    def __init__(self, config: RLConfig, run: RunDir, inputs: RunInputs) -> None:
        """`inputs`: the rows the preflight checks loaded and tokenized (rlkit.core.controller.preflight)."""
        self.startup = StartupClock.from_launch()  # the run loop marks the rest: validation, the first step
        self.config, self.run = config, run
        self.reference = Algorithm.from_config(config).reference  # dpo compares the policy with it
        self.model_path, self.tokenizer = inputs.model_path, inputs.tokenizer
        self.rows, self.val_rows = inputs.rows, inputs.val_rows
        self.kind = row_kind(config.objective, config.data, config.sft)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.sampler = PromptSampler(
            len(self.rows), config.data.train_batch_size, seed=config.trainer.seed, shuffle=config.data.shuffle
        )
        self.startup.mark("imports_and_checks")
        backend: Backend | None = None
        try:
            self.backend = backend = start_backend(config)
            self.startup.mark("ray_init")
            self.workers = backend.group(PolicyWorker, self.model_path, name="worker")
            master = self.workers.call(DeviceWorker.address, phase="address")[0]
            setup = self.workers.call(PolicyWorker.setup, *master, False, phase="setup (model load)", startup=True)
            self.startup.mark("workers_setup")
            self.startup.add_details([info["startup"] for info in setup])
            self.fast_paths = setup[0]["fast_paths"]  # the same on every rank
            # Checkpoints keep the resolved budget (a copy: a validated config is never changed).
            self.config = config = with_resolved_budget(config, self.fast_paths.micro_batch_tokens)
        except BaseException:  # a worker that died or hung in start-up, or Ctrl-C: stop what did start
            if backend is not None:
                backend.shutdown()
            raise
        self.completed_steps = 0  # the run loop advances it; a checkpoint saves this step

    # -- the step -----------------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        timing: dict[str, float] = {}
        with timed(timing, "step"):
            with timed(timing, "data"):
                batch = self.kind.batch([self.rows[i] for i in self.sampler.next_batch()], self.pad_id)
            if self.reference:
                with timed(timing, "ref"):
                    batch["ref_log_probs"] = self.reference_log_probs(batch)
            with timed(timing, "update"):
                metrics = self.update(batch)
        tokens = float(batch["attention_mask"].sum())
        return {
            **metrics,
            "data/epoch": float(self.sampler.epoch),
            "perf/loss_tokens": float(batch["response_mask"].sum()),
            "perf/tokens": tokens,
            "perf/tokens_per_s": tokens / timing["step"],
            "perf/tokens_per_s_per_device": tokens / timing["step"] / self.config.world_size,
            **{f"timing/{k}": v for k, v in timing.items()},
        }

    def reference_log_probs(self, batch: Batch) -> torch.Tensor:
        """Per-token log-probs of the batch's responses under the reference (each rank its equal share)."""
        return worker_log_probs(self.workers, batch, "ref", self.config.world_size)["log_probs"]

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step per actor.mini_batch_size rows (dpo: pairs), each split evenly over the workers."""
        cfg = self.config
        tensors = Batch(dict(batch.tensors))  # the row kind's tensors travel (dpo: with ref_log_probs); meta stays here
        per_rank = shard_minibatches(tensors, cfg.actor.mini_batch_size * cfg.samples_per_prompt, cfg.world_size)
        return self.workers.call(Actor.update_offline, per_rank=per_rank, phase="update_offline")[0]

    # -- validation ---------------------------------------------------------------------
    def validate(self, step: int) -> dict[str, float]:
        """The training metrics over all of data.val_files, as val/...: sft val/loss (aggregated as the
        training loss is) and val/token_accuracy; dpo val/loss and val/rewards/* (means over the pairs).
        (`step` is the run loop's: the metrics of a fixed set do not depend on it.)"""
        world = self.config.world_size
        # Every rank gets as many rows, and dpo's whole pairs: padded to a multiple of world x rows per pair.
        batch = pad_to_ranks(
            Batch(dict(self.kind.batch(self.val_rows, self.pad_id).tensors)), world * self.config.samples_per_prompt
        )
        mask = batch["response_mask"]
        norm = {"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum())}
        timing: dict[str, float] = {}
        with timed(timing, "val"):
            if self.reference:
                batch["ref_log_probs"] = self.reference_log_probs(batch)
            per_rank = [(shard, norm) for shard in batch.chunk(world)]
            out = self.workers.call(Actor.evaluate_offline, per_rank=per_rank, phase="validation")[0]
        return {**{f"val/{k}": v for k, v in out.items()}, "timing/val": timing["val"]}

    # -- checkpoints (layout and atomic writes: rlkit.core.state.checkpoint) -------------------
    def checkpoint_groups(self) -> dict[str, Group]:
        """Worker groups whose sharded state a checkpoint holds (the run loop also profiles them)."""
        return {"policy": self.workers}

    def save_checkpoint(self, reason: str) -> Path:
        """Checkpoint the last completed step atomically; `reason` (periodic, final, ...) is recorded."""
        state = {
            "sampler": self.sampler.state_dict(),
            "dataset_rows": len(self.rows),
            "world_size": self.config.world_size,
            "total_steps": self.config.trainer.total_steps,
        }
        return save_run_checkpoint(self.config, self.run, self.completed_steps, reason, self.checkpoint_groups(), state)

    def load_checkpoint(self, ckpt: checkpoint.Checkpoint) -> None:
        """Restore every worker's shards, optimizer, schedule and RNG, then the data position and step."""
        load_worker_shards(ckpt, len(self.rows), self.checkpoint_groups())
        self.sampler.load_state_dict(ckpt.state["sampler"])
        set_rng_state(torch.load(ckpt.path / checkpoint.RNG_FILE, weights_only=True))
        self.completed_steps = ckpt.state["step"]

    def close(self) -> None:
        self.workers.shutdown()
        self.backend.shutdown()
