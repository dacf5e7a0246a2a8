"""Loading training parquet files: each bad input is one error naming the file, row and column."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlkit.core.data.builders import make_row, write_parquet
from rlkit.core.data.dataset import load_prompt_dataset, tokenize_rows
from rlkit.core.tiny import build_tokenizer
from rlkit.errors import UserError


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def rows(*contents: str) -> list[dict]:
    return [make_row("synthetic/echo", c, "1", split="train", index=i) for i, c in enumerate(contents)]


def load(tokenizer, path: Path, **kwargs):
    return load_prompt_dataset([str(path)], tokenizer, **{"max_prompt_length": 32, **kwargs})


def test_a_good_file_loads(tokenizer, tmp_path: Path) -> None:
    loaded = load(tokenizer, write_parquet(rows("echo 1", "echo 2"), tmp_path / "train.parquet"))
    assert [r.ground_truth for r in loaded] == ["1", "1"] and loaded[1].extra_info["index"] == 1


def test_missing_file(tokenizer, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"data file .*nope.parquet does not exist .*prep-data"):
        load(tokenizer, tmp_path / "nope.parquet")


def test_not_parquet(tokenizer, tmp_path: Path) -> None:
    (tmp_path / "train.parquet").write_text('{"prompt": "hi"}\n')
    with pytest.raises(UserError, match=r"train.parquet is not a readable parquet file"):
        load(tokenizer, tmp_path / "train.parquet")


def test_missing_columns_are_named(tokenizer, tmp_path: Path) -> None:
    broken = [{k: v for k, v in row.items() if k != "reward_model"} for row in rows("echo 1")]
    with pytest.raises(UserError, match=r"train.parquet lacks column\(s\) \['reward_model'\]"):
        load(tokenizer, write_parquet(broken, tmp_path / "train.parquet"))


def test_an_empty_prompt_names_file_row_and_column(tokenizer, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train.parquet, row 1: column 'prompt' is empty"):
        load(tokenizer, write_parquet(rows("echo 1", ""), tmp_path / "train.parquet"))


def test_an_overlong_prompt_is_an_error_naming_the_row_and_the_fix(tokenizer, tmp_path: Path) -> None:
    path = write_parquet(rows("echo 1", "a" * 40), tmp_path / "train.parquet")
    with pytest.raises(UserError, match=r"train.parquet, row 1: prompt has \d+ tokens > data.max_prompt_length=32; "
                                        r"raise it or set data.overlong_prompts=filter"):
        load(tokenizer, path)


def test_overlong_prompts_are_filtered_with_a_logged_count(tokenizer, tmp_path: Path, caplog) -> None:
    path = write_parquet(rows("echo 1", "a" * 40, "b" * 40), tmp_path / "train.parquet")
    with caplog.at_level(logging.WARNING):
        loaded = load(tokenizer, path, overlong="filter")
    assert len(loaded) == 1
    assert "dropped 2 of 3 prompts longer than data.max_prompt_length=32" in caplog.text
    with pytest.raises(UserError, match=r"no usable rows .* \(1 dropped as too long\)"):
        load(tokenizer, write_parquet(rows("c" * 40), tmp_path / "long.parquet"), overlong="filter")


# -- a column of the wrong type: one line naming file, row, column, what was found and what is expected ---
def good_row(**changes) -> dict:
    return {**make_row("synthetic/echo", "echo 1", "1", split="train", index=0), **changes}


@pytest.mark.parametrize("changes, message", [
    ({"prompt": 7}, "column 'prompt' holds int 7; expected a string or a list of {\"role\", \"content\"} messages"),
    ({"prompt": ["echo 1"]}, "column 'prompt', message 0 is str 'echo 1'; expected a {'role', 'content'} dict"),
    ({"prompt": [{"role": "user", "content": 3}]},
     "column 'prompt', message 0 has content int 3; expected a string"),
    ({"prompt": [{"content": "echo 1"}]}, "column 'prompt', message 0 has role NoneType None; expected a string"),
    ({"prompt": [{"role": "user", "content": ""}]}, "column 'prompt' is empty"),
    ({"data_source": 5}, "column 'data_source' holds int 5; expected a string"),
    ({"reward_model": "1"}, "column 'reward_model' holds str '1'; expected a struct with a 'ground_truth' string"),
    ({"reward_model": {"ground_truth": ["1", "2"]}},
     "column 'reward_model.ground_truth' holds list ['1', '2']; expected a string"),
    # a long value is cut: its repr's first 37 characters (the quote and 36 x), then "..."
    ({"extra_info": "x" * 60}, "column 'extra_info' holds str '" + "x" * 36 + "...; expected a struct (a dict)"),
])
def test_a_column_of_the_wrong_type_names_the_row_what_it_holds_and_what_is_expected(tokenizer, changes,
                                                                                     message) -> None:
    with pytest.raises(UserError) as caught:
        tokenize_rows([("train.parquet", [good_row(), good_row(**changes)])], tokenizer, max_prompt_length=32)
    assert str(caught.value).startswith(f"train.parquet, row 1: {message}")


def test_a_number_as_ground_truth_is_its_text(tokenizer) -> None:
    (row,) = tokenize_rows([("t", [good_row(reward_model={"ground_truth": 42})])], tokenizer, max_prompt_length=32)
    assert row.ground_truth == "42"


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.rstrip().endswith(errors[0]), result.output  # the last line
    return errors[0]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_rlkit_train_names_a_prompt_column_of_integers_in_one_line(tmp_path: Path, dry_run) -> None:
    from typer.testing import CliRunner

    from rlkit.cli.main import app

    integers = write_parquet([good_row(prompt=i) for i in (11, 12)], tmp_path / "ints.parquet")
    no_content = write_parquet([good_row(), good_row(prompt=[{"role": "user", "content": None}])],
                               tmp_path / "null.parquet")
    for data, message in [(integers, "row 0: column 'prompt' holds int 11; expected a string or a list of "
                                     "{\"role\", \"content\"} messages"),
                          (no_content, "row 1: column 'prompt', message 0 has content NoneType None; expected a "
                                       "string")]:
        result = CliRunner().invoke(app, ["train", "grpo-demo", f"trainer.runs_dir={tmp_path / 'runs'}",
                                          f"data.train_files=[{data}]", *dry_run])
        assert f"{data}, {message}" in " ".join(_one_line_error(result).split())
