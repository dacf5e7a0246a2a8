"""`rlkit prep-data reasoning-gym` and its reward: rows as reasoning-gym generates them, a reproducible split with
no shared question, the task's options checked, `--list`, and the task's own scorer rebuilt from a row."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import invoke

from rlkit.cli.data_cmds import register
from rlkit.core.data import reasoning_gym as rg_data
from rlkit.core.data.builders import Dropped
from rlkit.core.data.reasoning_gym import INSTRUCTION, NO_SINGLE_ANSWER, TEST_SEED_OFFSET, build_reasoning_gym
from rlkit.core.rewards.reasoning_gym import from_json, reasoning_gym_answer, reasoning_gym_reward, to_json
from rlkit.core.rewards.registry import answer_fn_for, reward_fn_for
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.recipes.reward_schema import RewardConfig

reasoning_gym = pytest.importorskip("reasoning_gym")
# 'Calculate 4.': one number from 0 to 10, so 11 questions, and the split must drop train rows.
ONE_NUMBER = {"min_terms": 1, "max_terms": 1, "max_digits": 1, "allow_parentheses": False}


def cli(*args: str):
    return invoke(register, "prep-data", *args)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_rows_hold_what_reasoning_gym_generated(tmp_path: Path) -> None:
    result = cli("reasoning-gym", "--task", "basic_arithmetic", "-o", "max_terms=3", "-o", "operators=[+, -]",
                 "--size", "5", "--test-size", "3", "--seed", "7", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for split, seed, size in (("train", 7, 5), ("test", 7 + TEST_SEED_OFFSET, 3)):
        expected = reasoning_gym.create_dataset("basic_arithmetic", max_terms=3, operators=["+", "-"], seed=seed,
                                                size=size)
        rows = pq.read_table(tmp_path / f"{split}.parquet").to_pylist()
        assert len(rows) == size
        for index, row in enumerate(rows):
            entry = expected[index]
            assert row["data_source"] == "reasoning_gym/basic_arithmetic" and row["ability"] == "reasoning"
            assert row["prompt"] == [{"role": "user", "content": f"{entry['question']}\n\n{INSTRUCTION}"}]
            assert row["reward_model"] == {"style": "rule", "ground_truth": entry["answer"]}
            info = row["extra_info"]
            assert (info["split"], info["index"], info["task"]) == (split, index, "basic_arithmetic")
            assert from_json(info["config"]) == {"max_terms": 3, "operators": ["+", "-"], "seed": seed, "size": size}
            assert from_json(info["entry"]) == entry  # metadata's tuples come back as tuples


def test_the_split_is_reproducible_and_shares_no_question() -> None:
    splits = build_reasoning_gym(task="basic_arithmetic", size=12, test_size=4, seed=0, **ONE_NUMBER)
    assert build_reasoning_gym(task="basic_arithmetic", size=12, test_size=4, seed=0, **ONE_NUMBER) == splits
    other = build_reasoning_gym(task="basic_arithmetic", size=12, test_size=4, seed=1, **ONE_NUMBER)
    assert other["test"] != splits["test"]
    questions = [e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=12, **ONE_NUMBER)]
    test = [r["prompt"][0]["content"].split("\n")[0] for r in splits["test"]]
    assert test == ["Calculate 8.", "Calculate 0.", "Calculate 9.", "Calculate 10."]
    # Train entries 0 and 5 ('Calculate 8.', 'Calculate 10.') are test questions: dropped, the others kept in order.
    dropped = [i for i, row in enumerate(splits["train"]) if isinstance(row, Dropped)]
    assert dropped == [i for i, q in enumerate(questions) if q in test] == [0, 5]
    assert {splits["train"][i].reason for i in dropped} == {"same question as a test row"}
    kept = [r["prompt"][0]["content"].split("\n")[0] for r in splits["train"] if not isinstance(r, Dropped)]
    assert kept == [q for q in questions if q not in test]
    # A larger train split leaves the test split as it was.
    assert build_reasoning_gym(task="basic_arithmetic", size=20, test_size=4, seed=0, **ONE_NUMBER)["test"] == splits[
        "test"]


def test_prep_data_reports_the_dropped_rows(tmp_path: Path) -> None:
    options = [arg for key, value in ONE_NUMBER.items() for arg in ("-o", f"{key}={str(value).lower()}")]
    result = cli("reasoning-gym", "--task", "basic_arithmetic", *options, "--size", "12", "--test-size", "4",
                 "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "2 same question as a test row" in flat(result.output)
    assert len(pq.read_table(tmp_path / "train.parquet")) == 10


def test_sft_rows_and_tasks_without_one_answer() -> None:
    (row,) = build_reasoning_gym(task="basic_arithmetic", size=1, test_size=1, format="sft", instruction="")["train"]
    assert row["response"] == f"<answer>{row['reward_model']['ground_truth']}</answer>"
    assert row["prompt"][0]["content"] == from_json(row["extra_info"]["entry"])["question"]  # instruction=''
    # rubiks_cube has no single answer (its scorer checks the moves): RL rows say so; SFT has nothing to train on.
    (rl,) = build_reasoning_gym(task="rubiks_cube", size=1, test_size=1)["train"]
    assert rl["reward_model"]["ground_truth"] == NO_SINGLE_ANSWER
    (sft,) = build_reasoning_gym(task="rubiks_cube", size=1, test_size=1, format="sft")["train"]
    assert sft == Dropped("no single answer to train on (--format sft)")


def test_metadata_stored_as_text_is_checked_by_scoring(monkeypatch) -> None:
    # time_intervals keeps datetimes in its metadata: stored as their str(), and its scorer does not read them.
    (row,) = build_reasoning_gym(task="time_intervals", size=1, test_size=1, seed=0)["train"]
    assert from_json(row["extra_info"]["entry"])["metadata"]["start_time"] == "2503-09-17 00:00:00"

    class ReadsTheTime:  # a scorer that does read the datetime: the stored text would score differently
        def score_answer(self, answer, entry):
            return float(isinstance(entry["metadata"]["at"], datetime.time))

    entry = {"question": "When?", "answer": "noon", "metadata": {"at": datetime.time(12, 0)}}
    monkeypatch.setattr(rg_data, "dataset_for", lambda task, config: ReadsTheTime())
    problem = rg_data._storage_problem("t", "{}", ReadsTheTime(), entry, to_json(entry))
    assert problem == "the stored entry scores differently from the generated one"


@pytest.mark.parametrize("args, message", [
    (["--task", "basic_arithmetic", "-o", "max_term=2"],
     "reasoning-gym task 'basic_arithmetic' has no option 'max_term'; did you mean 'max_terms'? (its options: "
     "min_terms, max_terms, min_digits, max_digits, operators, allow_parentheses, allow_negation, format_style, "
     "whitespace;"),
    (["--task", "basic_arithmetic", "-o", "max_terms=0"],
     "reasoning-gym task 'basic_arithmetic' cannot generate with -o max_terms=0: AssertionError: max_terms must "
     "be >= min_terms"),
    (["--task", "basic_arithmetc"], "unknown reasoning-gym task 'basic_arithmetc'; did you mean 'basic_arithmetic'?"),
    ([], "name a task: --task NAME"),
    (["--task", "composite"], "--task composite: not supported, it mixes tasks"),
    (["--task", "gcd", "--size", "0"], "--size 0 --test-size 100 --seed 0: whole numbers, sizes at least 1"),
    (["--task", "gcd", "-o", "size=ten"], "--size 'ten' --test-size 100 --seed 0: whole numbers, sizes at least 1"),
    (["--task", "gcd", "--source", "dir"], "reasoning-gym generates its data: drop --source"),
])
def test_user_errors_exit_2_with_the_fix(tmp_path: Path, args: list[str], message: str) -> None:
    result = cli("reasoning-gym", *args, "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert message in flat(result.output)
    assert not list(tmp_path.iterdir())


def test_list_shows_the_tasks_and_a_tasks_options() -> None:
    listed = cli("reasoning-gym", "--list")
    assert listed.exit_code == 0, listed.output
    lines = {line.split("│")[1].strip(): line for line in listed.output.splitlines() if line.count("│") == 3}
    assert "composite" not in lines and len(lines) == len(reasoning_gym.factory.DATASETS) - 1
    assert "Dataset that generates basic arithmetic tasks" in lines["basic_arithmetic"]
    options = cli("reasoning-gym", "--task", "basic_arithmetic", "--list")
    assert options.exit_code == 0, options.output
    text = flat(options.output)
    for key, default in (("max_terms", "6"), ("operators", "('+', '-', '*', '/')"), ("format_style", "'simple'")):
        assert f"│ {key} │ {default} │" in text
    assert "│ seed │" not in text  # --seed sets it
    builders = flat(cli("--list").output)
    assert "reasoning-gym │ reasoning-gym's generated tasks" in builders and "**task_options" in builders
    assert "arithmetic options (-o KEY=VALUE): n_train=20000" in flat(cli("arithmetic", "--list").output)


def extra(task: str, seed: int = 1) -> tuple[str, dict]:
    (row,) = build_reasoning_gym(task=task, size=1, test_size=1, seed=seed)["train"]
    return row["reward_model"]["ground_truth"], row["extra_info"]


@pytest.mark.parametrize("response, score, found", [
    ("<answer>94*4 - 61 - 6</answer>", 1.0, 1.0),               # the generated answer
    ("So: <answer> 4*94 - 6 - 61 </answer>", 1.0, 1.0),          # another expression hitting 309 with all four
    ("<answer>1</answer> no, <answer>94*4-61+6</answer>", 0.05, 1.0),  # the last tags count: all numbers, 321
    ("<answer>94*4</answer>", 0.05, 1.0),                        # not every number used
    ("94*4 - 61 - 6", 0.01, 0.0),                                # malformed: no answer tags
    ("<answer>94*4 - 61 - 6", 0.01, 0.0),                        # malformed: unclosed
])
def test_reward_is_the_tasks_own_scorer(response: str, score: float, found: float) -> None:
    # countdown, seed 1: 'Calculate 309 using all of these numbers: 6, 61, 94, 4.' Its scorer evaluates the
    # expression and checks the numbers from the stored metadata: 1 right, 0.05 wrong, 0.01 nothing to parse.
    truth, info = extra("countdown")
    assert truth == "94*4 - 61 - 6"
    assert reasoning_gym_reward(response, truth, info) == {"score": score, "answer_found": found}


def test_reward_partial_credit_and_lookups() -> None:
    truth, info = extra("basic_arithmetic", seed=0)
    assert reward_fn_for("reasoning_gym/basic_arithmetic") is reasoning_gym_reward
    assert answer_fn_for("reasoning_gym/basic_arithmetic") is reasoning_gym_answer
    assert reasoning_gym_reward(f"<answer>{truth}</answer>", truth, info)["score"] == 1.0
    # The default scorer: the answer inside a longer one scores len(answer) / len(given).
    given = f"{truth}0000"
    assert reasoning_gym_reward(f"<answer>{given}</answer>", truth, info)["score"] == len(truth) / len(given)
    assert reasoning_gym_answer("x <answer> 7 </answer>") == "7" and reasoning_gym_answer("7") is None
    with pytest.raises(ValueError, match="extra_info has no 'task' text: not a row of `rlkit prep-data reasoning-gym`"):
        reasoning_gym_reward("<answer>1</answer>", "1", {"index": 3})


def test_a_scorer_that_fails_costs_one_sample_and_is_reported() -> None:
    truth, good = extra("countdown")
    broken = {**good, "config": to_json({"max_numbers": 2, "seed": 1, "size": 1})}  # the task refuses this config
    with RewardScorer(RewardConfig(on_error="zero", num_workers=1, timeout_s=60)) as scorer:
        batch = scorer.score([f"<answer>{truth}</answer>"] * 2, ["reasoning_gym/countdown"] * 2, [truth] * 2,
                             [good, broken])
    assert batch.scores == [1.0, 0.0] and batch.metrics["reward/errors"] == 1.0
    (error,) = batch.errors
    assert error.startswith("reward failed on row 1 (data_source 'reasoning_gym/countdown', dataset index 0, "
                            "function rlkit.core.rewards.reasoning_gym.reasoning_gym_reward): AssertionError")


def test_the_named_flags_are_builder_options(tmp_path: Path) -> None:
    # --seed is -o seed=... for any builder that takes a seed; one that takes no size says which options it has.
    flag = cli("arithmetic", "--seed", "3", "-o", "n_train=2", "-o", "n_test=1", "--out", str(tmp_path / "flag"))
    option = cli("arithmetic", "-o", "seed=3", "-o", "n_train=2", "-o", "n_test=1", "--out", str(tmp_path / "o"))
    assert flag.exit_code == option.exit_code == 0, flag.output + option.output
    assert pq.read_table(tmp_path / "flag" / "train.parquet") == pq.read_table(tmp_path / "o" / "train.parquet")
    refused = cli("arithmetic", "--size", "3", "--out", str(tmp_path / "no"))
    assert refused.exit_code == 2 and "builder 'arithmetic' takes no option 'size'" in flat(refused.output)
