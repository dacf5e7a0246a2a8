"""The checks of `actor.rollout_correction.*`: settings that contradict each other or would do nothing."""

from __future__ import annotations

from typing import Callable

from rlkit.core.algos.algorithm import Algorithm
from rlkit.recipes.correction_schema import DEFAULT_ROLLOUT_IS_CAP, LEGACY_CORRECTION_KEYS
from rlkit.recipes.schema import RLConfig

# What each importance-weight option does to the weights, for the refusal when the weights are off.
_WEIGHT_OPTIONS = {
    "rollout_is_threshold": "truncates",
    "rollout_is_threshold_lower": "masks",
    "rollout_is_batch_normalize": "normalises",
}


def check_rollout_correction(
    config: RLConfig, algorithm: Algorithm, origins: dict[str, str], fail: Callable[[str, str], None]
) -> None:
    """Raise (through `fail`, naming the key as it was written) for contradictory rollout-correction settings."""
    section = config.actor.rollout_correction
    options = algorithm.rollout_correction_options

    def key(name: str) -> str:
        """The key as the recipe or command line wrote it: the section's, or its earlier spelling."""
        earlier = [f"actor.{old}" for old, new in LEGACY_CORRECTION_KEYS.items() if new == name]
        return next((k for k in earlier if k in origins), f"actor.rollout_correction.{name}")

    corrects = algorithm.rollout_correction is not None or options.rs is not None
    if corrects and algorithm.old_log_probs == "rollout":
        names = [*_WEIGHT_OPTIONS, "rollout_is", "rollout_rs"]
        fail(
            next((key(name) for name in names if key(name) in origins), key("rollout_is")),
            "with actor.old_log_probs=rollout the old and rollout log-probs are the same, so every weight is 1 "
            "and nothing is rejected; use actor.old_log_probs=auto or recompute",
        )
    if section.rollout_is is None:
        for name, verb in _WEIGHT_OPTIONS.items():
            if getattr(section, name) not in (None, False):
                fail(key(name), f"{verb} importance weights that {key('rollout_is')}=off turns off; remove one of them")
    upper = section.rollout_is_threshold or DEFAULT_ROLLOUT_IS_CAP
    lower = section.rollout_is_threshold_lower
    if lower is not None and lower > upper:
        fail(
            key("rollout_is_threshold_lower"),
            f"IcePop's band [{lower}, {upper}] is empty: the lower bound must be at most {key('rollout_is_threshold')} "
            f"({upper}{'' if section.rollout_is_threshold else ', its default'}); lower one or raise the other",
        )
    check_rejection(section.rollout_rs, section.rollout_rs_threshold, section.rollout_rs_threshold_lower, key, fail)


def check_rejection(
    option: str | None,
    upper: float | None,
    lower: float | None,
    key: Callable[[str], str],
    fail: Callable[[str, str], None],
) -> None:
    """rollout_rs and its thresholds: both given, a lower bound only for k1 options, a band that is not empty."""
    if option is None:
        for name, value in (("rollout_rs_threshold", upper), ("rollout_rs_threshold_lower", lower)):
            if value is not None:
                fail(
                    key(name),
                    f"bounds rejection sampling, which {key('rollout_rs')}=null leaves off; set rollout_rs "
                    "(e.g. token_k1, seq_mean_k1, seq_max_k2) or remove it",
                )
        return
    if upper is None:
        fail(
            key("rollout_rs_threshold"),
            f"{key('rollout_rs')}={option} rejects beyond a bound this key sets and has no default; set it "
            "(e.g. 2.0: for k1 options the ratio band [0.5, 2.0], for k2/k3 the largest divergence kept)",
        )
        return
    if not option.endswith("k1"):
        if lower is not None:
            fail(
                key("rollout_rs_threshold_lower"),
                f"only k1 options have a lower bound ({key('rollout_rs')}={option} keeps divergences up to "
                f"{upper}); remove it or use a *_k1 option",
            )
        return
    band_lower = lower if lower is not None else 1 / upper
    if band_lower > upper:
        where = key("rollout_rs_threshold_lower") if lower is not None else key("rollout_rs_threshold")
        fail(
            where,
            f"{option}'s ratio band [{band_lower:g}, {upper:g}] is empty (without a lower bound it is 1 / upper), "
            "so every token would be rejected; use an upper bound >= 1 and a lower bound <= it",
        )
