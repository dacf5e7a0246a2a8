"""`rlkit resume`: continue a run from its latest complete checkpoint, exactly.

Only overrides that cannot change the math of the remaining steps are accepted; the rest
are refused with the reason, because a resume that silently trains something else is the
bug users of other frameworks report most.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from rlkit.core.cluster.failures import restart_command, resume_command
from rlkit.core.state import checkpoint, provenance
from rlkit.core.state.run_dir import RunDir
from rlkit.errors import UserError
from rlkit.recipes.loader import Overrides, config_to_yaml, load_config, overrides_text
from rlkit.recipes.schema import RLConfig

logger = logging.getLogger(__name__)

# Keys a resume may change, and why that is safe. Everything else is part of the math.
RESUME_SAFE_KEYS = {
    "trainer.total_steps": "trains more (or fewer) steps; refused with a cosine LR schedule, whose horizon it is",
    "trainer.save_freq": "when checkpoints are written",
    "trainer.keep_last": "how many checkpoints are kept",
    "trainer.logger": "where metrics go",
    "trainer.project_name": "tracker grouping",
    "trainer.experiment_name": "tracker run name",
    "trainer.val_freq": "validation only reads the policy",
    "data.val_files": "validation only reads the policy",
    "trainer.val_before_train": "validation only reads the policy",
    "trainer.val_n": "validation only reads the policy",
    "trainer.val_temperature": "validation only reads the policy",
    "trainer.phase_timeout_s": "a deadline, not the math",
    "trainer.setup_timeout_s": "a deadline, not the math",
    "trainer.save_on_interrupt": "whether Ctrl-C writes a checkpoint",
    "trainer.nvlink_multicast": "how collectives move bytes, not what they compute",
    "actor.micro_batch_tokens": "performance only (float sums may differ in the last bits)",
    "rollout.max_num_seqs": "performance only",
    "rollout.gpu_memory_utilization": "performance only",
    "rollout.vllm.enforce_eager": "performance only",
    "rollout.vllm.separate_process": "performance only (where vLLM's engine core runs)",
    "rollout.vllm.replicas": "performance only (which engine serves a prompt; a batch's floats may differ in the "
    "last bits)",
    "rollout.vllm.streaming": "performance only (the same requests and seeds; on a GPU the floats of a batch, and so "
    "rarely a sample, may differ with its timing)",
    "rollout.sglang.streaming": "performance only (the same requests and seeds, which SGLang honours only with "
    "deterministic inference)",
    "reward.while_generating": "where and when the reward runs (the same calls on the same texts)",
    "rollout.vllm.prefix_caching": "performance only (a cached prefix may differ from a prefill in the last bits)",
    "rollout.log_prob_check_freq": "when the sync check runs (the samples stay the same)",
    "rollout.log_prob_tolerance": "what the sync check accepts, not the math",
    "rollout.sync_check": "what a failed sync check does, not the math",
    "trainer.invariants": "checked at step 1 only",
    "trainer.record_rollouts": "only writes down what each step computed",
    "trainer.record_keep_steps": "how many recorded steps stay on disk",
    "trainer.invariant_tolerance": "checked at step 1 only",
    "rollout.weight_sync": "how the weights travel to the rollout workers (the same values arrive)",
    "rollout.weight_sync_timeout_s": "a deadline, not the math",
}


def resume_config(run: RunDir, ckpt: checkpoint.Checkpoint, overrides: Overrides | None) -> RLConfig:
    """The checkpoint's config with `overrides`; refuses any that would change the math."""
    saved_yaml = ckpt.path / checkpoint.CONFIG_FILE
    # load_config names the recipe after the file it read (config.yaml); keep the original name.
    recipe = {"recipe": str((yaml.safe_load(saved_yaml.read_text()) or {}).get("recipe", ""))}
    saved = load_config(str(saved_yaml)).model_copy(update=recipe)
    config = load_config(str(saved_yaml), overrides).model_copy(update=recipe)
    changed = config_diff(saved, config)
    refused = [f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items() if key not in RESUME_SAFE_KEYS]
    if refused:
        raise UserError(
            "a resume continues the same training, so these overrides are refused: "
            + "; ".join(refused)
            + ". Keys a resume may change: "
            + ", ".join(RESUME_SAFE_KEYS)
            + ". To train with other settings, start a new run, e.g. from an export "
            f"(`{resume_command(run.path, run.run_id, 'export')} --out DIR`, then "
            "`rlkit train ... --model DIR`)"
        )
    total = config.trainer.total_steps
    if "trainer.total_steps" in changed and config.actor.lr_schedule != "constant":
        raise UserError(
            f"trainer.total_steps cannot change on resume with actor.lr_schedule="
            f"{config.actor.lr_schedule}: the schedule decays over the original "
            f"{saved.trainer.total_steps} steps, so the remaining learning rates would change"
        )
    if total <= ckpt.step:
        raise UserError(
            f"run {run.run_id} already trained {ckpt.step} of trainer.total_steps={total} steps "
            f"(checkpoint {ckpt.path.name}); pass trainer.total_steps=N with N > {ckpt.step} to train on: "
            f"`{resume_command(run.path, run.run_id)} trainer.total_steps={2 * ckpt.step}`"
        )
    return config


def resume_run(run_id: str, overrides: Overrides | None, runs_dir: str | Path = "runs") -> Path:
    """Continue run `run_id` (an id under runs_dir, or a path) from its latest complete checkpoint, with `overrides`
    (KEY=VALUE texts, or the Python API's {key: value})."""
    from rlkit.core.controller.loop import CONSOLE_LOG, run_log, run_training
    from rlkit.core.controller.preflight import check_inputs

    run = RunDir.open(run_id, runs_dir)
    status = run.read_status()
    if status.get("status") == "running":
        raise UserError(
            f"run {run.run_id} is still running (pid {status.get('pid')} on {status.get('host')}); "
            "stop it first or wait for it to finish; if that process is gone (its machine went "
            f"down), delete {run.path / 'status.json'} and run `{resume_command(run.path, run.run_id)}` "
            "again"
        )
    with run_log(run.path / CONSOLE_LOG):
        try:
            ckpt = checkpoint.verify(checkpoint.latest_checkpoint(run.path))
        except checkpoint.NoCheckpointError as exc:
            raise UserError(
                f"{exc}: it stopped before its first one, so there is nothing to resume. Start it "
                f"again under the same id with: {restart_command(run.path, run.run_id)}"
            ) from None
        config = resume_config(run, ckpt, overrides)
        logger.info(
            "resuming %s from checkpoint %s (step %d)%s",
            run.run_id,
            ckpt.path.name,
            ckpt.step,
            f" with {overrides_text(overrides)}" if overrides else "",
        )
        inputs = check_inputs(config)  # the model and data may have moved since
        provenance.warn_if_changed(ckpt.path, config, run.path)
        (run.path / "config.yaml").write_text(config_to_yaml(config))
        return run_training(config, run, inputs, resume_from=ckpt)


def config_diff(old: RLConfig, new: RLConfig) -> dict[str, tuple[Any, Any]]:
    """dotted key -> (old value, new value) for every key whose value differs."""
    a, b = _flatten(old.model_dump(mode="json")), _flatten(new.model_dump(mode="json"))
    return {key: (a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
