"""Math reward via math-verify, and the \\boxed{} extraction the math builder uses."""

from __future__ import annotations

import pytest

from rlkit.core.rewards.math import last_boxed, math_reward
from rlkit.core.rewards.registry import reward_fn_for


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),                 # nested braces
    (r"first \boxed{1}, finally \boxed{2}", "2"),                 # the last one
    (r"\fbox{x^{2}}", "x^{2}"),
    (r"$\boxed 5$", "5"),                                         # the brace-less form
    (r"\boxed{unbalanced", None),
    ("no box", None),
])
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize("response, truth", [
    (r"The answer is \boxed{0.5}", r"\frac{1}{2}"),
    (r"The answer is $\frac12$.", r"\frac{1}{2}"),
    (r"\boxed{1+x^2}", "x^2+1"),
    (r"\boxed{\sqrt 2}", r"\sqrt{2}"),
    (r"\boxed{3, 2}", "2,3"),
    (r"答案 \boxed{-7} ✓", "-7"),
])
def test_equivalent_answers_score_one(response: str, truth: str) -> None:
    assert math_reward(response, truth, {}) == {"score": 1.0, "answer_found": 1.0}


def test_wrong_answer_gets_format_score_and_no_answer_gets_zero() -> None:
    assert math_reward(r"\boxed{4}", "3", {}, format_score=0.1) == {"score": 0.1, "answer_found": 1.0}
    assert math_reward("I give up", "3", {}, format_score=0.1) == {"score": 0.0, "answer_found": 0.0}
    assert math_reward("x" * 100_000, "3", {})["score"] == 0.0


def test_unparseable_ground_truth_raises() -> None:
    with pytest.raises(ValueError, match="ground truth"):
        math_reward(r"\boxed{1}", "", {})


@pytest.mark.parametrize("name", ["math", "DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH"])
def test_registered_names(name: str) -> None:
    assert reward_fn_for(name) is math_reward
