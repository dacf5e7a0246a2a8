"""The checks of the offline objectives (sft, dpo): options that would do nothing, and what they need."""

from __future__ import annotations

from typing import Callable

from rlkit.recipes.schema import RLConfig

# Keys only RL reads: on the command line of an offline objective they would do nothing.
RL_ONLY_PREFIXES = (
    "rollout.",
    "algorithm.",
    "critic.",
    "reward.",
    "reward_model.",
    "data.synthetic_task",
    "actor.policy_loss",
    "actor.clip_ratio",
    "actor.entropy_coeff",
    "actor.use_kl_loss",
    "actor.kl_loss_",
    "actor.rollout_is",
    "actor.rollout_correction",
    "actor.old_log_probs",
    "trainer.val_n",
    "trainer.val_temperature",
    "trainer.record_",
    "trainer.invariant",
)
# The offline objectives (each with its own section of options) and how to make data for each.
OFFLINE_SECTIONS = {"sft": "rlkit prep-data gsm8k --format sft", "dpo": "rlkit prep-data gsm8k-pairs"}


def check_offline(
    config: RLConfig, origins: dict[str, str], fail: Callable[[str, str], None], *, require_inputs: bool
) -> None:
    """objectives sft and dpo: rows of data files, one pass over each batch, no rollout placement."""
    other_sections = tuple(f"{name}." for name in OFFLINE_SECTIONS if name != config.objective)
    for key, origin in origins.items():
        if origin == "command line" and key.startswith(RL_ONLY_PREFIXES):
            fail(
                key,
                f"has no effect: objective {config.objective} generates nothing and scores nothing "
                "(no rollout, reward, advantage, policy-gradient loss or critic)",
            )
        if origin == "command line" and key.startswith(other_sections):
            fail(key, f"has no effect: only objective {key.split('.')[0]} reads it (objective is {config.objective})")
    if require_inputs and not config.data.train_files:
        fail(
            "data.train_files",
            f"objective {config.objective} trains on rows of data files (no synthetic task); "
            f"set data.train_files=[train.parquet] (e.g. `{OFFLINE_SECTIONS[config.objective]}`)",
        )
    if config.actor.ppo_epochs != 1:
        fail(
            "actor.ppo_epochs",
            f"objective {config.objective} passes over each batch once; remove it "
            "(more passes over the data: raise trainer.total_steps)",
        )
    if config.rollout.placement != "colocated":
        fail(
            "rollout.placement",
            f"objective {config.objective} starts no rollout engine, so every device trains; "
            "remove rollout.placement/rollout.devices",
        )
    if config.objective == "sft" and config.actor.fused_lm_head:
        fail(
            "actor.fused_lm_head",
            "objective sft reports its token accuracy from the full logits, which the fused head never forms; "
            "set actor.fused_lm_head=false",
        )
    if config.objective == "dpo":
        if config.actor.mini_batch_size % config.world_size:
            fail(
                "actor.mini_batch_size",
                f"{config.actor.mini_batch_size} pairs cannot be split evenly over "
                f"{config.world_size} workers (each holds whole pairs: a pair's loss needs both responses)",
            )
        if config.dpo.label_smoothing and config.dpo.loss_type not in ("cdpo", "robust"):
            fail(
                "dpo.label_smoothing",
                f"applies to dpo.loss_type cdpo and robust, not to {config.dpo.loss_type} (TRL's sigmoid ignores it "
                "too); for the smoothed DPO this key gave sigmoid before 2026-12-03 set dpo.loss_type=cdpo, or "
                "remove it",
            )
