"""`rlkit prep-data`: GSM8K from the real files, math, synthetic, user builders, and its errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import GSM8K, invoke, require_gsm8k

from rlkit.cli.data_cmds import register
from rlkit.core.data.gsm8k import INSTRUCTION


def cli(*args: str):
    return invoke(register, "prep-data", *args)


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def read(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_gsm8k_from_the_real_files(tmp_path: Path) -> None:
    require_gsm8k()
    result = cli("gsm8k", "--source", str(GSM8K), "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "7473" in result.output and "1319" in result.output
    for split in ("train", "test"):
        source = [json.loads(line) for line in (GSM8K / f"{split}.jsonl").read_text().splitlines()]
        rows = read(tmp_path / f"{split}.parquet")
        assert len(rows) == len(source)
        for index, (row, record) in enumerate(zip(rows, source, strict=True)):
            assert row["reward_model"] == {"style": "rule",
                                           "ground_truth": record["answer"].split("####")[1].strip().replace(",", "")}
            assert row["prompt"] == [{"role": "user", "content": f"{record['question']} {INSTRUCTION}"}]
            assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
            assert row["extra_info"] == {"split": split, "index": index, "question": record["question"],
                                         "answer": record["answer"]}


def test_instruction_and_dropped_rows_are_reported(tmp_path: Path) -> None:
    records = [{"question": "1+1?", "answer": "2\n#### 2"}, {"question": "no answer", "answer": "2"},
               {"question": "", "answer": "#### 2"}, {"question": "words", "answer": "#### two"}]
    write_jsonl(tmp_path / "src" / "train.jsonl", records)
    write_jsonl(tmp_path / "src" / "test.jsonl", records[:1])
    result = cli("gsm8k", "--source", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--instruction", "")
    assert result.exit_code == 0, result.output
    assert [r["prompt"][0]["content"] for r in read(tmp_path / "out" / "train.parquet")] == ["1+1?"]
    summary = flat(result.output)
    for reason in ("1 no '####' in 'answer'", "1 no 'question' text", "1 the text after '####' is not a number"):
        assert reason in summary
    result = cli("gsm8k", "--source", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--instruction", "Go.")
    assert read(tmp_path / "out" / "test.parquet")[0]["prompt"][0]["content"] == "1+1? Go."


def test_math_from_hub_style_parquet_shards(tmp_path: Path) -> None:
    records = [{"problem": "Half of 1?", "solution": r"It is $\boxed{\frac{1}{2}}$.", "level": "Level 1",
                "type": "Algebra"},
               {"problem": "No box", "solution": "It is 3.", "level": "Level 2", "type": "Algebra"}]
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(records), tmp_path / f"{split}-00000-of-00001.parquet")
    result = cli("math", "--source", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    (row,) = read(tmp_path / "out" / "train.parquet")
    assert row["reward_model"]["ground_truth"] == r"\frac{1}{2}"
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert row["prompt"][0]["content"].endswith(r"within \boxed{}.")
    assert row["extra_info"]["level"] == "Level 1" and row["extra_info"]["type"] == "Algebra"
    assert "1 no \\boxed{} answer in 'solution'" in flat(result.output)


def test_synthetic_with_options_and_the_list(tmp_path: Path) -> None:
    result = cli("synthetic", "-o", "task=add", "-o", "n_train=16", "-o", "n_test=4", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    rows = read(tmp_path / "train.parquet")
    assert len(rows) == 16 and rows[0]["data_source"] == "synthetic/add"
    listing = flat(cli("--list").output)
    assert all(name in listing for name in ("gsm8k", "math", "synthetic", "n_train=1024", "--builder"))


USER_BUILDER = '''
from rlkit.core.data.builders import Dropped, make_row

def build(source, *, count=3):
    rows = [make_row("my/task", f"q{i}", 7, split="train", index=i) for i in range(count)]
    rows += [Dropped("too easy"), {"data_source": "my/task", "prompt": [], "reward_model": {"ground_truth": "1"}}]
    return {"train": rows}

def broken(source):
    raise RuntimeError("bad data")
'''


def test_a_user_builder(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(USER_BUILDER)
    result = cli("--builder", f"{tmp_path}/mine.py:build", "-o", "count=2", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    rows = read(tmp_path / "out" / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "7"]  # stored as strings
    assert "1 too easy; 1 empty 'prompt'" in flat(result.output)
    result = cli("--builder", f"{tmp_path}/mine.py:broken", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "builder " in result.output and "RuntimeError: bad data" in flat(result.output)


@pytest.mark.parametrize("args, message", [
    (["gsm9k"], "unknown dataset builder 'gsm9k' (known: arithmetic, gsm8k, gsm8k-pairs, humaneval, math, reasoning-gym, synthetic, tool-arithmetic, verifiers); did you mean 'gsm8k'?"),
    ([], "name one builder: NAME"),
    (["synthetic", "-o", "tsk=add"], "builder 'synthetic' takes no option 'tsk'"),
    (["synthetic", "--instruction", "Go."], "takes no option 'instruction'"),
    (["gsm8k", "--source", "/no/such/dir"], "--source /no/such/dir: not a directory"),
])
def test_user_errors_exit_2_with_one_message(args: list[str], message: str) -> None:
    result = cli(*args)
    assert result.exit_code == 2 and message in flat(result.output), result.output


def test_a_source_without_a_split_lists_what_it_found(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"question": "q", "answer": "#### 1"}])
    result = cli("gsm8k", "--source", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "no test.jsonl or test.parquet in it (found: ['train.jsonl'])" in flat(result.output)


def test_the_hub_path_explains_how_to_get_datasets_or_use_source(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if `datasets` were not installed
    result = cli("gsm8k", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "needs the `datasets` package" in flat(result.output) and "--source DIR" in flat(result.output)
