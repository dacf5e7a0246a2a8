"""`rlkit replay RUN_ID --step N`: run step N's actor update again on its recorded batch.

The policy workers start as the run's did (same world size, no rollout engine), load the
checkpoint of step N-1 (step 1 starts from the base model, as the run did) and update on
the batch recorded by trainer.record_rollouts, through the controller's own update path.
Unchanged code and settings give the recorded metrics exactly on CPU; a changed loss
setting (an override) or a code change shows up as a difference. A regression check for
the update (docs/replay.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.phase_plan import phase_plan
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.controller.controller import Controller
from rlkit.core.controller.resume import config_diff
from rlkit.core.state import checkpoint, records
from rlkit.core.state.run_dir import RunDir, resolve_model_path
from rlkit.errors import UserError
from rlkit.recipes.loader import load_config
from rlkit.recipes.schema import RLConfig

logger = logging.getLogger("rlkit")
# The update's metrics a replay compares, first those the docs name: loss, grad norm, KL, clip fraction.
COMPARED = (
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/kl_loss",
    "actor/kl_ref",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/rollout_is_weight",
    "rollout/log_prob_diff",
    "actor/lr",
)
# Overrides a replay can apply: they act on the update itself. The batch (generation, rewards,
# advantages) is what was recorded, so keys upstream of the update would change nothing.
REPLAYABLE_PREFIXES = (
    "actor.",
    "model.dtype",
    "model.gradient_checkpointing",
    "model.compile",
    "trainer.phase_timeout_s",
    "trainer.setup_timeout_s",
    "trainer.cpu_threads_per_worker",
)


@dataclass
class Replay:
    step: int
    recorded: dict[str, float]
    replayed: dict[str, float]
    changed: dict[str, tuple[object, object]]  # override key -> (recorded value, replayed value)
    start: str  # what the workers started from

    def differences(self) -> dict[str, tuple[float | None, float | None, float | None]]:
        """metric -> (recorded, replayed, replayed - recorded) for every compared metric either side has."""
        keys = [k for k in COMPARED if k in self.recorded or k in self.replayed]
        keys += sorted(k for k in self.replayed if k not in COMPARED)
        out = {}
        for key in keys:
            a, b = self.recorded.get(key), self.replayed.get(key)
            out[key] = (a, b, None if a is None or b is None else b - a)
        return out


def replay_config(
    run: RunDir, step: int, overrides: list[str]
) -> tuple[RLConfig, checkpoint.Checkpoint | None, dict[str, tuple[object, object]]]:
    """The config step `step` trained with, plus `overrides`; the checkpoint to start from (None for step 1)."""
    ckpt = None
    if step > 1:
        try:
            ckpt = checkpoint.checkpoint_at(run.path, step - 1)
        except UserError as exc:
            raise UserError(
                f"replaying step {step} needs the checkpoint of step {step - 1} "
                f"({checkpoint.checkpoints_dir(run.path) / checkpoint.step_dir_name(step - 1)}): {exc}. Train with "
                "trainer.save_freq=1 and a trainer.keep_last that keeps the steps to replay (docs/replay.md)"
            ) from None
    source = str((ckpt.path if ckpt else run.path) / checkpoint.CONFIG_FILE)
    saved, config = load_config(source), load_config(source, overrides)
    changed = config_diff(saved, config)
    refused = [k for k in changed if not k.startswith(REPLAYABLE_PREFIXES)]
    if refused:
        raise UserError(
            f"a replay re-runs only the update on the recorded batch, so {', '.join(refused)} would "
            f"change nothing or break it; replay overrides start with: {', '.join(REPLAYABLE_PREFIXES)}"
        )
    if not phase_plan(Algorithm.from_config(config)).runs("update_actor", step):
        raise UserError(
            f"step {step} trained only the critic (critic.warmup_steps={config.critic.warmup_steps}); "
            "there is no actor update to replay"
        )
    return config, ckpt, changed


def replay_inputs(
    run: RunDir, step: int, overrides: list[str]
) -> tuple[records.Record, RLConfig, checkpoint.Checkpoint | None, dict[str, tuple[object, object]]]:
    """Step `step`'s record and replay_config's answer; when either is missing, one UserError saying all that is."""
    problems, record = [], None
    try:
        record = records.read_record(run.path, step)
    except UserError as exc:
        problems.append(str(exc))
    try:
        config, ckpt, changed = replay_config(run, step, overrides)
    except UserError as exc:
        problems.append(str(exc))
    if problems or record is None:
        raise UserError(f"cannot replay step {step}:\n- " + "\n- ".join(problems))
    return record, config, ckpt, changed


def replay_step(run_id: str, step: int, overrides: list[str], runs_dir: str | Path = "runs") -> Replay:
    """Run step `step`'s actor update again; compare its metrics with the recorded ones."""
    from rlkit.core.cluster.backend import start_backend
    from rlkit.core.train.policy_worker import PolicyWorker

    run = RunDir.open(run_id, runs_dir)
    record, config, ckpt, changed = replay_inputs(run, step, overrides)
    algorithm = Algorithm.from_config(config)
    needed = ["ref_log_probs"] if algorithm.kl_loss else []
    needed += ["rollout_log_probs"] if algorithm.rollout_log_probs else []
    # The pass's old log-probs (ppo_epochs > 1, batch-normalised rollout weights, ...): a run whose update took
    # its own recorded none.
    needed += ["old_log_probs"] if algorithm.old_log_probs == "trainer" else []
    missing = [k for k in needed if k not in record.batch]
    if missing:
        raise UserError(
            f"the recorded batch of step {step} has no {', '.join(missing)}, which these settings need "
            "(the run did not compute them); replay without the overrides that ask for them"
        )
    backend = start_backend(config)
    try:
        group = backend.group(PolicyWorker, resolve_model_path(config.model.path), name="worker")
        master = group.call(DeviceWorker.address, phase="address")[0]
        group.call(PolicyWorker.setup, *master, False, phase="setup (model load)", startup=True)
        if ckpt is not None:
            group.call(DeviceWorker.load_checkpoint, str(ckpt.path / "policy"), phase="load checkpoint (policy)")
        updater = Controller.__new__(Controller)  # the controller's own update path, without rollout or data
        updater.config, updater.workers = config, group
        inputs = UpdateInputs.for_step(algorithm, log_prob_check=config.log_prob_check_step(step))
        replayed = updater.update_actor(record.batch, inputs)
    finally:
        backend.shutdown()  # with it the workers
    start = f"checkpoint {ckpt.path.name}" if ckpt else "the base model (step 1)"
    return Replay(
        step, {k: v for k, v in record.metrics.items() if k in replayed or k in COMPARED}, replayed, changed, start
    )
