"""The RL math: advantage estimators, policy/value losses, KL estimators, DAPO helpers.

Estimators, losses and KL estimators live in string registries so a recipe names them;
docs/algorithms.md gives each one's formula, paper and option names. A policy loss in a module of
its own is registered here, the one line that makes it a recipe's `actor.policy_loss`.
"""

from rlkit.core.algos.advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
)
from rlkit.core.algos.cispo import cispo
from rlkit.core.algos.dapo import groups_with_signal, overlong_penalty
from rlkit.core.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
)
from rlkit.core.algos.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    entropy_from_logits,
    loss_options,
    policy_loss,
    rollout_importance_weights,
    value_loss,
)

POLICY_LOSSES.register("cispo")(cispo)

__all__ = [
    "ADV_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "FixedKLController",
    "aggregate_loss",
    "apply_kl_penalty",
    "compute_advantages",
    "entropy_from_logits",
    "groups_with_signal",
    "kl_estimate",
    "loss_options",
    "overlong_penalty",
    "policy_loss",
    "rollout_importance_weights",
    "value_loss",
]
