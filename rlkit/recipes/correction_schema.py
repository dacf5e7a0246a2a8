"""`actor.rollout_correction.*`: importance weights and rejection between the trainer's old policy and the engine's.

The keys are verl's (`algorithm.rollout_correction.*` in verl, read here as aliases); `actor.rollout_is` and
`actor.rollout_is_cap`, this section's earlier spellings, are read into it (`move_legacy_correction_keys`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from rlkit.recipes.section import Section

# The truncation of rollout importance weights when none is given (TIS's and verl's default).
DEFAULT_ROLLOUT_IS_CAP = 2.0

# verl's rejection options: the divergence (k1 = log pi_rollout/pi_old, k2 = (log r)^2 / 2, k3 = r - 1 - log r)
# per token, or summed, averaged or maximised over each sequence.
RejectionOption = Literal[
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
]

# actor.<old key> -> actor.rollout_correction.<key>: the earlier spellings, read into the section.
LEGACY_CORRECTION_KEYS = {"rollout_is": "rollout_is", "rollout_is_cap": "rollout_is_threshold"}


class RolloutCorrectionConfig(Section):
    rollout_is: Literal["auto", "token", "sequence"] | None = Field(
        "auto",
        description="Importance weights that correct for samples the rollout engine drew from another policy than "
        "the one the update starts from (its numerics, or staleness in rollout.mode one_step_off/async): each "
        "token's policy loss times min(pi_old / pi_rollout, rollout_is_threshold). token: a weight per token "
        "(TIS). sequence: one weight per sequence, the product of its tokens' ratios. auto: token when "
        "rollout.mode is not sync or a rollout_is_* option is set, else off. off (or null): none. The engine "
        "then returns log-probs every step, which costs rollout speed (docs/benchmarks.md). Was actor.rollout_is.",
    )
    rollout_is_threshold: float | None = Field(
        None,
        gt=0,
        description="Upper bound of the importance weights: truncation (TIS: Yao et al. 2025), or with "
        f"rollout_is_threshold_lower the top of IcePop's band. None = {DEFAULT_ROLLOUT_IS_CAP} wherever weights "
        "are on. verl's 'LOWER_UPPER' string (e.g. '0.5_5.0') sets both. Was actor.rollout_is_cap.",
    )
    rollout_is_threshold_lower: float | None = Field(
        None,
        gt=0,
        description="IcePop: weights outside [rollout_is_threshold_lower, rollout_is_threshold] are 0 (their "
        "tokens, or sequences, leave the policy loss) instead of truncated. None = truncation (TIS).",
    )
    rollout_is_batch_normalize: bool = Field(
        False,
        description="Divide the weights by their mean over the step's batch (valid tokens; sequences at sequence "
        "level), so they average 1. Needs the old log-probs before the update: actor.old_log_probs=auto then "
        "runs the old-log-prob pass.",
    )
    rollout_rs: RejectionOption | None = Field(
        None,
        description="Rejection sampling: tokens (token_*) or whole sequences (seq_sum_*, seq_mean_*, seq_max_*) "
        "whose divergence between pi_old and pi_rollout is beyond rollout_rs_threshold get no policy loss. k1 = "
        "log(pi_rollout / pi_old) (kept within [log lower, log upper]; seq_mean_k1 bounds the geometric-mean "
        "ratio), k2 = (log r)^2 / 2, k3 = r - 1 - log r (kept up to the threshold). None = off.",
    )
    rollout_rs_threshold: float | None = Field(
        None,
        gt=0,
        description="rollout_rs's bound: for k1 options the upper ratio bound (the lower is "
        "rollout_rs_threshold_lower, else 1 / upper), for k2/k3 the largest divergence kept. verl's "
        "'LOWER_UPPER' string sets both for k1.",
    )
    rollout_rs_threshold_lower: float | None = Field(
        None,
        gt=0,
        description="The lower ratio bound of a k1 rejection option; None = 1 / rollout_rs_threshold.",
    )

    @field_validator("rollout_is", mode="before")
    @classmethod
    def _off_is_none(cls, value: Any) -> Any:
        """`off` reads as YAML's false (on the command line too): it means no weights, like null."""
        return None if value is False or value == "off" else value

    @model_validator(mode="before")
    @classmethod
    def _split_verl_bands(cls, data: Any) -> Any:
        """verl's 'LOWER_UPPER' threshold strings: the two bounds, into our two keys."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("rollout_is_threshold", "rollout_rs_threshold"):
            value = data.get(key)
            if isinstance(value, str) and "_" in value:
                if data.get(f"{key}_lower") is not None:
                    raise ValueError(f"{key}={value!r} sets a lower bound and so does {key}_lower: keep one")
                lower, _, upper = value.partition("_")
                data[f"{key}_lower"], data[key] = lower, upper
        return data


def move_legacy_correction_keys(data: Any) -> Any:
    """An actor section's raw keys with `rollout_is` and `rollout_is_cap` moved into `rollout_correction`
    (their place now); refused when the section sets the same setting under its own name too."""
    if not isinstance(data, dict) or not any(key in data for key in LEGACY_CORRECTION_KEYS):
        return data
    data = dict(data)
    section = data.get("rollout_correction") or {}
    section = section.model_dump(exclude_unset=True) if isinstance(section, BaseModel) else dict(section)
    for old, new in LEGACY_CORRECTION_KEYS.items():
        if old not in data:
            continue
        if new in section:
            raise ValueError(
                f"actor.{old} is the earlier spelling of actor.rollout_correction.{new}, which is set too: keep one"
            )
        section[new] = data.pop(old)
    data["rollout_correction"] = section
    return data
