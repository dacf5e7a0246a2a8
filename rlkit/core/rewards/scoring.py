"""Batched, guarded reward scoring: every row's function runs in a persistent process pool.

Each worker process runs one call at a time, so the controller knows when every call
started: a call that outlives `reward.timeout_s` has its worker killed and replaced
(the rest of the batch goes on), and the row is reported as failed. An exception, a timeout
or a dead worker fails the row, with its index, data_source, function and error;
`reward.on_error` says whether that stops the run (at once: the batch stops at the first
failed row, before any update) or scores the row 0 and counts it in `reward/errors`.

A call that returns, but not a usable score, is invalid, whatever `reward.on_error` says: a
score (or a dict's other value) that is not a number, not finite, or (the score) beyond
+-MAX_ABS_SCORE. (A dict without a 'score' key is the function's own shape, not a value a
response can change: that is a failed row.) The row scores 0, its reason is kept
(ScoredBatch.invalid) and it counts in `reward/invalid`; the run goes on. A reward's output can
depend on the policy's text, and a policy must not be able to stop a run or send it a NaN.
A function that declares its range (registry.score_range) has its scores clamped into it;
others are not clamped. Nothing is scored in the controller's own process, where a hung
call could not be stopped.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from rlkit.core.rewards.custom import user_function
from rlkit.core.rewards.registry import clamp, declared_range, reward_fn_for
from rlkit.core.rewards.worker_pool import Call, Feed, Outcome, RewardError, WorkerPool
from rlkit.recipes.reward_schema import RewardConfig

RULE_OPTIONS = ("gsm8k_method", "format_score")  # reward.* options passed to rules declaring them


@dataclass
class ScoredBatch:
    """One score per response, plus what to log."""

    scores: list[float]
    metrics: dict[str, float]  # reward/errors, reward/<key> means of extra dict keys, call times
    details: list[dict[str, float]] = field(default_factory=list)  # per row: its extra dict keys
    errors: list[str] = field(default_factory=list)  # failed rows' messages (on_error=zero)
    invalid: list[str] = field(default_factory=list)  # rows scored 0 for an unusable return value, and why
    # per row: why its score is what it is, when something says so: the reward's "reason" key, or the row's
    # failure ("reward error: ...", on_error=zero) or unusable return value ("invalid score: ..."); else None
    reasons: list[str | None] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)  # per row: its call failed or its value was unusable (scored 0)


def _call_rule(
    rule: Callable[..., Any],
    options: dict[str, Any],
    data_source: str,
    response: str,
    ground_truth: str,
    extra_info: dict[str, Any],
) -> Any:
    return rule(response, ground_truth, extra_info, **options)


def rule_for(data_source: str, where: str) -> Callable[..., Any]:
    """The registered rule for `data_source`; RewardError naming `where` (a row) if there is none."""
    try:
        return reward_fn_for(data_source)
    except KeyError as exc:
        raise RewardError(
            f"{where}: {exc.args[0]}; set reward.function=path/file.py:fn to score it with your own function"
        ) from None


def check_reward_functions(config: RewardConfig, data_sources: list[str], where: str) -> str:
    """Before a run: reward.function imports, or every row's data_source has a rule; says which."""
    if config.function:
        return f"reward.function={user_function(config.function, 'reward.function').spec}"
    rules = {}
    for row, source in enumerate(data_sources):
        if source not in rules:
            rule = rule_for(source, f"{where}, row {row}")
            rules[source] = f"{rule.__module__}.{rule.__qualname__}"
    return "reward rules: " + ", ".join(f"{source} -> {name}" for source, name in rules.items())


@dataclass(frozen=True)
class _Function:
    fn: Callable[..., Any]  # picklable: sent to the worker processes
    name: str
    score_range: tuple[float, float] | None


