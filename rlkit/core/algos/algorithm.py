"""The algorithm of a run, built once from its config: what a step needs, and the advantage and loss it uses.

`Algorithm.from_sections(...)` reads the algorithm, actor and critic sections, the objective, rollout.mode
and data.train_batch_size (`from_config(config)`: the same, from a whole config, for the composition roots
that hold one) and declares, as typed fields, what an RL step must do for them: a reference model, a critic and its
warm-up, where the update's old log-probs come from, an extra rollout (ReMax's greedy baseline), a group
filter (DAPO's dynamic sampling), KL in the reward or in the loss, the policy loss and its terms, the
importance correction. The controller, the rollout sources, the phase plan, the planner, the dry run,
the config checks, replay and the policy worker ask it; nothing outside rlkit/core/algos/ compares an
estimator's, a loss's or an algorithm's name (tests/test_algos_needs.py).

It supplies the operations: `advantage_inputs` (what the estimator reads of a scored batch, the in-reward
KL penalty applied when it is on), `advantages` (the configured estimator with its options), `policy_loss`
(the registered loss with its options, resolved once) and `kl_controller` (the in-reward KL coefficient's
controller). Torch-free at import: the config checks build it; the operations import the torch modules
when first used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from rlkit.core.algos.needs import estimator_needs
from rlkit.core.algos.rollout_correction import CorrectionOptions, resolve

if TYPE_CHECKING:
    from torch import Tensor

    from rlkit.core.algos.advantages import AdvantageInputs
    from rlkit.core.algos.kl import AdaptiveKLController, FixedKLController
    from rlkit.core.batch import Batch
    from rlkit.recipes.actor_schema import ActorConfig, AlgorithmConfig, CriticConfig, KLControlConfig
    from rlkit.recipes.schema import RLConfig

# Where the update's old log-probs (pi_old of the ratio) come from:
#   update   the update's own, detached: it is the batch's only optimizer step (no old-log-prob pass)
#   trainer  a log-prob pass of the policy before the update
#   rollout  the engine's log-probs of the sampled tokens (actor.old_log_probs=rollout)
OldLogProbs = Literal["update", "trainer", "rollout"]
_PLAIN_GRADIENT_LOSSES = frozenset({"gpg"})  # policy losses with no ratio to pi_old (rlkit.core.algos.gpg)


@dataclass(frozen=True)
class Algorithm:
    estimator: str  # the registered advantage estimator (algorithm.adv_estimator)
    estimator_options: dict[str, Any]  # what it is called with: gamma, lam, norm_adv_by_std
    groups: bool  # the estimator compares the samples of one prompt (rollout.n >= 2)
    critic: bool  # a value model: its values each step, its update with the actor's
    critic_warmup_steps: int  # the first steps train only the critic (0 without a critic)
    reference: bool  # the reference's log-probs: for the KL in the reward or the loss, or dpo's losses
    kl_in_reward: bool  # a per-token KL penalty is subtracted from the rewards before the advantages
    kl_penalty: str  # the in-reward penalty's KL estimator (algorithm.kl_penalty)
    kl_loss: bool  # a KL-to-reference term in the actor's loss
    kl_loss_coef: float
    kl_loss_type: str  # the KL loss's estimator
    old_log_probs: OldLogProbs
    greedy_baseline: bool  # an extra rollout: one greedy sample per prompt, scored as its baseline (ReMax)
    # The old-log-prob pass also returns each token's sum of squared probabilities, which the estimator reads
    # with the old log-probs (optimal_token_baseline); the pass then always runs, before the advantages.
    token_stats: bool
    # The reward components the estimator reads, by the reward function's dict keys (gdpo); () for none.
    reward_components: tuple[str, ...]
    group_filter: bool  # groups whose samples all scored the same are dropped and refilled (DAPO)
    max_gen_rounds: int  # generation rounds a step may take (1 without the group filter)
    rollout_log_probs: bool  # the math reads the engine's log-probs on every step
    rollout_correction: tuple[str, float] | None  # importance weights pi_old / pi_rollout: (level, cap)
    # IcePop's band, batch normalisation, rejection sampling (rlkit.core.algos.rollout_correction)
    rollout_correction_options: CorrectionOptions
    loss: str  # the registered policy loss (actor.policy_loss)
    loss_agg_mode: str
    entropy_coeff: float  # the entropy bonus's weight in the actor's loss (0: no term)
    # The section the loss's options are read from (rlkit.core.algos.losses.configured_loss_options).
    actor: ActorConfig = field(repr=False, compare=False)
    kl_ctrl: KLControlConfig = field(repr=False, compare=False)  # the in-reward penalty's coefficient

    @classmethod
    def from_config(cls, config: RLConfig) -> Algorithm:
        """The algorithm of a whole config: `from_sections` with the sections it reads."""
        return cls.from_sections(
            algorithm=config.algorithm,
            actor=config.actor,
            critic=config.critic,
            objective=config.objective,
            rollout_mode=config.rollout.mode,
            train_batch_size=config.data.train_batch_size,
        )

    @classmethod
    def from_sections(
        cls,
        *,
        algorithm: AlgorithmConfig,
        actor: ActorConfig,
        critic: CriticConfig,
        objective: str,
        rollout_mode: str,
        train_batch_size: int,
    ) -> Algorithm:
        """The algorithm of these sections (objectives sft and dpo: no rollout, critic or advantage; dpo
        compares the policy with the reference). `rollout_mode` (rollout.mode) decides the default importance
        correction, `train_batch_size` (data.train_batch_size) whether the update is the batch's only step."""
        algo, rl = algorithm, objective == "rl"
        needs = estimator_needs(algo.adv_estimator)
        has_critic = rl and (critic.enable if critic.enable is not None else needs.critic)
        kl_in_reward, kl_loss = rl and algo.use_kl_in_reward, rl and actor.use_kl_loss
        correction, options = resolve(actor.rollout_correction, rollout_mode)
        one_update = actor.ppo_epochs == 1 and actor.mini_batch_size == train_batch_size
        # Log-probs read before the update (the in-reward KL, the estimator's token statistics, the batch's mean
        # rollout weight, known before the update's first micro-batch): the pass runs.
        before_update = algo.use_kl_in_reward or needs.token_stats or options.batch_normalize
        old: OldLogProbs = "trainer"
        if actor.old_log_probs == "rollout":
            old = "rollout"
        elif actor.old_log_probs == "auto" and one_update and not before_update:
            old = "update"  # nothing before the update reads log-probs, so the update's own are the old ones
        group_filter = rl and algo.dynamic_sampling.enable
        return cls(
            estimator=algo.adv_estimator,
            estimator_options={
                "gamma": algo.gamma,
                "lam": algo.lam,
                "norm_adv_by_std": algo.norm_adv_by_std,
                "gdpo_reward_weights": algo.gdpo_reward_weights,
            },
            groups=rl and needs.groups,
            critic=has_critic,
            critic_warmup_steps=critic.warmup_steps if has_critic else 0,
            reference=objective == "dpo" or kl_in_reward or kl_loss,
            kl_in_reward=kl_in_reward,
            kl_penalty=algo.kl_penalty,
            kl_loss=kl_loss,
            kl_loss_coef=actor.kl_loss_coef,
            kl_loss_type=actor.kl_loss_type,
            old_log_probs=old,
            greedy_baseline=rl and needs.greedy_baseline,
            token_stats=rl and needs.token_stats,
            reward_components=tuple(algo.gdpo_reward_keys or ()) if rl and needs.reward_components else (),
            group_filter=group_filter,
            max_gen_rounds=algo.dynamic_sampling.max_gen_rounds if group_filter else 1,
            rollout_log_probs=actor.old_log_probs == "rollout" or correction is not None or bool(options.rs),
            rollout_correction=correction,
            rollout_correction_options=options,
            loss=actor.policy_loss,
            loss_agg_mode=actor.loss_agg_mode,
            entropy_coeff=actor.entropy_coeff,
            actor=actor,
            kl_ctrl=algo.kl_ctrl,
        )

    @property
    def old_log_probs_from_update(self) -> bool:
        """The policy before the update is the one being updated: no separate old-log-prob pass."""
        return self.old_log_probs == "update"

    @property
    def loss_has_ratio(self) -> bool:
        """The policy loss weighs each token by pi / pi_old (all but the plain policy gradient): in bypass its
        ratio to the engine's policy is already the importance correction."""
        return self.loss not in _PLAIN_GRADIENT_LOSSES

    @property
    def loss_terms(self) -> tuple[str, ...]:
        """The terms of the actor's loss: the policy loss, then the entropy bonus and the KL to the reference."""
        return ("policy", *(["entropy"] if self.entropy_coeff > 0 else []), *(["kl"] if self.kl_loss else []))

    # -- the operations (torch) -------------------------------------------------------------
    def advantage_inputs(self, batch: Batch, kl_ctrl: AdaptiveKLController | FixedKLController) -> AdvantageInputs:
        """What the estimator reads of a scored batch: each score on its response's last policy token, less the
        in-reward KL penalty when it is on (coefficient `kl_ctrl.value`; the batch's KL then moves `kl_ctrl`),
        the critic's values, the greedy baseline's scores and the reward components when the algorithm has them,
        and the old-log-prob pass's token statistics with the rollout importance weights (when they are on) for
        `token_stats`."""
        import torch

        from rlkit.core.algos.advantages import AdvantageInputs
        from rlkit.core.algos.kl import apply_kl_penalty
        from rlkit.core.algos.losses import rollout_importance_weights

        mask = batch["response_mask"]
        last = (mask > 0).long().cumsum(-1).argmax(-1)  # the policy's last token (a loss mask may have holes)
        token_rewards = torch.zeros_like(mask, dtype=torch.float32)
        token_rewards[torch.arange(len(batch)), last] = batch["scores"]
        if self.kl_in_reward:
            old, ref, coef = batch["old_log_probs"], batch["ref_log_probs"], kl_ctrl.value
            token_rewards, kl = apply_kl_penalty(token_rewards, old, ref, mask, coef=coef, kind=self.kl_penalty)
            kl_ctrl.update(float(kl), len(batch))
        stats: dict[str, Tensor] = {}
        if self.token_stats:
            stats = {"old_log_probs": batch["old_log_probs"], "sum_pi_squared": batch["sum_pi_squared"]}
            if self.rollout_correction is not None:  # the same weights the update puts on the tokens' losses
                level, cap = self.rollout_correction
                stats["rollout_is_weights"] = rollout_importance_weights(
                    batch["old_log_probs"], batch["rollout_log_probs"], cap, level=level, response_mask=mask
                )
        return AdvantageInputs(
            token_rewards,
            mask,
            batch["group_ids"],
            values=batch["values"] if self.critic else None,
            baseline_scores=batch["baseline_scores"] if self.greedy_baseline else None,
            reward_components=batch["reward_components"] if self.reward_components else None,
            **stats,
        )

    def advantages(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        """(advantages, returns) of `inputs` by the configured estimator, [B,R] each."""
        from rlkit.core.algos.advantages import compute_advantages

        return compute_advantages(self.estimator, inputs, **self.estimator_options)

    def kl_controller(self) -> AdaptiveKLController | FixedKLController:
        """A new controller of the in-reward KL coefficient (its value is run state: checkpointed)."""
        from rlkit.core.algos.kl import AdaptiveKLController, FixedKLController

        ctrl = self.kl_ctrl
        if ctrl.type == "adaptive":
            return AdaptiveKLController(ctrl.kl_coef, ctrl.target_kl, ctrl.horizon)
        return FixedKLController(ctrl.kl_coef)

    @cached_property
    def loss_options(self) -> dict[str, Any]:
        """The policy loss's options, resolved once (ValueError names one the loss does not have)."""
        from rlkit.core.algos.losses import configured_loss_options

        return configured_loss_options(self.loss, self.actor)

    def policy_loss(
        self, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The configured policy loss per token [B,R] (0 on padding), and its metrics."""
        from rlkit.core.algos.losses import policy_loss

        return policy_loss(self.loss, log_probs, old_log_probs, advantages, response_mask, **self.loss_options)
