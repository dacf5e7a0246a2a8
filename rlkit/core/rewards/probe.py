"""`rlkit train --dry-run`'s reward check: the reward called on a few training rows, as the run calls it.

Importing a reward proves little: one that hangs, returns NaN or takes the wrong parameters
imports fine and fails at step 1, after the cluster started. So the dry run calls it on the
first PROBED_ROWS training rows with two canned responses each, the row's ground truth (what a
correct answer holds) and an empty string (what a model that stops at once gives: rewards that
parse the response often crash on it), through the run's own guarded scorer (its worker
processes, reward.timeout_s). Each raw return value is judged in the worker (checked_call.py)
before the scorer sees it, so a NaN is a finding whatever the scorer does with it in a run.
"""

from __future__ import annotations

import inspect

from rlkit.core.data.dataset import PromptRow
from rlkit.core.rewards.checked_call import CheckedCall, ReturnValueProblem
from rlkit.core.rewards.custom import resolve
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.errors import UserError
from rlkit.recipes.reward_schema import RewardConfig
from rlkit.recipes.user_code import reference

PROBED_ROWS = 2
RESPONSES = (("the row's ground truth", lambda row: row.ground_truth), ("an empty string", lambda row: ""))
CALLED_AS = "fn(data_source, response, ground_truth, extra_info)"


def signature_problem(config: RewardConfig) -> str | None:
    """reward.function's parameters against how it is called, or None (the built-in rules are rlkit's)."""
    if not config.function:
        return None
    try:
        signature = inspect.signature(resolve(config.function, "reward.function"))
    except (TypeError, ValueError):  # no signature to read (a builtin, a C extension): the call itself will tell
        return None
    try:
        signature.bind("data_source", "response", "ground_truth", {})
    except TypeError:
        return f"takes {signature}, but rewards are called as {CALLED_AS}"
    return None


def probe_reward(config: RewardConfig, rows: list[PromptRow], components: tuple[str, ...] = ()) -> str:
    """The first PROBED_ROWS rows scored with each canned response; what they scored, in words. UserError
    naming the function, the row and the problem at the first call that fails, or that returns without one of
    the reward `components` the estimator reads (gdpo: algorithm.gdpo_reward_keys)."""
    rows = rows[:PROBED_ROWS]
    problem = signature_problem(config)
    if problem:
        raise UserError(
            f"reward.function={reference(config.function)} cannot be called on training row {rows[0].index}: "
            f"it {problem}; `rlkit train --dry-run` calls it as the run will"
        )
    cases = [(what, row, response(row)) for what, response in RESPONSES for row in rows]
    with RewardScorer(config) as scorer:
        results = scorer.call_each(
            [row.data_source for _, row, _ in cases],
            [text for _, _, text in cases],
            [row.ground_truth for _, row, _ in cases],
            [row.extra_info for _, row, _ in cases],
            CheckedCall,
        )
    for (what, row, _), (name, _, error, details) in zip(cases, results, strict=True):
        where = f"training row {row.index} (data_source {row.data_source!r}, response: {what})"
        if error:
            raise UserError(
                f"reward function {name} failed on {where}: {_plain(error)}; `rlkit train "
                "--dry-run` calls it as the run will. Fix the function"
            )
        missing = [key for key in components if key not in details]
        if missing:
            raise UserError(
                f"reward function {name} returned no {', '.join(map(repr, missing))} on {where} (its keys besides "
                f"'score': {sorted(details)}); algorithm.gdpo_reward_keys names keys of the dict it returns: return "
                "them on every row, or fix the keys"
            )
    scores: dict[str, list[str]] = {what: [] for what, _ in RESPONSES}
    for (what, _, _), (_, score, _, _) in zip(cases, results, strict=True):
        scores[what].append(f"{score:g}")
    names = ", ".join(sorted({name for name, _, _, _ in results}))
    return (
        f"reward {names} called on training row(s) {', '.join(str(row.index) for row in rows)} within "
        f"reward.timeout_s={config.timeout_s:g}: "
        + "; ".join(f"response {what} scores {', '.join(values)}" for what, values in scores.items())
    )


def _plain(error: str) -> str:
    """A ReturnValueProblem's own words, without the type and the place it was raised (CheckedCall)."""
    prefix = f"{ReturnValueProblem.__name__}: "
    return error[len(prefix) :].rsplit(" (at ", 1)[0] if error.startswith(prefix) else error
