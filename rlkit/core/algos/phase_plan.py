"""The phases of one RL step, derived once from the run's Algorithm (rlkit.core.algos.algorithm).

One description of the step: the controller runs it (Controller.step asks `plan.runs(phase, step)`),
`rlkit plan` prices it (rlkit.core.planning.timing prices each phase it lists, rlkit.core.planning.memory
the peak each reaches) and `--dry-run` prints it (`describe`). A new phase is one entry here, its prices
there (a time, a memory peak or none), and its code in the controller.
Torch-free: the config layer builds it.

The phases, in the order a step runs them (the names are the `timing/<phase>` metrics'):
  gen            the rollout: prompts -> responses (dynamic sampling: rounds until the batch is full)
  gen_baseline   one greedy response per prompt, scored as its baseline (an estimator that needs one)
  old_log_prob   the policy's log-probs before the update (skipped when the update's own are the old ones)
  ref            the reference's log-probs (a KL term in the loss or the reward)
  values         the critic's values
  adv            rewards (less in-reward KL) -> advantages, in the controller, by the Algorithm
  update_critic  the critic's update
  update_actor   the actor's update (not during the critic's warm-up)
  sync           the new weights to the rollout engines (with the actor's update)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlkit.core.algos.algorithm import Algorithm
    from rlkit.recipes.rollout_schema import RolloutConfig

ORDER = ("gen", "gen_baseline", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "sync")
ACTOR_PHASES = ("update_actor", "sync")  # what a critic warm-up step leaves out


@dataclass(frozen=True)
class PhasePlan:
    phases: tuple[str, ...]
    critic_warmup_steps: int = 0
    gen_rounds: int = 1  # dynamic sampling: generation rounds at most

    def __contains__(self, phase: object) -> bool:
        return phase in self.phases

    def runs(self, phase: str, step: int) -> bool:
        """Whether step `step` runs `phase`: the critic's warm-up steps leave the actor (and so the engines'
        weights) as they are."""
        return phase in self.phases and not (phase in ACTOR_PHASES and step <= self.critic_warmup_steps)


def phase_plan(algorithm: Algorithm) -> PhasePlan:
    """The RL step's phases for `algorithm` (objectives sft and dpo have no such step)."""
    wanted = {
        "gen": True,
        "gen_baseline": algorithm.greedy_baseline,
        "old_log_prob": not algorithm.old_log_probs_from_update,
        "ref": algorithm.reference,
        "values": algorithm.critic,
        "adv": True,
        "update_critic": algorithm.critic,
        "update_actor": True,
        "sync": True,
    }
    return PhasePlan(
        tuple(phase for phase in ORDER if wanted[phase]),
        critic_warmup_steps=algorithm.critic_warmup_steps,
        gen_rounds=algorithm.max_gen_rounds,
    )


def describe(plan: PhasePlan, algorithm: Algorithm, rollout: RolloutConfig, *, train_batch_size: int) -> list[str]:
    """The plan in words, one line a phase, for `--dry-run` (`rollout`: the samples per prompt, the placement
    and the mode; `train_batch_size`: data.train_batch_size, the prompts of a step)."""
    prompts, n = train_batch_size, rollout.n
    old = (
        "old_log_prob: the policy's log-probs before the update"
        if algorithm.old_log_probs != "rollout"
        else "old_log_prob: the engine's log-probs are the old ones (actor.old_log_probs=rollout)"
    )
    if algorithm.token_stats:
        old += f", with each token's sum of squared probabilities ({algorithm.estimator} reads both)"
    words = {
        "gen": (
            f"gen: up to {plan.gen_rounds} rounds of {prompts} prompts per step, until "
            f"{prompts} groups with differing scores are found (dynamic sampling)"
            if plan.gen_rounds > 1
            else f"gen: {prompts} prompts x {n} samples"
        ),
        "gen_baseline": (
            f"gen_baseline: {algorithm.estimator}: {prompts} more greedy samples per step (one per prompt) as baselines"
        ),
        "old_log_prob": old,
        "ref": "ref: the reference's log-probs ("
        + " and ".join(
            what
            for what, on in (
                ("KL loss", algorithm.kl_loss),
                ("KL in the reward", algorithm.kl_in_reward),
            )
            if on
        )
        + ")",
        "values": "values: a critic (value model) beside each worker: one values pass per step",
        "adv": f"adv: {algorithm.estimator} advantages in the controller",
        "update_critic": "update_critic: the critic's update, the same mini-batches as the actor's",
        "update_actor": (
            f"update_actor: {algorithm.loss} loss{_extra_terms(algorithm)}, {algorithm.loss_agg_mode}"
            + (
                f"; the first {plan.critic_warmup_steps} step(s) train only the critic"
                if plan.critic_warmup_steps
                else ""
            )
        ),
        "sync": f"sync: weights to the rollout engines ({rollout.placement} placement, {rollout.mode})",
    }
    return ["each step runs: " + " -> ".join(plan.phases)] + [f"  {words[phase]}" for phase in plan.phases]


def _extra_terms(algorithm: Algorithm) -> str:
    """The actor loss's terms beside the policy loss, with their weights."""
    words = {
        "entropy": f"entropy bonus x{algorithm.entropy_coeff:g}",
        "kl": f"KL to the reference ({algorithm.kl_loss_type}) x{algorithm.kl_loss_coef:g}",
    }
    return "".join(f" + {words[term]}" for term in algorithm.loss_terms if term != "policy")
