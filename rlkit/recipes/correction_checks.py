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

    if algorithm.old_log_probs == "rollout":  # bypass: the correction compares the updated policy with the engine's
        weight_keys = [key(name) for name in [*_WEIGHT_OPTIONS, "rollout_is"] if key(name) in origins]
        if options.batch_normalize:
            fail(
                key("rollout_is_batch_normalize"),
                "needs the batch's weights before the update, and with actor.old_log_probs=rollout (bypass) there is "
                "no old-log-prob pass; remove it or use actor.old_log_probs=auto",
            )
        if algorithm.rollout_correction is not None and algorithm.loss_has_ratio:
            fail(
                weight_keys[0] if weight_keys else key("rollout_is"),
                f"with actor.old_log_probs=rollout (bypass) actor.policy_loss={algorithm.loss}'s ratio is already "
                "pi / pi_rollout, the importance correction (verl's bypass loss_type=ppo_clip applies no weights); "
                "remove it, use actor.policy_loss=gpg (verl's loss_type=reinforce: the weights on the plain policy "
                "gradient) or actor.old_log_probs=auto for decoupled weights",
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
    options: list[str] | None,
    uppers: list[float] | None,
    lowers: list[float | None] | None,
    key: Callable[[str], str],
    fail: Callable[[str, str], None],
) -> None:
    """rollout_rs and its thresholds: one shared or one per option, a lower bound only for k1 options, bands that
    are not empty, no option twice."""
    if not options:
        for name, value in (("rollout_rs_threshold", uppers), ("rollout_rs_threshold_lower", lowers)):
            if value is not None:
                fail(
                    key(name),
                    f"bounds rejection sampling, which {key('rollout_rs')}=null leaves off; set rollout_rs "
                    "(e.g. token_k1, seq_mean_k1, seq_max_k2) or remove it",
                )
        return
    written = ",".join(options)
    repeated = sorted({option for option in options if options.count(option) > 1})
    if repeated:
        fail(key("rollout_rs"), f"names {', '.join(repeated)} more than once ({written}); each option once")
    if uppers is None:
        fail(
            key("rollout_rs_threshold"),
            f"{key('rollout_rs')}={written} rejects beyond a bound this key sets and has no default; set it "
            "(e.g. 2.0: for k1 options the ratio band [0.5, 2.0], for k2/k3 the largest divergence kept)",
        )
        return
    for name, values in (("rollout_rs_threshold", uppers), ("rollout_rs_threshold_lower", lowers)):
        if values is not None and len(values) not in (1, len(options)):
            fail(
                key(name),
                f"{len(values)} values for {len(options)} options ({written}): one shared by all or one per option, "
                "in order",
            )
    for option, upper, lower in zip(options, _shared(uppers, options), _shared(lowers, options), strict=True):
        if not option.endswith("k1"):
            if lower is not None:
                fail(
                    key("rollout_rs_threshold_lower"),
                    f"only k1 options have a lower bound ({option} keeps divergences up to {upper}); remove it, "
                    "give null at its place, or use a *_k1 option",
                )
            continue
        band_lower = lower if lower is not None else 1 / upper
        if band_lower > upper:
            where = key("rollout_rs_threshold_lower") if lower is not None else key("rollout_rs_threshold")
            fail(
                where,
                f"{option}'s ratio band [{band_lower:g}, {upper:g}] is empty (without a lower bound it is 1 / "
                "upper), so every token would be rejected; use an upper bound >= 1 and a lower bound <= it",
            )


def _shared(values: list | None, options: list[str]) -> list:
    """Values given once for every option, or one each (the lengths are checked before)."""
    if values is None:
        return [None] * len(options)
    return values * len(options) if len(values) == 1 else values
