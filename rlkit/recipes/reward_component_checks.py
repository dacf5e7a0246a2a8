"""The checks of `algorithm.gdpo_reward_keys` and `algorithm.gdpo_reward_weights`: the reward components an
estimator reads (gdpo) come from the reward function's dict, and nothing else may replace or reshape them."""

from __future__ import annotations

from typing import Callable

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.needs import estimator_needs, estimators_that
from rlkit.recipes.schema import RLConfig


def check_reward_components(config: RLConfig, algorithm: Algorithm, fail: Callable[[str, str], None]) -> None:
    """Raise (through `fail`, naming the key) where the components are missing, unread or would be bypassed."""
    algo = config.algorithm
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    readers = "/".join(estimators_that("reward_components"))
    if not estimator_needs(algo.adv_estimator).reward_components:
        for name, value in (("gdpo_reward_keys", keys), ("gdpo_reward_weights", weights)):
            if value is not None:
                fail(f"algorithm.{name}", f"only adv_estimator={readers} reads it, not {algo.adv_estimator}; remove it")
        return
    estimator = f"adv_estimator={algo.adv_estimator}"
    if not keys:
        fail(
            "algorithm.gdpo_reward_keys",
            f"{estimator} normalises each reward component on its own and needs their names: the keys of the dict "
            "your reward function returns besides 'score', e.g. algorithm.gdpo_reward_keys=[accuracy,format]",
        )
        return
    if len(set(keys)) != len(keys):
        fail("algorithm.gdpo_reward_keys", f"names a component twice ({keys}); each once")
    if weights is not None and len(weights) != len(keys):
        fail(
            "algorithm.gdpo_reward_weights",
            f"{len(weights)} weights for {len(keys)} components ({keys}); one per key, in order, or none (1 each)",
        )
    # What would produce scores without components, or change the reward the estimator no longer reads.
    bypassed = {
        "reward_model.path": (bool(config.reward_model.path), "a reward model's score has no components"),
        "rollout.agent.env": (
            config.rollout.agent.env is not None,
            "an environment's own reward replaces the reward function's, and has no components",
        ),
        "algorithm.use_kl_in_reward": (
            algorithm.kl_in_reward,
            "the in-reward KL penalty changes the score, which it does not read (use actor.use_kl_loss)",
        ),
        "reward.overlong_buffer.enable": (
            config.reward.overlong_buffer.enable,
            "the overlong shaping changes the score, which it does not read (return a length component instead)",
        ),
    }
    for key, (on, why) in bypassed.items():
        if on:
            fail(key, f"cannot be used with {estimator}: its advantages are built from the reward components; {why}")