class RewardScorer:
    """Scores batches of responses; keep one per run (its worker processes persist)."""

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self._custom: _Function | None = None
        if config.function:
            custom = user_function(config.function, "reward.function")
            self._custom = _Function(custom, custom.spec, declared_range(custom.target, custom.spec))
        self._rules: dict[str, _Function] = {}
        self._pool: WorkerPool | None = WorkerPool(config.num_workers, config.timeout_s)

    def _function_for(self, data_source: str, row: int) -> _Function:
        if self._custom is not None:
            return self._custom
        if data_source not in self._rules:
            rule = rule_for(data_source, f"row {row}")
            declared = inspect.signature(rule).parameters
            options = {k: getattr(self.config, k) for k in RULE_OPTIONS if k in declared}
            name = f"{rule.__module__}.{rule.__qualname__}"
            self._rules[data_source] = _Function(
                functools.partial(_call_rule, rule, options), name, declared_range(rule, name)
            )
        return self._rules[data_source]

    def score(
        self, responses: list[str], data_sources: list[str], ground_truths: list[str], extra_infos: list[dict]
    ) -> ScoredBatch:
        """One score per response; raises RewardError on a failed call unless on_error=zero (an invalid
        score never raises: it scores 0 and is counted)."""
        if not len(responses) == len(data_sources) == len(ground_truths) == len(extra_infos):
            raise ValueError("responses, data_sources, ground_truths and extra_infos differ in length")
        feed = Feed()
        for row, fields in enumerate(zip(data_sources, responses, ground_truths, extra_infos, strict=True)):
            feed.put(row, self.call(row, *fields))
        feed.close()
        return self.collect(self.outcomes(feed, len(responses)), data_sources, extra_infos)

    def call(self, row: int, data_source: str, response: str, ground_truth: str, extra_info: dict) -> tuple[Call, str]:
        """Row `row`'s reward call and its function's name, as a Feed takes them."""
        function = self._function_for(data_source, row)
        return (function.fn, (data_source, response, ground_truth, extra_info)), function.name

    def outcomes(self, feed: Feed, size: int) -> list[Outcome | None]:
        """Rows 0..size-1 run in the pool as `feed` brings them (while a rollout still makes the others), for
        `collect`; on_error=raise stops at the first failed row, leaving the rows after it None."""
        if self._pool is None:
            raise RuntimeError("this RewardScorer is closed")
        return self._pool.run_feed(feed, size, stop_on_error=self.config.on_error == "raise")

    def collect(self, outcomes: list[Outcome | None], data_sources: list[str], extra_infos: list[dict]) -> ScoredBatch:
        """The batch's scores and metrics from its rows' outcomes (`outcomes`, here or in another process's
        scorer of the same config)."""
        functions = [self._function_for(ds, i) for i, ds in enumerate(data_sources)]
        return self._collect(outcomes, functions, data_sources, extra_infos)

    def _collect(
        self,
        outcomes: list[Outcome | None],
        functions: list[_Function],
        data_sources: list[str],
        extra_infos: list[dict],
    ) -> ScoredBatch:
        """Scores and metrics; a failed row raises (on_error=raise: the batch stopped at it) or scores 0;
        an invalid row scores 0; a score outside its function's declared range is clamped into it."""
        errors, invalid = [], []
        for i, outcome in enumerate(outcomes):
            if outcome is None or (outcome.error is None and outcome.invalid is None):
                continue
            index = (extra_infos[i] or {}).get("index")
            dataset_row = f", dataset index {index}" if index is not None else ""
            where = f"row {i} (data_source {data_sources[i]!r}{dataset_row}, function {functions[i].name})"
            if outcome.error is not None:
                errors.append(f"reward failed on {where}: {outcome.error}")
            else:
                invalid.append(f"invalid score on {where}: {outcome.invalid}; scored 0")
        if errors and self.config.on_error == "raise":
            more = f" ({len(errors) - 1} more rows failed)" if len(errors) > 1 else ""  # those that ran by then
            raise RewardError(
                f"{errors[0]}{more}. Fix the function, or set reward.on_error=zero to score "
                "failed rows 0 and count them in reward/errors"
            )
        scored = [o for o in outcomes if o is not None]  # every row, unless the batch stopped early
        assert len(scored) == len(outcomes), "a batch stops early only to raise"
        details = [o.details for o in scored]
        metrics = {"reward/errors": float(len(errors)), "reward/invalid": float(len(invalid))}
        for key in sorted({k for d in details for k in d}):
            values = [d[key] for d in details if key in d]
            metrics[f"reward/{key}"] = sum(values) / len(values)
        if scored:
            seconds = [o.seconds for o in scored]
            metrics["reward/call_seconds_mean"] = sum(seconds) / len(seconds)
            metrics["reward/call_seconds_max"] = max(seconds)
        scores = [
            clamp(o.score, f.score_range) if o.score is not None else 0.0
            for o, f in zip(scored, functions, strict=True)
        ]
        reasons = [
            o.reason
            or (f"reward error: {o.error}" if o.error else f"invalid score: {o.invalid}" if o.invalid else None)
            for o in scored
        ]
        failed = [o.error is not None or o.invalid is not None for o in scored]
        return ScoredBatch(scores, metrics, details, errors, invalid, reasons, failed)

    def call_each(
        self,
        data_sources: list[str],
        responses: list[str],
        ground_truths: list[str],
        extra_infos: list[dict],
        wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
    ) -> list[tuple[str, float | None, str | None, dict[str, float]]]:
        """Each row's function, wrapped by `wrap` (picklable: it runs in the workers), called once in the pool
        under reward.timeout_s, every row run whatever the others do: per row (function name, score, error, the
        dict's other keys).
        For `rlkit train --dry-run`, which judges each raw return value in `wrap`, before scoring does."""
        functions = [self._function_for(ds, i) for i, ds in enumerate(data_sources)]
        rows = zip(data_sources, responses, ground_truths, extra_infos, strict=True)
        calls = [(wrap(f.fn), args) for f, args in zip(functions, rows, strict=True)]
        names = [f.name for f in functions]
        if self._pool is None:
            raise RuntimeError("this RewardScorer is closed")
        outcomes = [o for o in self._pool.run(calls, names, stop_on_error=False) if o is not None]
        assert len(outcomes) == len(calls), "without stop_on_error every call runs"
        return [(name, o.score, o.error, o.details) for name, o in zip(names, outcomes, strict=True)]

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self) -> None:
        """A scorer dropped unclosed (a rollout worker's, at the end of an in-process run) stops its workers."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the modules it needs may be gone (contextlib too)
            pass

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
