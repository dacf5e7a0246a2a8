"""`actor.rollout_correction.*`: importance weights and rejection between the trainer's old policy and the engine's.

The keys are verl's (`algorithm.rollout_correction.*` in verl, read here as aliases); `actor.rollout_is` and
`actor.rollout_is_cap`, this section's earlier spellings, are read into it (`move_legacy_correction_keys`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

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
    rollout_rs: list[RejectionOption] | None = Field(
        None,
        description="Rejection sampling: tokens (token_*) or whole sequences (seq_sum_*, seq_mean_*, seq_max_*) "
        "whose divergence between pi_old and pi_rollout is beyond rollout_rs_threshold get no policy loss. k1 = "
        "log(pi_rollout / pi_old) (kept within [log lower, log upper]; seq_mean_k1 bounds the geometric-mean "
        "ratio), k2 = (log r)^2 / 2, k3 = r - 1 - log r (kept up to the threshold). Several options (a list, or "
        "verl's comma-separated string 'token_k1,seq_mean_k3'): a token is kept only where every one keeps it. "
        "None = off.",
    )
    rollout_rs_threshold: list[Annotated[float, Field(gt=0)]] | None = Field(
        None,
        description="rollout_rs's bounds, one shared by every option or one per option in order: for k1 options the "
        "upper ratio bound (the lower is rollout_rs_threshold_lower, else 1 / upper), for k2/k3 the largest "
        "divergence kept. verl's strings set both for k1: '0.5_2.0', or per option '0.5_2.0,0.01'.",
    )
    rollout_rs_threshold_lower: list[Annotated[float, Field(gt=0)] | None] | None = Field(
        None,
        description="The lower ratio bounds of k1 rejection options, one shared or one per option (null for a "
        "k2/k3 option); None = 1 / rollout_rs_threshold.",
    )

    @field_validator("rollout_is", mode="before")
    @classmethod
    def _off_is_none(cls, value: Any) -> Any:
        """`off` reads as YAML's false (on the command line too): it means no weights, like null."""
        return None if value is False or value == "off" else value

    @field_validator("rollout_rs", mode="before")
    @classmethod
    def _options_as_list(cls, value: Any) -> Any:
        """One option, or verl's comma-separated string of several, as a list."""
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    @field_validator("rollout_rs_threshold_lower", mode="before")
    @classmethod
    def _lower_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, (int, float, str)) else value

    @model_validator(mode="before")
    @classmethod
    def _split_verl_bands(cls, data: Any) -> Any:
        """verl's 'LOWER_UPPER' threshold strings: the two bounds, into our two keys (rollout_rs_threshold: per
        option, comma-separated)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        value = data.get("rollout_is_threshold")
        if isinstance(value, str) and "_" in value:
            if data.get("rollout_is_threshold_lower") is not None:
                raise ValueError(
                    f"rollout_is_threshold={value!r} sets a lower bound and so does rollout_is_threshold_lower: "
                    "keep one"
                )
            data["rollout_is_threshold_lower"], _, data["rollout_is_threshold"] = value.partition("_")
        value = data.get("rollout_rs_threshold")
        entries = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
        if value is None or not any(isinstance(entry, str) and "_" in entry for entry in entries):
            data["rollout_rs_threshold"] = None if value is None else entries
            return data
        if data.get("rollout_rs_threshold_lower") is not None:
            raise ValueError(
                f"rollout_rs_threshold={value!r} sets a lower bound and so does rollout_rs_threshold_lower: keep one"
            )
        bands = [str(entry).strip().rpartition("_") for entry in entries]
        data["rollout_rs_threshold"] = [upper for _, _, upper in bands]
        data["rollout_rs_threshold_lower"] = [lower or None for lower, _, _ in bands]
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


def move_bypass_mode(data: Any) -> Any:
    """verl's `rollout_correction.bypass_mode` (the rollout's log-probs as the old policy's, no old-log-prob pass)
    is actor.old_log_probs=rollout: true sets it; false (verl's decoupled mode) leaves the default; either one
    refused against an old_log_probs that says otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("rollout_correction"), dict):
        return data
    section = dict(data["rollout_correction"])
    if "bypass_mode" not in section:
        return data
    bypass, old = section.pop("bypass_mode"), data.get("old_log_probs")
    if not isinstance(bypass, bool):
        raise ValueError(f"rollout_correction.bypass_mode={bypass!r}: true or false")
    if bypass and old not in (None, "rollout"):
        raise ValueError(
            f"rollout_correction.bypass_mode=true (verl's) is actor.old_log_probs=rollout, and actor.old_log_probs is "
            f"{old}: keep one"
        )
    if not bypass and old == "rollout":
        raise ValueError(
            "rollout_correction.bypass_mode=false contradicts actor.old_log_probs=rollout (which is bypass mode): "
            "keep one"
        )
    data = {**data, "rollout_correction": section, **({"old_log_probs": "rollout"} if bypass else {})}
    return data
