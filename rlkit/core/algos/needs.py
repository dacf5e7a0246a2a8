"""What each advantage estimator needs from an RL step, declared beside the math, so that nothing outside
rlkit/core/algos/ tests an estimator's name: the config's checks, the rollout (a greedy baseline), the
planner and the dry run ask this table. Torch-free: the config schema reads it.

A new estimator is its function (in advantages.py or a module of its own), its line in rlkit.core.registrations
and one line here; tests/test_algos_needs.py checks that the table and the registry name the same estimators
and that `options` are exactly the keyword-only parameters each estimator reads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorNeeds:
    critic: bool = False  # a value model's per-token values (and its update every step)
    groups: bool = False  # several samples of each prompt, compared with each other (rollout.n >= 2)
    greedy_baseline: bool = False  # one more, greedy, sample per prompt, scored as the baseline
    # The trainer's old-log-prob pass before the advantages, with each token's sum of squared probabilities.
    token_stats: bool = False
    # Each sample's reward components (the reward function's dict keys named by algorithm.gdpo_reward_keys).
    reward_components: bool = False
    options: tuple[str, ...] = ()  # the algorithm.* keys it reads (set on the command line, any other does nothing)


ESTIMATOR_NEEDS: dict[str, EstimatorNeeds] = {
    "gae": EstimatorNeeds(critic=True, options=("gamma", "lam")),
    "grpo": EstimatorNeeds(groups=True, options=("norm_adv_by_std",)),
    "rloo": EstimatorNeeds(groups=True),
    "remax": EstimatorNeeds(greedy_baseline=True),
    "reinforce_plus_plus": EstimatorNeeds(options=("gamma",)),
    "reinforce_plus_plus_baseline": EstimatorNeeds(groups=True),
    "grpo_passk": EstimatorNeeds(groups=True, options=("norm_adv_by_std",)),
    "opo": EstimatorNeeds(groups=True),
    "optimal_token_baseline": EstimatorNeeds(groups=True, token_stats=True),
    "tir_optimal_token_baseline": EstimatorNeeds(groups=True, token_stats=True),
    "gdpo": EstimatorNeeds(groups=True, reward_components=True, options=("norm_adv_by_std", "gdpo_reward_weights")),
}


def estimator_needs(name: str) -> EstimatorNeeds:
    """The needs of estimator `name` (an unknown name, refused by the config check, needs nothing)."""
    return ESTIMATOR_NEEDS.get(name, EstimatorNeeds())


def estimators_that(need: str) -> list[str]:
    """The estimators with `need` (an EstimatorNeeds flag, or an option name they read), for messages."""
    return [
        name for name, needs in ESTIMATOR_NEEDS.items() if getattr(needs, need, False) is True or need in needs.options
    ]
