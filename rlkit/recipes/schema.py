"""The one typed schema of a run. Defaults live here, once; recipes state what differs.

Groups follow verl's names (`data`, `actor`, `rollout`, `algorithm`, `critic`, `trainer`)
so its users find their keys; `rlkit.recipes.aliases` maps verl's long spellings here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkit.recipes.actor_schema import ActorConfig, AlgorithmConfig, CriticConfig
from rlkit.recipes.model_schema import DataConfig, LoraSettings, ModelConfig
from rlkit.recipes.reward_schema import RewardConfig, RewardModelConfig
from rlkit.recipes.rollout_schema import RolloutConfig
from rlkit.recipes.section import Section
from rlkit.recipes.trainer_schema import DPOConfig, SFTConfig, TrainerConfig

# The sections, importable from here as before: each is defined in its own module.
__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "DataConfig",
    "DPOConfig",
    "LoraSettings",
    "ModelConfig",
    "RLConfig",
    "RolloutConfig",
    "SFTConfig",
    "TrainerConfig",
]


class RLConfig(Section):
    """A whole run. `rlkit train --dry-run` prints it resolved."""

    recipe: str = Field("", description="Name of the recipe this config came from.")
    objective: Literal["rl", "sft", "dpo"] = Field(
        "rl",
        description="What a step trains on. rl: samples the policy generates, scored by the reward (rollout, reward, "
        "algorithm, critic). sft: supervised fine-tuning on data.train_files rows (prompt + response, or "
        "chat `messages`), the negative log-likelihood of the response tokens, aggregated by "
        "actor.loss_agg_mode; no rollout engine starts and the RL-only sections are ignored "
        "(docs/algorithms.md, SFT). dpo: preference training on data.train_files pairs (prompt, chosen, "
        "rejected) against the frozen initial model, options under dpo.* (docs/preference.md).",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)

    @property
    def offline(self) -> bool:
        """Trains on rows of a data set (objectives sft, dpo), not on samples of the policy: no rollout engine."""
        return self.objective != "rl"

    @property
    def samples_per_prompt(self) -> int:
        """Sequences each data row becomes in a step: rollout.n samples in RL, a pair's two responses in
        dpo, the row itself in sft."""
        return {"rl": self.rollout.n, "dpo": 2}.get(self.objective, 1)

    @property
    def micro_batch_group(self) -> int:
        """Rows that always share a micro-batch: a dpo pair's two responses (its loss needs both); else 1."""
        return 2 if self.objective == "dpo" else 1

    @property
    def world_size(self) -> int:
        """Training workers: every device, less those that split placement gives to rollout."""
        devices = self.trainer.n_gpus_per_node * self.trainer.nnodes
        return devices - self.rollout.devices if self.rollout.placement == "split" else devices

    def log_prob_check_step(self, step: int) -> bool:
        """The engine returns the sampled tokens' log-probs this step, for rollout/log_prob_diff."""
        freq = self.rollout.log_prob_check_freq
        return (freq > 0 and step % freq == 0) or (step == 1 and self.trainer.invariants != "off")

    @property
    def log_prob_temperature(self) -> float:
        """The temperature of log-prob passes: RL's rollout.temperature (the distribution the engine
        sampled from); 1 offline (the data's likelihood)."""
        return self.rollout.temperature if self.objective == "rl" else 1.0


def with_resolved_budget(config: RLConfig, micro_batch_tokens: int) -> RLConfig:
    """A copy of `config` with actor.micro_batch_tokens as the workers resolved it from "auto" at start-up."""
    actor = config.actor.model_copy(update={"micro_batch_tokens": micro_batch_tokens})
    return config.model_copy(update={"actor": actor})
