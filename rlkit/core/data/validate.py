"""Checks on built rows before prep-data writes them: a row that fails is dropped with its reason."""

from __future__ import annotations

from typing import Any


def row_problem(row: Any) -> str | None:
    """Why `row` is not a usable training row (see builders.py for the schema), or None."""
    if not isinstance(row, dict):
        return f"not a dict but {type(row).__name__}"
    missing = [key for key in ("data_source", "prompt", "reward_model") if key not in row]
    if missing:
        return f"missing key {missing[0]!r}"
    if not isinstance(row["data_source"], str) or not row["data_source"]:
        return "empty 'data_source'"
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            return "empty 'prompt'"
    elif not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
        return "'prompt' is neither text nor a list of {role, content} messages"
    elif not any(isinstance(m.get("content"), str) and m["content"].strip() for m in prompt):
        return "empty 'prompt'"
    if "response" in row and (not isinstance(row["response"], str) or not row["response"].strip()):
        return "empty 'response'"  # an SFT row (--format sft)
    reward = row["reward_model"]
    if not isinstance(reward, dict) or reward.get("ground_truth") in (None, ""):
        return "no 'reward_model.ground_truth'"
    return None
