"""What the actor's update reads, stated once per step from the run's Algorithm: never inferred from the keys a
batch happens to hold.

The controller sends the keys `keys()` names and nothing else; the workers' loss reads the same object,
so a missing input is a KeyError at the key, not a silently different update.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rlkit.core.algos.rollout_correction import CorrectionOptions, batch_weight_mean

if TYPE_CHECKING:
    from rlkit.core.algos.algorithm import Algorithm
    from rlkit.core.batch import Batch

BASE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages")


@dataclass(frozen=True)
class UpdateInputs:
    # True: this update is the batch's only optimizer step, so the policy that sampled it is the one being
    # updated and its own log-probs, detached, are the old ones (no old-log-prob pass; it reports the
    # pass's entropy, KL and log-prob gap itself). False: `old_log_probs` come with the batch.
    old_log_probs_from_update: bool
    rollout_log_probs: bool  # the engine's log-probs of the sampled tokens are in the batch
    rollout_correction: tuple[str, float] | None  # importance weights pi_old / pi_rollout: (level, cap)
    reference: bool  # the reference's log-probs, for the KL loss
    # IcePop's band, batch normalisation, rejection sampling (rlkit.core.algos.rollout_correction)
    rollout_correction_options: CorrectionOptions = field(default_factory=CorrectionOptions)
    rollout_is_weight_mean: float | None = None  # the batch's mean weight, with batch normalisation (`for_batch`)
    # Bypass (actor.old_log_probs=rollout): the old log-probs are the engine's, so the correction compares the
    # policy being updated with the engine's (rlkit.core.algos.rollout_correction).
    old_log_probs_from_rollout: bool = False
    # The update hands back its per-token log-probs (the trainer's, before its one optimizer step) for the step's
    # rollout record: `rlkit inspect` shows their gap to the engine's, without a forward pass of its own.
    keep_log_probs: bool = False

    @classmethod
    def for_step(cls, algorithm: Algorithm, *, log_prob_check: bool, recording: bool = False) -> UpdateInputs:
        """The inputs of a step's update; `log_prob_check`: the engine returned its log-probs this step
        (rollout.log_prob_check_freq, or step 1 under trainer.invariants) although the math does not read them;
        `recording`: the step's batch is recorded (trainer.record_rollouts)."""
        rollout_log_probs = algorithm.rollout_log_probs or log_prob_check
        return cls(
            old_log_probs_from_update=algorithm.old_log_probs_from_update,
            rollout_log_probs=rollout_log_probs,
            rollout_correction=algorithm.rollout_correction,
            reference=algorithm.kl_loss,
            rollout_correction_options=algorithm.rollout_correction_options,
            old_log_probs_from_rollout=algorithm.old_log_probs == "rollout",
            # Else an old-log-prob pass gave them (the record keeps old_log_probs), or there is no gap to show.
            keep_log_probs=recording and rollout_log_probs and algorithm.old_log_probs_from_update,
        )

    @property
    def corrects_rollout(self) -> bool:
        """The policy loss is weighted or masked against the rollout policy (importance weights, rejection)."""
        return self.rollout_correction is not None or bool(self.rollout_correction_options.rs)

    def for_batch(self, batch: Batch) -> UpdateInputs:
        """These inputs with what the whole batch decides: the mean weight that batch normalisation divides
        by (its old log-probs come from the pass before the update, rlkit.core.algos.algorithm)."""
        if self.rollout_correction is None or not self.rollout_correction_options.batch_normalize:
            return self
        mean = batch_weight_mean(
            batch["old_log_probs"],
            batch["rollout_log_probs"],
            batch["response_mask"],
            self.rollout_correction,
            self.rollout_correction_options,
        )
        return replace(self, rollout_is_weight_mean=mean)

    def keys(self) -> list[str]:
        """The batch keys the update reads."""
        return [
            *BASE_KEYS,
            *([] if self.old_log_probs_from_update else ["old_log_probs"]),
            *(["rollout_log_probs", "rollout_log_prob_rows"] if self.rollout_log_probs else []),
            *(["ref_log_probs"] if self.reference else []),
        ]
