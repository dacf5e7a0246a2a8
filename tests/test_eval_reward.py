"""`rlkit eval-reward`: gold GSM8K solutions score 100%, and every way the inputs can disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import GSM8K, invoke, require_gsm8k

from rlkit.cli.data_cmds import register
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.gsm8k import build_gsm8k
from rlkit.core.data.synthetic import build_synthetic


def cli(*args: str):
    return invoke(register, "eval-reward", *args)


def report(*args: str) -> dict:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def flat(text: str) -> str:
    return " ".join(text.split())


def write_lines(path: Path, values: list) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path


@pytest.fixture(scope="module")
def gsm8k_test(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    require_gsm8k()
    rows = build_gsm8k(str(GSM8K))["test"]
    return write_parquet(rows, tmp_path_factory.mktemp("gsm8k") / "test.parquet"), rows


def test_gold_solutions_score_100_percent_with_strict_extraction(gsm8k_test, tmp_path: Path) -> None:
    data, rows = gsm8k_test
    gold = write_lines(tmp_path / "gold.jsonl", [{"response": r["extra_info"]["answer"]} for r in rows])
    result = report("--data", str(data), "--responses", str(gold), "reward.gsm8k_method=strict")
    assert result["rows"] == result["scored"] == len(rows) == 1319
    assert result["accuracy"] == 1.0 and result["mean_score"] == 1.0
    assert result["extraction_failures"] == 0 and result["errors"] == 0
    assert result["histogram"] == [{"low": 1.0, "high": 1.0, "count": 1319}]
    assert result["seconds_per_call_mean"] > 0


def small_gsm8k(tmp_path: Path, gsm8k_test) -> Path:
    return write_parquet(gsm8k_test[1][:4], tmp_path / "small.parquet")  # ground truths 18, 3, 70000, 540


def test_extraction_failures_are_counted_with_examples(gsm8k_test, tmp_path: Path) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)
    answers = write_lines(tmp_path / "r.jsonl", ["so 18", "#### 3", "It is $70,000.", "#### 541"])
    strict = report("--data", str(data), "--responses", str(answers), "--examples", "1")
    assert strict["accuracy"] == 0.25 and strict["extraction_failures"] == 2
    assert strict["extraction_failure_examples"] == [{"row": 0, "ground_truth": "18", "response_tail": "so 18"}]
    flexible = report("--data", str(data), "--responses", str(answers), "reward.gsm8k_method=flexible")
    assert flexible["accuracy"] == 0.75 and flexible["extraction_failures"] == 0
    text = flat(cli("--data", str(data), "--responses", str(answers)).output)
    assert "accuracy │ 25.0%" in text and "no answer extracted" in text and "█" in text


def test_several_responses_per_row_give_pass_at_k(gsm8k_test, tmp_path: Path) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)
    answers = write_lines(tmp_path / "r.jsonl", [{"responses": [f"#### {a}", "#### 0"]} for a in (18, 3, 1, 1)])
    result = report("--data", str(data), "--responses", str(answers))
    assert result["responses_per_row"] == 2 and result["scored"] == 8
    assert result["accuracy"] == 0.25 and result["pass@2"] == 0.5


@pytest.mark.parametrize("lines, message", [
    (["#### 18"] * 3, "the data has 4 rows but {path} has 3 response lines"),
    (["#### 18"] * 5, "the data has 4 rows but {path} has 5 response lines"),
    ([{"responses": ["a", "b"]}, {"responses": ["a"]}], "line 2: 1 responses, but line 1 has 2"),
    ([{"text": "a"}], 'line 1: expected a JSON string, {"response": "..."}'),
])
def test_data_and_responses_that_disagree_exit_2(gsm8k_test, tmp_path: Path, lines: list, message: str) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)
    path = write_lines(tmp_path / "r.jsonl", lines)
    result = cli("--data", str(data), "--responses", str(path))
    assert result.exit_code == 2 and message.replace("{path}", str(path)) in flat(result.output), result.output


def test_a_line_that_is_not_json_is_named(gsm8k_test, tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text('"ok"\nnot json\n')
    result = cli("--data", str(small_gsm8k(tmp_path, gsm8k_test)), "--responses", str(tmp_path / "r.jsonl"))
    assert result.exit_code == 2 and "r.jsonl, line 2: not valid JSON" in flat(result.output)


CUSTOM = '''
def length_reward(data_source, response, ground_truth, extra_info):
    if response == "boom":
        raise ValueError("cannot score " + ground_truth)
    return {"score": len(response) / 10, "long": float(len(response) > 5)}
'''


def test_a_custom_function_its_errors_and_on_error_zero(gsm8k_test, tmp_path: Path) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)
    (tmp_path / "mine.py").write_text(CUSTOM)
    function = f"reward.function={tmp_path}/mine.py:length_reward"
    answers = write_lines(tmp_path / "r.jsonl", ["a" * 20, "boom", "abc", "abcdefg"])
    result = cli("--data", str(data), "--responses", str(answers), function)
    assert result.exit_code == 2
    assert "reward failed on row 1 (data_source 'openai/gsm8k', dataset index 1, function" in flat(result.output)
    assert "ValueError: cannot score 3" in flat(result.output)
    zero = report("--data", str(data), "--responses", str(answers), function, "reward.on_error=zero")
    assert zero["errors"] == 1 and "cannot score 3" in zero["error_examples"][0]
    assert zero["mean_score"] == pytest.approx((2.0 + 0 + 0.3 + 0.7) / 4)
    assert zero["accuracy"] is None  # scores outside [0, 1]: no accuracy
    assert zero["metrics"]["reward/long"] == pytest.approx(2 / 3) and zero["extraction_failures"] is None
    # The reward's own keys are printed too (a code reward's tests passed, runs, timeouts), not only in --json.
    text = flat(cli("--data", str(data), "--responses", str(answers), function, "reward.on_error=zero").output)
    assert "reward/long (mean)" in text


def test_limit_scores_the_first_rows_of_a_longer_or_shorter_responses_file(gsm8k_test, tmp_path: Path) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)  # ground truths 18, 3, 70000, 540
    every_row = write_lines(tmp_path / "all.jsonl", ["#### 18", "#### 4", "#### 70000", "#### 540"])
    first_two = report("--data", str(data), "--responses", str(every_row), "--limit", "2")
    assert (first_two["rows"], first_two["scored"], first_two["accuracy"]) == (2, 2, 0.5)
    two_lines = write_lines(tmp_path / "two.jsonl", ["#### 18", "#### 3"])  # responses for the first rows only
    assert report("--data", str(data), "--responses", str(two_lines), "--limit", "2")["accuracy"] == 1.0
    short = cli("--data", str(data), "--responses", str(two_lines), "--limit", "3")
    assert short.exit_code == 2 and f"--limit asks for 3 rows but {two_lines} has 2 response lines" in flat(short.output)


@pytest.mark.parametrize("args, message", [
    (["reward.timout_s=3"], "unknown key 'reward.timout_s'; did you mean 'reward.timeout_s'?"),
    (["reward.on_error=skip"], "reward.on_error='skip': Input should be 'raise' or 'zero'"),
    (["actor.lr=1"], "eval-reward takes reward.KEY=VALUE overrides only"),
    (["--n", "2"], "--n and --save go with --model"),
])
def test_bad_arguments_exit_2(gsm8k_test, tmp_path: Path, args: list[str], message: str) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)
    answers = write_lines(tmp_path / "r.jsonl", ["#### 1"] * 4)
    result = cli("--data", str(data), "--responses", str(answers), *args)
    assert result.exit_code == 2 and message in flat(result.output), result.output


def test_exactly_one_response_source(tmp_path: Path) -> None:
    result = cli("--data", str(tmp_path / "x.parquet"))
    assert result.exit_code == 2 and "give exactly one of --responses FILE or --model PATH" in flat(result.output)


def test_responses_sampled_from_a_tiny_model_and_saved(tmp_path: Path) -> None:
    from rlkit.core.tiny import build_tiny_qwen2

    model = build_tiny_qwen2(tmp_path / "model", hidden_size=64, num_layers=1, num_heads=1, intermediate_size=64)
    data = write_parquet(build_synthetic(task="echo", n_test=8)["test"], tmp_path / "echo.parquet")
    saved = tmp_path / "sampled.jsonl"
    sampled = report("--data", str(data), "--model", str(model), "--n", "2", "--limit", "3",
                     "--max-new-tokens", "3", "--save", str(saved))
    assert sampled["rows"] == 3 and sampled["responses_per_row"] == 2 and sampled["scored"] == 6
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(lines) == 3 and all(len(line["responses"]) == 2 for line in lines)
    write_parquet(build_synthetic(task="echo", n_test=8)["test"][:3], tmp_path / "three.parquet")
    rescored = report("--data", str(tmp_path / "three.parquet"), "--responses", str(saved))
    assert rescored["mean_score"] == sampled["mean_score"]


def test_json_report_holds_each_rows_scores_and_reasons(gsm8k_test, tmp_path: Path) -> None:
    data = small_gsm8k(tmp_path, gsm8k_test)
    responses = [{"responses": [f"#### {a}", "#### 0", "no idea"]} for a in (18, 3, 1, 1)]
    answers = write_lines(tmp_path / "r.jsonl", responses)
    result = report("--data", str(data), "--responses", str(answers))
    wrong = "wrong answer: the extracted answer is not the ground truth"
    none = "no answer extracted: the response holds no answer in the form the rule reads"
    assert result["per_row"] == [
        {"row": 0, "ground_truth": "18", "scores": [1.0, 0.0, 0.0], "reasons": [None, wrong, none]},
        {"row": 1, "ground_truth": "3", "scores": [1.0, 0.0, 0.0], "reasons": [None, wrong, none]},
        {"row": 2, "ground_truth": "70000", "scores": [0.0, 0.0, 0.0], "reasons": [wrong, wrong, none]},
        {"row": 3, "ground_truth": "540", "scores": [0.0, 0.0, 0.0], "reasons": [wrong, wrong, none]}]
    assert result["reasons"] == {"wrong answer": 6, "no answer extracted": 4}
    assert [(e["row"], e["response"]) for e in result["reason_examples"]] == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 0),
                                                                              (2, 2)]  # 3 of each kind


REASONED = '''
def short(data_source, response, ground_truth, extra_info):
    if response == "bad":
        return {"score": 0.0, "reason": 3}
    if len(response) < 3:
        return {"score": 0.0, "reason": "too short: under 3 characters"}
    return {"score": 0.0} if response == "zero" else 1.0
'''


def test_a_custom_rewards_reason_is_shown_and_a_zero_without_one_says_so(tmp_path: Path) -> None:
    data = write_parquet(build_synthetic(task="echo", n_test=4)["test"], tmp_path / "echo.parquet")
    (tmp_path / "mine.py").write_text(REASONED)
    answers = write_lines(tmp_path / "r.jsonl", ["ab", "zero", "long enough", "bad"])
    result = report("--data", str(data), "--responses", str(answers), f"reward.function={tmp_path}/mine.py:short")
    assert [row["reasons"] for row in result["per_row"]] == [
        ["too short: under 3 characters"], ["scored 0: the reward gave no reason"], [None],
        ["invalid score: key 'reason' is 3 (int), not a string"]]
    assert result["metrics"]["reward/errors"] == 0 and "reward/reason" not in result["metrics"]


def test_a_data_file_without_rows_exits_2(gsm8k_test, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    empty = tmp_path / "empty.parquet"  # the columns, no rows
    pq.write_table(pq.read_table(small_gsm8k(tmp_path, gsm8k_test)).slice(0, 0), empty)
    (tmp_path / "r.jsonl").write_text("")
    result = cli("--data", str(empty), "--responses", str(tmp_path / "r.jsonl"))
    assert result.exit_code == 2 and f"--data {empty} has no rows: nothing to score" in flat(result.output)


NAN_REWARD = '''
def as_number(data_source, response, ground_truth, extra_info):
    return float(response)
'''


def test_invalid_scores_are_counted_and_shown_with_their_reasons(tmp_path: Path) -> None:
    data = write_parquet(build_synthetic(task="echo", n_test=3)["test"], tmp_path / "echo.parquet")
    (tmp_path / "mine.py").write_text(NAN_REWARD)
    function = f"reward.function={tmp_path}/mine.py:as_number"
    answers = write_lines(tmp_path / "r.jsonl", ["0.5", "nan", "1e300"])
    result = report("--data", str(data), "--responses", str(answers), function)  # on_error=raise: not stopped
    assert result["invalid"] == 2 and result["errors"] == 0 and result["mean_score"] == pytest.approx(0.5 / 3)
    assert [row["scores"] for row in result["per_row"]] == [[0.5], [0.0], [0.0]]
    assert result["invalid_examples"][0].startswith("invalid score on row 1 (data_source 'synthetic/echo'")
    assert result["invalid_examples"][0].endswith("mine.py:as_number): the return value is nan, not a finite "
                                                  "number; scored 0")
    text = flat(cli("--data", str(data), "--responses", str(answers), function).output)
    assert "invalid │ 2" in text and "invalid score on row 2 (" in text
    assert "the return value is 1e+300, beyond +-1e+06; scored 0" in text
