"""GSM8K answer extraction and scoring on tricky strings, and on the real GSM8K solutions."""

from __future__ import annotations

import json
import time

import pytest
from conftest import GSM8K, require_gsm8k

from rlkit.core.rewards.gsm8k import extract_answer, gsm8k_reward, to_number
from rlkit.core.rewards.registry import reward_fn_for


def score(response: str, truth: str, method: str = "strict", format_score: float = 0.0) -> float:
    return gsm8k_reward(response, truth, {}, gsm8k_method=method, format_score=format_score)["score"]


@pytest.mark.parametrize("response, truth", [
    ("so 1000 in all.\n#### 1,000", "1000"),        # comma in the answer
    ("#### 1000", "1,000"),                          # comma in the ground truth
    ("#### $18", "18"),                              # dollar sign
    ("#### $ 18", "18"),
    ("#### 72.0", "72"),                             # decimals compare by value
    ("#### 72", "72.00"),
    ("#### 0.5", ".5"),
    ("#### -5", "-5"),                               # negatives
    ("#### \u22125", "-5"),                          # unicode minus sign
    ("#### 3\n(oops)\n#### 7", "7"),                 # several '####': the last counts
    ("答案是 #### 72 🎉", "72"),                       # unicode around the answer
    ("Total: 2,520,000 dollars\n#### 2,520,000", "2520000"),
])
def test_strict_matches_by_value(response: str, truth: str) -> None:
    assert score(response, truth) == 1.0


@pytest.mark.parametrize("response, truth", [
    ("#### 3\n#### 7", "3"),       # only the last '####' counts
    ("#### -5", "5"),
    ("#### 72.5", "72"),
    ("#### 1,0000", "10000"),      # not a comma grouping: reads as 1
])
def test_strict_rejects_wrong_numbers(response: str, truth: str) -> None:
    assert score(response, truth) == 0.0


@pytest.mark.parametrize("response", ["", "I don't know.", "#### ", "#### seventy-two", "the answer is 72"])
def test_strict_without_an_answer_scores_zero_and_reports_it(response: str) -> None:
    result = gsm8k_reward(response, "72", {}, format_score=0.25)
    assert result == {"score": 0.0, "answer_found": 0.0}


def test_format_score_for_a_wrong_but_well_formed_answer() -> None:
    assert gsm8k_reward("#### 71", "72", {}, format_score=0.25) == {"score": 0.25, "answer_found": 1.0}


@pytest.mark.parametrize("response, expected", [
    ("the answer is 72", "72"),
    ("so she pays $1,000.50.", "$1,000.50"),  # trailing period is not a decimal point
    ("10 - 5 = 5", "5"),                      # '- 5' is subtraction, not a negative number
    ("range 3-5", "5"),
    ("it is -12 degrees", "-12"),
    ("it is \u221212 degrees", "-12"),
    ("1,2,3", "3"),                           # list separators are not thousands
    ("no digits here", None),
])
def test_flexible_takes_the_last_number(response: str, expected: str | None) -> None:
    assert extract_answer(response, "flexible") == expected


def test_flexible_and_strict_differ_on_a_bare_number() -> None:
    assert score("the answer is 72", "72", "flexible") == 1.0
    assert score("the answer is 72", "72", "strict") == 0.0


def test_a_100k_character_response_is_scored_quickly() -> None:
    response = "blah 1 " * 14_000 + "x" * 2_000 + "\n#### 42"
    assert len(response) > 100_000
    start = time.perf_counter()
    assert score(response, "42") == 1.0
    assert score(response, "42", "flexible") == 1.0
    assert score("9" * 100_000, "42", "flexible") == 0.0
    assert time.perf_counter() - start < 0.5


def test_to_number_normalises_and_rejects() -> None:
    assert to_number("$1,000.00") == to_number("1000")
    assert to_number("\u22123") == to_number("-3")
    assert to_number("abc") is None and to_number("") is None and to_number("inf") is None


def test_a_ground_truth_that_is_not_a_number_raises_with_the_value() -> None:
    with pytest.raises(ValueError, match="'seventy'"):
        gsm8k_reward("#### 70", "seventy", {})


def test_registered_under_verl_data_source_names() -> None:
    assert reward_fn_for("openai/gsm8k") is gsm8k_reward
    assert reward_fn_for("gsm8k") is gsm8k_reward


def test_every_real_gsm8k_solution_scores_one_against_its_own_answer() -> None:
    require_gsm8k()
    for split in ("train", "test"):
        records = [json.loads(line) for line in (GSM8K / f"{split}.jsonl").read_text().splitlines()]
        for record in records:
            truth = record["answer"].split("####")[-1].strip()
            assert score(record["answer"], truth) == 1.0, record["answer"]
            assert score(record["answer"], truth, "flexible") == 1.0, record["answer"]
