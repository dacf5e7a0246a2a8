"""Loading training parquet files: each bad input is one error naming the file, row and column."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlkit.core.data.builders import make_row, write_parquet
from rlkit.core.data.dataset import load_prompt_dataset
from rlkit.core.train.tiny import build_tokenizer
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
