"""The `reward.*` and `reward_model.*` sections of a recipe."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rlkit.recipes.user_code import UserCode


class OverlongBufferConfig(BaseModel):
    """DAPO's soft overlong punishment, added to the verifier score (rlkit.core.algos.dapo.overlong_penalty)."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(
        False,
        description="Penalise responses that end inside the last `length` tokens before "
        "data.max_response_length, rising linearly to -penalty_factor at "
        "the limit.",
    )
    length: int = Field(
        4096,
        ge=1,
        description="Tokens before data.max_response_length where the penalty ramps up "
        "(must not exceed data.max_response_length).",
    )
    penalty_factor: float = Field(1.0, ge=0, description="Penalty at (and beyond) data.max_response_length.")


class RewardConfig(BaseModel):
    """How responses are scored: a rule function by `data_source`, or your own function.

    Rule functions receive, as keyword arguments, the options below that they declare
    (the GSM8K rule takes `gsm8k_method` and `format_score`, the math rule `format_score`).
    """

    model_config = ConfigDict(extra="forbid")

    function: UserCode | None = Field(
        None,
        description="Your reward function as 'path/file.py:fn' (or 'python:module:fn', or the function itself "
        "from Python: rlkit.train(..., overrides={'reward.function': fn})), used for every row instead of the "
        "data_source registry. Called as fn(data_source, response, ground_truth, extra_info); "
        "returns a float or a dict with 'score' (its other keys are logged as reward/<key>).",
    )
    on_error: Literal["raise", "zero"] = Field(
        "raise",
        description="What a failing call (exception, timeout, dead worker) does: 'raise' stops the "
        "run before the update with the row, data_source and error; 'zero' scores the row 0 "
        "and counts it in reward/errors. An invalid score (NaN, inf, beyond 1e6, not a number) "
        "never stops the run: it scores 0 and counts in reward/invalid.",
    )
    timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds one reward call may take before its worker process is killed and the row "
        "counted as failed (hung calls on different workers time out together).",
    )
    num_workers: int = Field(
        2,
        ge=1,
        description="Reward worker processes, started once and kept across steps; raise it for costly "
        "rewards (math-verify takes ~1-100 ms a call). The pool adds ~0.1 ms a call (~12 ms for "
        "128 exact-match rewards on 2 CPU cores). At least 1: a call in the controller's own "
        "process could not be stopped at timeout_s.",
    )
    while_generating: bool = Field(
        True,
        description="Score each response the moment it finishes, in reward worker processes of the rollout worker "
        "(reward.num_workers per rollout rank), while the rest still generate, so a costly reward (code in a "
        "sandbox) hides behind the decode; the scores are the same. Applies to agent episodes that their "
        "environment does not score (they end at different turns) and to single-turn samples of a streaming "
        "engine (rollout.vllm.streaming, rollout.sglang.streaming), with reward functions (not reward_model). "
        "false: the controller scores the whole batch after the rollout, with reward.num_workers processes in all.",
    )
    gsm8k_method: Literal["strict", "flexible"] = Field(
        "strict",
        description="GSM8K answer extraction: 'strict' takes the number after the last '####', "
        "'flexible' the last number anywhere in the response.",
    )
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)
    format_score: float = Field(
        0.0,
        description="Score of a response whose answer is found (GSM8K '####', math '\\boxed{}') but wrong; "
        "a correct answer scores 1, no answer 0.",
    )


class RewardModelConfig(BaseModel):
    """A sequence-classification reward model (one score per sequence, read at its last token)."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(
        None,
        description="Local directory or hub name of an AutoModelForSequenceClassification with "
        "num_labels=1 that shares the policy's tokenizer; its score replaces the rule/custom "
        "reward. Each worker scores its own share of the batch. None uses no reward model.",
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Sequences per reward-model forward pass on a worker.",
    )
    max_length: int | None = Field(
        None,
        ge=1,
        description="Longer sequences keep only their last max_length tokens (the scored token "
        "stays the real last one); None keeps them whole.",
    )
