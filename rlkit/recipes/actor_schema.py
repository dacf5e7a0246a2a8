"""`actor.*`, `critic.*` and `algorithm.*`: the update, its loss and the advantage estimator."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rlkit.recipes.correction_schema import RolloutCorrectionConfig, move_bypass_mode, move_legacy_correction_keys
from rlkit.recipes.section import Section

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# Dual-clip PPO's cap (verl's default): the config's and the loss functions' own (rlkit.core.algos.losses).
DEFAULT_CLIP_RATIO_C = 3.0
# actor.micro_batch_tokens=auto on CPU (rlkit.core.train.fast_paths sizes it on GPUs): memory is not the limit there.
CPU_MICRO_BATCH_TOKENS = 16384


class ActorConfig(Section):
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="LR after warm-up.")
    mini_batch_size: int = Field(
        16,
        ge=1,
        description="Prompts per optimizer step (global); with rollout.n samples each. objective sft: rows per "
        "optimizer step; objective dpo: pairs per optimizer step (a multiple of the workers: each holds "
        "whole pairs).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each step's batch.")
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="Per-device token budget of one forward/backward (performance only, never the math). auto = on "
        "GPUs, sized at start-up from the memory free once the models are loaded (at most 65536, at least "
        f"one full-length sequence; printed at start-up); {CPU_MICRO_BATCH_TOKENS} on CPU.",
    )
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    fused_lm_head: bool = Field(
        False,
        description="Compute the LM head and the log-softmax together, a chunk of response tokens at a time "
        "(rlkit.core.train.logprobs.LinearSelectedLogProbs), in the update (RL, dpo) and the actor's and "
        "reference's log-prob passes (not the one optimal_token_baseline's statistics need, which reads every "
        "probability): no [K, V] logits or logits gradient is ever held whole (K response tokens of a "
        "micro-batch x the vocabulary: 3 GB each in bf16 at 10k tokens x 152k), for one more head matmul "
        "(recomputed in backward); an auto actor.micro_batch_tokens grows by what the logits took. Not yet "
        "measured on a GPU (docs/benchmarks.md). Not with objective sft (its token accuracy reads the logits), "
        "a head with a bias or adapters, or a model that changes its logits after the head.",
    )
    policy_loss: str = Field(
        "vanilla",
        description="Registered policy loss: vanilla (PPO clip), gspo (sequence "
        "ratio), cispo (clipped importance weight; docs/algorithms.md).",
    )
    policy_loss_options: dict[str, float] = Field(
        default_factory=dict,
        description="The chosen loss's own hyper-parameters, e.g. {is_clip_high: 0.28} for cispo (each loss's "
        "docstring and docs/algorithms.md list them; a name the loss does not have is refused). PPO's "
        "clip keys stay actor.clip_ratio_low/high/c, read by every loss that declares them.",
    )
    clip_ratio_low: float = Field(0.2, ge=0, description="PPO clip: ratio lower bound is 1 - clip_ratio_low.")
    clip_ratio_high: float = Field(
        0.2,
        ge=0,
        description="PPO clip: ratio upper bound is 1 + clip_ratio_high (DAPO clip-higher raises it).",
    )
    clip_ratio_c: float | None = Field(
        DEFAULT_CLIP_RATIO_C,
        gt=1,
        description="Dual-clip PPO (Ye et al. 2020): where the advantage is negative, the policy loss is capped at -A "
        "* clip_ratio_c, so a token whose ratio ran far above 1 cannot blow up the update. 3.0 as verl's "
        "default; None disables.",
    )
    loss_agg_mode: LossAggMode = Field(
        "token-mean",
        description="How per-token losses become one number: token-mean, token-sum (no normaliser: the gradient "
        "grows with the tokens of a mini-batch), seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm "
        "(docs/algorithms.md, Loss aggregation).",
    )
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    use_kl_loss: bool = Field(False, description="Add a KL(policy || reference) term to the loss (GRPO-style).")
    kl_loss_coef: float = Field(0.001, ge=0, description="Weight of the KL loss term.")
    kl_loss_type: str = Field(
        "low_var_kl",
        description="KL estimator of the loss term: k1, k2, k3/low_var_kl, abs; k1+ and k3+ (low_var_kl+) take "
        "k1's or k3's value with k2's gradient, KL's own (verl's straight-through variants).",
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Importance weights and rejection between the update's old policy and the rollout engine's "
        '(docs/algorithms.md, "Rollout correction"); actor.rollout_is and actor.rollout_is_cap are read as '
        "rollout_correction.rollout_is and rollout_correction.rollout_is_threshold.",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_correction_keys(cls, data: Any) -> Any:
        """actor.rollout_is and actor.rollout_is_cap, this section's earlier spellings, into rollout_correction; verl's
        rollout_correction.bypass_mode into old_log_probs."""
        return move_bypass_mode(move_legacy_correction_keys(data))

    old_log_probs: Literal["auto", "recompute", "rollout"] = Field(
        "auto",
        description="Where the PPO ratio's old log-probs come from. recompute: a forward pass of the trainer before "
        "the update. rollout: the engine's, no pass (verl's rollout_correction.bypass_mode=true): the ratio is "
        "pi / pi_rollout on every optimizer step, and rollout_rs rejects against the policy being updated. auto: with "
        "one optimizer step per RL step (ppo_epochs 1, mini_batch_size == train_batch_size), no KL in "
        "the reward and no batch-normalised rollout weights, the update's own log-probs, detached, which are "
        "the old policy's exactly (TRL's num_iterations=1), so the pass is skipped; otherwise recompute.",
    )


class CriticConfig(Section):
    enable: bool | None = Field(
        None,
        description="Train a value model; None = on exactly when algorithm.adv_estimator is gae.",
    )
    lr: float = Field(1e-5, gt=0, description="Critic AdamW learning rate.")
    cliprange_value: float | None = Field(0.5, description="PPO value clipping range; None disables.")
    warmup_steps: int = Field(0, ge=0, description="RL steps that train only the critic before the actor updates.")
    grad_clip: float = Field(1.0, gt=0, description="Critic global gradient-norm clip.")


class KLControlConfig(Section):
    type: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="Fixed coefficient or the Ziegler et al. adaptive controller.",
    )
    kl_coef: float = Field(0.001, ge=0, description="(Initial) KL-in-reward coefficient.")
    target_kl: float = Field(0.1, gt=0, description="Adaptive controller's target KL per sequence.")
    horizon: int = Field(10000, gt=0, description="Adaptive controller's horizon in samples.")


class DynamicSamplingConfig(Section):
    enable: bool = Field(
        False,
        description="DAPO dynamic sampling: drop prompt groups whose samples all got the same verifier score (no "
        "group-relative signal) and sample more prompts until data.train_batch_size groups remain.",
    )
    max_gen_rounds: int = Field(
        10,
        ge=1,
        description="Most generation rounds per step, the first included. A batch still short after them is filled up "
        "with dropped groups (counted in dapo/groups_filled) instead of stopping the run.",
    )


class AlgorithmConfig(Section):
    adv_estimator: str = Field(
        "grpo",
        description="Registered advantage estimator: grpo, gae, rloo, remax, reinforce_plus_plus, grpo_passk, opo, "
        "optimal_token_baseline, tir_optimal_token_baseline, gdpo, ... (docs/algorithms.md).",
    )
    norm_adv_by_std: bool = Field(
        True, description="grpo and grpo_passk: divide by the group std (false = Dr.GRPO; grpo_passk's plain margin)."
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount (gae, reinforce_plus_plus).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    use_kl_in_reward: bool = Field(False, description="Subtract a per-token KL penalty from the reward (PPO-style).")
    kl_penalty: str = Field("k1", description="KL estimator for the in-reward penalty.")
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    gdpo_reward_keys: list[str] | None = Field(
        None,
        description="gdpo: the reward components, keys of the dict the reward function returns besides 'score' "
        "(e.g. [accuracy, format]); each is normalised within its group before they are summed.",
    )
    gdpo_reward_weights: list[float] | None = Field(
        None, description="gdpo: one weight per gdpo_reward_keys entry, in order (None = 1 each)."
    )
