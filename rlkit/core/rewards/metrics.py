"""Validation metrics over each prompt's responses: mean@k, unbiased pass@k, maj@k.

Pure functions of scores and extracted answers; rlkit.core.controller.validation produces
them and logs the keys this module names (`val/<data_source>/reward/mean@1`, ...).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that k responses drawn without replacement from n, c of them correct, hold a correct one.

    The unbiased estimator of Chen et al. 2021, 1 - C(n-c, k) / C(n, k), in exact integers
    (no rounding until the one division).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(n: int) -> list[int]:
    """The k of pass@k reported for n samples: powers of two below n, and n."""
    return [2**i for i in range(n.bit_length()) if 2**i < n] + [n]


def majority_score(answers: list[str | None], scores: list[float]) -> float:
    """The score of the answer most responses give (responses without an answer do not vote).

    Each answer's score is the mean of its responses' scores (a verifier gives them one
    score); a tie between answers scores their mean, the expectation of a fair coin
    between them. No answer at all scores 0.
    """
    by_answer: dict[str, list[float]] = {}
    for answer, score in zip(answers, scores, strict=True):
        if answer is not None:
            by_answer.setdefault(answer, []).append(score)
    if not by_answer:
        return 0.0
    votes = Counter({answer: len(s) for answer, s in by_answer.items()})
    top = max(votes.values())
    winners = [by_answer[answer] for answer, count in votes.items() if count == top]
    return sum(sum(s) / len(s) for s in winners) / len(winners)


@dataclass
class RowOutcome:
    """One validation prompt: its greedy response, and its sampled ones (none when val_n is 0)."""

    data_source: str
    greedy_score: float
    greedy_length: int
    greedy_finished: bool
    sample_scores: list[float]
    sample_answers: list[str | None] | None  # None: the data_source has no answer extractor


def validation_metrics(outcomes: list[RowOutcome], n: int) -> dict[str, float]:
    """`val/...` over all rows, and `val/<data_source>/...` per source, for n samples per row (0: greedy only)."""
    sources: dict[str, list[RowOutcome]] = {}
    for outcome in outcomes:
        sources.setdefault(outcome.data_source, []).append(outcome)
    metrics = group_metrics(outcomes, n, "val/")
    for source, rows in sorted(sources.items()):
        metrics.update(group_metrics(rows, n, f"val/{source}/"))
    return metrics


def group_metrics(rows: list[RowOutcome], n: int, prefix: str) -> dict[str, float]:
    """mean@1 (greedy), the greedy responses' length and clip fraction; with n >= 2 samples also
    mean@n, pass@k where every score lies in [0, 1] (a score of 1 counts as solved), and maj@n
    where every row's answers can be extracted."""
    count = len(rows)
    metrics = {
        f"{prefix}reward/mean@1": sum(r.greedy_score for r in rows) / count,
        f"{prefix}response/length_mean": sum(r.greedy_length for r in rows) / count,
        f"{prefix}response/clip_frac": sum(not r.greedy_finished for r in rows) / count,
    }
    if n < 2:
        return metrics
    metrics[f"{prefix}reward/mean@{n}"] = sum(sum(r.sample_scores) for r in rows) / (count * n)
    if all(0.0 <= s <= 1.0 for r in rows for s in r.sample_scores):
        solved = [sum(s >= 1.0 for s in r.sample_scores) for r in rows]
        for k in pass_ks(n):
            metrics[f"{prefix}reward/pass@{k}"] = sum(pass_at_k(n, c, k) for c in solved) / count
    if all(r.sample_answers is not None for r in rows):
        metrics[f"{prefix}reward/maj@{n}"] = (
            sum(majority_score(r.sample_answers, r.sample_scores) for r in rows) / count
        )
    return metrics
