"""Validation metrics with hand-computed numbers: unbiased pass@k, maj@k, mean@k per data source."""

from __future__ import annotations

import pytest

from rlkit.core.rewards.gsm8k import gsm8k_answer
from rlkit.core.rewards.math import math_answer
from rlkit.core.rewards.metrics import (
    RowOutcome,
    majority_score,
    pass_at_k,
    pass_ks,
    validation_metrics,
)
from rlkit.core.rewards.registry import answer_fn_for


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 1, 2, 1 - 3 / 6),     # 1 - C(3,2)/C(4,2)
    (4, 2, 2, 1 - 1 / 6),     # 1 - C(2,2)/C(4,2)
    (8, 3, 4, 1 - 5 / 70),    # 1 - C(5,4)/C(8,4)
    (8, 3, 1, 3 / 8),         # pass@1 is the fraction correct
    (5, 2, 4, 1.0),           # fewer than k wrong responses: every draw of 4 holds a right one
    (8, 0, 8, 0.0),
    (8, 8, 1, 1.0),
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 2)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_pass_ks_are_powers_of_two_and_n() -> None:
    assert pass_ks(2) == [1, 2]
    assert pass_ks(4) == [1, 2, 4]
    assert pass_ks(5) == [1, 2, 4, 5]
    assert pass_ks(8) == [1, 2, 4, 8]


def test_majority_vote_scores_the_most_common_answer() -> None:
    assert majority_score(["3", "3", "5", None], [1.0, 1.0, 0.0, 0.0]) == 1.0
    assert majority_score(["7", "7", "2", "2", "2"], [1.0, 1.0, 0.1, 0.1, 0.1]) == pytest.approx(0.1)
    # Responses without an answer do not vote, even when they are the most numerous.
    assert majority_score([None, None, None, "4"], [0.0, 0.0, 0.0, 1.0]) == 1.0
    assert majority_score(["3", "5"], [1.0, 0.0]) == 0.5  # a tie: a fair coin between them
    assert majority_score([None, None], [0.0, 0.0]) == 0.0


def outcomes() -> list[RowOutcome]:
    return [
        RowOutcome("a", 1.0, 2, True, [1.0, 0.0], ["4", "x"]),
        RowOutcome("a", 0.0, 3, False, [0.0, 0.0], [None, "2"]),
        RowOutcome("b", 1.0, 1, True, [1.0, 1.0], None),  # no answer extractor for source b
    ]


def test_metrics_over_all_rows_and_per_source() -> None:
    metrics = validation_metrics(outcomes(), n=2)
    expected = {
        # all rows: greedy 1, 0, 1; samples (1, 0), (0, 0), (1, 1); solved 1, 0, 2 of 2
        "val/reward/mean@1": 2 / 3, "val/response/length_mean": 2.0, "val/response/clip_frac": 1 / 3,
        "val/reward/mean@2": 3 / 6, "val/reward/pass@1": (0.5 + 0 + 1) / 3, "val/reward/pass@2": (1 + 0 + 1) / 3,
        # source a: maj@2 of row 1 is a tie between "4" (1.0) and "x" (0.0), of row 2 "2" (0.0)
        "val/a/reward/mean@1": 0.5, "val/a/response/length_mean": 2.5, "val/a/response/clip_frac": 0.5,
        "val/a/reward/mean@2": 0.25, "val/a/reward/pass@1": 0.25, "val/a/reward/pass@2": 0.5,
        "val/a/reward/maj@2": (0.5 + 0.0) / 2,
        "val/b/reward/mean@1": 1.0, "val/b/response/length_mean": 1.0, "val/b/response/clip_frac": 0.0,
        "val/b/reward/mean@2": 1.0, "val/b/reward/pass@1": 1.0, "val/b/reward/pass@2": 1.0,
    }
    assert metrics.keys() == expected.keys()  # no maj@2 over all rows: source b has no answers
    assert metrics == pytest.approx(expected)


def test_greedy_only_reports_mean_at_1_and_lengths() -> None:
    rows = [RowOutcome("a", 1.0, 2, True, [], None), RowOutcome("a", 0.0, 4, False, [], None)]
    assert validation_metrics(rows, n=0) == {
        "val/reward/mean@1": 0.5, "val/response/length_mean": 3.0, "val/response/clip_frac": 0.5,
        "val/a/reward/mean@1": 0.5, "val/a/response/length_mean": 3.0, "val/a/response/clip_frac": 0.5}


def test_scores_outside_0_1_have_no_pass_at_k() -> None:
    rows = [RowOutcome("a", 2.0, 1, True, [2.0, -1.0], ["1", "2"])]
    metrics = validation_metrics(rows, n=2)
    assert metrics["val/a/reward/mean@2"] == 0.5 and metrics["val/a/reward/maj@2"] == 0.5
    assert not any("pass@" in key for key in metrics)


def test_answer_extractors_by_data_source() -> None:
    import rlkit.core.rewards.scoring  # noqa: F401  (registers every built-in data source)

    assert gsm8k_answer("so #### $1,000.0") == gsm8k_answer("#### 1000") == "1000"
    assert gsm8k_answer("#### 72.50") == "72.5"
    assert gsm8k_answer("it is 5, then 6") is None
    assert gsm8k_answer("it is 5, then 6", gsm8k_method="flexible") == "6"
    assert math_answer(r"thus \boxed{\frac {1} {2}}") == r"\frac{1}{2}"
    assert math_answer("no box") is None
    assert answer_fn_for("openai/gsm8k") is gsm8k_answer
    assert answer_fn_for("synthetic/echo")(" 7 \n") == "7"
    assert answer_fn_for("synthetic/echo")("  ") is None
    assert answer_fn_for("my/own_source") is None
