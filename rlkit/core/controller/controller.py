"""The controller: one process that holds the RL dataflow as plain Python.

`Controller.step` reads like the dataflow (docs/architecture.md); workers (Ray actors, or objects in
this process: trainer.workers) do the heavy passes, the controller does the cheap, visible math (rewards -> advantages).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from rlkit.core.agents.mcp_tools import close_servers
from rlkit.core.agents.preflight import WEAK_SANDBOX_WARNING, uses_sandbox
from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.kl import kl_estimate
from rlkit.core.algos.phase_plan import phase_plan
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch, shard_minibatches
from rlkit.core.cluster.backend import Backend, Group, start_backend
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.failures import WorkerFailure, checkpoint_write_failure
from rlkit.core.controller import invariants
from rlkit.core.controller.placement import Placement
from rlkit.core.controller.preflight import RunInputs, check_inputs
from rlkit.core.data.dataset import PromptSampler
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.async_source import AsyncScheduler
from rlkit.core.rollout.source import SyncScheduler, timed
from rlkit.core.rollout.stages import RolloutStages
from rlkit.core.sandbox.isolation import set_isolation
from rlkit.core.startup import StartupClock
from rlkit.core.state import checkpoint
from rlkit.core.state.disk_errors import os_error_behind
from rlkit.core.state.records import RolloutRecorder
from rlkit.core.state.run_dir import RunDir
from rlkit.core.state.shards import rng_state, set_rng_state
from rlkit.core.train.actor import KEPT_LOG_PROBS, Actor
from rlkit.core.train.critic_worker import VALUE_INPUT_KEYS, CriticWorker, start_critic_group
from rlkit.core.train.scoring import Scoring
from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml
from rlkit.recipes.schema import RLConfig, with_resolved_budget

logger = logging.getLogger("rlkit")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


class Controller:
    # The metrics the run's closing summary compares, first steps against last.
    TRAIN_KEY, VAL_KEY = "reward/mean", "val/reward/mean@1"

    def __init__(self, config: RLConfig, run: RunDir, inputs: RunInputs | None = None) -> None:
        """`inputs`: what the preflight checks loaded (the run loop passes them; None runs the checks here)."""
        self.startup = StartupClock.from_launch()  # the run loop marks the rest: validation, the first step
        self.config, self.run = config, run
        self.algorithm = Algorithm.from_config(config)  # what the step needs, its advantage and loss
        inputs = inputs or check_inputs(config)
        self.model_path, self.tokenizer, self.rows = inputs.model_path, inputs.tokenizer, inputs.rows
        sampler = PromptSampler(
            len(self.rows), config.data.train_batch_size, seed=config.trainer.seed, shuffle=config.data.shuffle
        )
        invariants.check_prompts(config, self.tokenizer, self.rows, sampler)  # the first batch, before workers start
        self.kl_ctrl = self.algorithm.kl_controller()
        # Every sandbox of the run (reward workers, Ray workers) inherits the mode from this process's environment.
        set_isolation(config.rollout.agent.sandbox.isolation)
        self.weak_sandbox = config.rollout.agent.sandbox.isolation == "weak" and uses_sandbox(
            config.rollout.agent, config.reward, config.reward_model, {row.data_source for row in self.rows}
        )
        if self.weak_sandbox:
            logger.warning(WEAK_SANDBOX_WARNING)
        self.scorer = RewardScorer(config.reward)
        self.recorder = RolloutRecorder.for_run(config, run.path)  # trainer.record_rollouts
        self.startup.mark("imports_and_checks")
        backend: Backend | None = None
        try:
            self.backend = backend = start_backend(config)
            self.startup.mark("ray_init")  # in_process: no Ray, this part is near 0
            self.placement = Placement(config, self.model_path, backend)
            self.workers = self.placement.train
            self.setup_info = self.placement.setup()
            self.startup.mark("workers_setup")
            self.startup.add_details([info["startup"] for info in self.setup_info + self.placement.rollout_setup])
            self.fast_paths = self.setup_info[0]["fast_paths"]  # the same on every rank
            # The critic and every checkpoint's config take the budget the workers resolved from "auto" (a copy:
            # a validated config is never changed). It loads after the policy's set-up, not beside it: it shares
            # their devices, whose free memory the engine's start and the micro-batch budget measure.
            self.config = config = with_resolved_budget(config, self.fast_paths.micro_batch_tokens)
            self.critic = start_critic_group(config, self.model_path, self.workers, backend)
            if self.critic:
                self.startup.mark("critic_setup")
            # The rollout's stages, and the scheduler around them that rollout.mode picks (rlkit.core.rollout.source).
            stages = RolloutStages.build(
                config, self.algorithm, self.rows, sampler, self.tokenizer, self.scorer, self.placement
            )
            self.source = (
                SyncScheduler(stages, self.placement)
                if config.rollout.mode == "sync"
                else AsyncScheduler(stages, self.placement, config.rollout)
            )
        except BaseException:  # a worker that died or hung in start-up, or Ctrl-C: stop what did start
            self.scorer.close()
            if backend is not None:
                backend.shutdown()  # with it every worker this run started
            raise
        self.plan = phase_plan(self.algorithm)
        self.completed_steps = 0  # the run loop advances it; a checkpoint saves this step

    # -- the step -----------------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        plan, timing = self.plan, {}  # the phases: rlkit.core.algos.phase_plan
        inputs = UpdateInputs.for_step(
            self.algorithm, log_prob_check=self.config.log_prob_check_step(step), recording=self.recorder.on
        )
        with timed(timing, "step"):
            batch, metrics = self.source.next_batch(step, timing)  # gen (+ gen_baseline), scored: rollout.source
            if plan.runs("old_log_prob", step):  # else the update's own detached log-probs are the old ones
                with timed(timing, "old_log_prob"):
                    batch.update(self.old_log_probs(batch))
            if plan.runs("ref", step):
                with timed(timing, "ref"):
                    batch["ref_log_probs"] = self.log_probs(batch, "ref")["log_probs"]
            if plan.runs("values", step):
                with timed(timing, "values"):
                    batch["values"] = self.values(batch)
            with timed(timing, "adv"):
                batch.update(self.advantages(batch))
            if plan.runs("update_critic", step):
                with timed(timing, "update_critic"):
                    metrics.update(self.update_critic(batch))
            if plan.runs("update_actor", step):  # not in the critic's warm-up
                with timed(timing, "update_actor"):
                    metrics.update(self.update_actor(batch, inputs))
            if plan.runs("sync", step):  # the source's policy version becomes `step`
                with timed(timing, "sync"):
                    metrics.update(self.source.sync_weights(step))
        if self.weak_sandbox:  # said on every step, so that no one reads a run's results without knowing
            logger.warning(WEAK_SANDBOX_WARNING)
            metrics["sandbox/weak"] = 1.0
        metrics = {
            **self.batch_metrics(batch, inputs),
            **metrics,
            **{f"timing/{k}": v for k, v in timing.items()},
            **self.throughput(batch, timing["step"]),
        }
        self.recorder.record(step, batch, metrics)  # the batch the update got, for `rlkit replay` / `inspect`
        return metrics

    # -- phases -------------------------------------------------------------------------
    def log_probs(self, batch: Batch, which: str) -> dict[str, torch.Tensor]:
        return worker_log_probs(self.workers, batch, which, self.config.world_size)

    def old_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.algorithm.old_log_probs == "rollout":
            return {"old_log_probs": batch["rollout_log_probs"]}
        out = self.log_probs(batch, "actor")
        stats = {"sum_pi_squared": out["sum_pi_squared"]} if self.algorithm.token_stats else {}
        return {"old_log_probs": out["log_probs"], "entropy": out["entropy"], **stats}

    def advantages(self, batch: Batch) -> dict[str, torch.Tensor]:
        inputs = self.algorithm.advantage_inputs(batch, self.kl_ctrl)  # moves the in-reward KL coefficient
        adv, returns = self.algorithm.advantages(inputs)
        return {"token_rewards": inputs.token_rewards, "advantages": adv, "returns": returns}

    def update_actor(self, batch: Batch, inputs: UpdateInputs) -> dict[str, float]:
        inputs = inputs.for_batch(batch)  # what the whole batch decides (batch-normalised rollout weights)
        per_rank = [(shards, norms, inputs) for shards, norms in self.minibatches(batch, inputs.keys())]
        results = self.workers.call(Actor.update_actor, per_rank=per_rank, phase="update_actor")
        if inputs.keep_log_probs:  # for the record (`rlkit inspect`); each rank's rows, in rank order
            batch[KEPT_LOG_PROBS] = torch.cat([result.pop(KEPT_LOG_PROBS) for result in results])
        return results[0]

    def values(self, batch: Batch) -> torch.Tensor:
        shards = Batch({k: batch[k] for k in VALUE_INPUT_KEYS}).chunk(self.config.world_size)
        values = self.critic.call(CriticWorker.compute_values, per_rank=[(s,) for s in shards], phase="critic values")
        return torch.cat(values)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """The critic regresses the GAE returns, anchored (value clip) at the values it gave at rollout."""
        per_rank = self.minibatches(batch, VALUE_INPUT_KEYS + ["values", "returns"])
        return self.critic.call(CriticWorker.update_critic, per_rank=per_rank, phase="update_critic")[0]

    def minibatches(self, batch: Batch, keys: list[str]) -> list[tuple[list[Batch], list[dict[str, float]]]]:
        """Per rank: (its share of each mini-batch, every mini-batch's global token/sequence counts).

        Mini-batches are actor.mini_batch_size whole prompt groups, repeated actor.ppo_epochs times,
        each split evenly over the workers.
        """
        cfg = self.config
        slim = Batch({k: batch[k] for k in keys})
        return shard_minibatches(slim, cfg.actor.mini_batch_size * cfg.rollout.n, cfg.world_size, cfg.actor.ppo_epochs)

    # -- metrics ------------------------------------------------------------------------
    def batch_metrics(self, batch: Batch, inputs: UpdateInputs) -> dict[str, float]:
        """The batch's metrics; what the step computed is stated by the Algorithm and `inputs`, not read
        from the keys the batch happens to hold."""
        mask, scores = batch["response_mask"], batch["scores"]
        trainer_pass = self.algorithm.old_log_probs == "trainer"  # the old-log-prob pass, with its entropy
        lengths = mask.sum(-1)
        metrics = {
            "reward/mean": float(scores.mean()),
            "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "reward/max": float(scores.max()),
            "reward/min": float(scores.min()),
            "response/length_mean": float(lengths.mean()),
            "response/length_max": float(lengths.max()),
            "response/clip_frac": float((~batch["finished"]).float().mean()),
            "adv/mean": masked_mean(batch["advantages"], mask),
            "prompt/length_mean": float(batch["attention_mask"][:, : -mask.shape[1]].sum(-1).float().mean()),
        }
        if trainer_pass:  # else update_actor measures these
            metrics["actor/entropy"] = masked_mean(batch["entropy"], mask)
        if trainer_pass and inputs.rollout_log_probs:  # the engine returned its log-probs this step
            gap = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()
            checked = mask * batch["rollout_log_prob_rows"].unsqueeze(-1)  # a check step's share of the rows
            if checked.any():
                metrics["rollout/log_prob_diff"] = masked_mean(gap, checked)
        if self.algorithm.critic:
            values, returns = batch["values"], batch["returns"]
            residual_var = masked_mean((returns - values) ** 2, mask) - masked_mean(returns - values, mask) ** 2
            returns_var = masked_mean(returns**2, mask) - masked_mean(returns, mask) ** 2
            metrics.update(
                {"critic/values_mean": masked_mean(values, mask), "critic/returns_mean": masked_mean(returns, mask)}
            )
            if returns_var > 1e-8:  # undefined when every return is the same
                metrics["critic/explained_var"] = 1.0 - residual_var / returns_var
        if self.algorithm.reference:
            metrics["actor/kl_coef"] = self.kl_ctrl.value
            if not inputs.old_log_probs_from_update:  # else update_actor measures it
                metrics["actor/kl_ref"] = masked_mean(
                    kl_estimate(batch["old_log_probs"], batch["ref_log_probs"], "k1"), mask
                )
        return metrics

    def throughput(self, batch: Batch, seconds: float) -> dict[str, float]:
        tokens = float(batch["attention_mask"].sum())
        return {
            "perf/tokens_per_s": tokens / seconds,
            "perf/tokens_per_s_per_device": tokens / seconds / self.config.world_size,
            "perf/response_tokens": float(batch["response_mask"].sum()),
        }

    # -- checkpoints (layout and atomic writes: rlkit.core.state.checkpoint) -------------------
    def checkpoint_groups(self) -> dict[str, Group]:
        """Worker groups whose sharded state a checkpoint holds, by sub-folder name."""
        return {"policy": self.workers, **({"critic": self.critic} if self.critic is not None else {})}

    def save_checkpoint(self, reason: str) -> Path:
        """Checkpoint the last completed step atomically; `reason` (periodic, final, ...) is recorded."""
        state = {
            **self.source.state_dict(),
            "dataset_rows": len(self.rows),
            "kl_coef": self.kl_ctrl.value,
            "rollout_seed": self.config.trainer.seed,
            "world_size": self.config.world_size,
            "total_steps": self.config.trainer.total_steps,
        }
        return save_run_checkpoint(self.config, self.run, self.completed_steps, reason, self.checkpoint_groups(), state)

    def load_checkpoint(self, ckpt: checkpoint.Checkpoint) -> None:
        """Restore every worker's shards, RNG and schedule, then the data position, KL coefficient, step."""
        state = ckpt.state
        load_worker_shards(ckpt, len(self.rows), self.checkpoint_groups())
        self.source.sync_weights(state["step"])  # a policy version is the last completed step (rollout source)
        self.source.load_state_dict(state)
        self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(torch.load(ckpt.path / checkpoint.RNG_FILE, weights_only=True))
        self.completed_steps = state["step"]

    def close(self) -> None:
        try:
            self.recorder.close()  # the last step's record reaches the disk
            self.scorer.close()
            if self.critic is not None:
                self.critic.shutdown()
            self.placement.shutdown()
            self.backend.shutdown()
        finally:  # the MCP tool servers this process started (the prompts' schemas; in-process workers' calls)
            close_servers()


def save_run_checkpoint(
    config: RLConfig, run: RunDir, step: int, reason: str, groups: dict[str, Group], trainer_state: dict[str, Any]
) -> Path:
    """Step `step`'s checkpoint, written atomically: each group's shards in its sub-folder, the
    controller's state and RNG, the config; a failed write names the path and frees its space."""

    def write_shards(folder: Path) -> None:
        for name, group in groups.items():
            group.call(DeviceWorker.save_checkpoint, str(folder / name), phase=f"save checkpoint ({name})")

    try:
        return checkpoint.write_checkpoint(
            run.path,
            step,
            reason=reason,
            write_shards=write_shards,
            trainer_state=trainer_state,
            controller_rng=rng_state(),
            config_yaml=config_to_yaml(config),
            keep_last=config.trainer.keep_last,
        )
    except (OSError, WorkerFailure) as exc:  # disk full, unwritable run dir: name the path, give the space back
        if os_error_behind(exc) is None:
            raise  # a worker that died or hung stays a WorkerFailure
        tmp = checkpoint.tmp_dir(run.path, step)
        shutil.rmtree(tmp, ignore_errors=True)  # first: the free space the message reports is what is left
        raise checkpoint_write_failure(tmp, step, exc, checkpoint.last_checkpoint_bytes(run.path)) from None


def worker_log_probs(workers: Group, batch: Batch, which: str, world: int) -> dict[str, torch.Tensor]:
    """Per-token log-probs (and entropy) of the batch's responses under the actor or the reference
    (`which`), each of the `world` ranks computing its equal share."""
    pass_ = Actor.actor_log_probs if which == "actor" else Scoring.reference_log_probs
    results = workers.call(pass_, per_rank=[(s,) for s in batch.chunk(world)], phase=f"{which} log-probs")
    return {k: torch.cat([r[k] for r in results]) for k in results[0]}


def load_worker_shards(ckpt: checkpoint.Checkpoint, dataset_rows: int, groups: dict[str, Group]) -> None:
    """Every group's shards (weights, optimizer, schedule, RNG) from `ckpt`, trained on the same data."""
    if ckpt.state["dataset_rows"] != dataset_rows:
        raise UserError(
            f"the training data changed: checkpoint {ckpt.path.name} was trained on "
            f"{ckpt.state['dataset_rows']} rows, data.train_files now holds {dataset_rows}; "
            "an exact resume needs the same data (start a new run for new data)"
        )
    for name, group in groups.items():
        group.call(DeviceWorker.load_checkpoint, str(ckpt.path / name), phase=f"load checkpoint ({name})")
