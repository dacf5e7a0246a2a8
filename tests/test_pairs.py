"""Preference pairs: the GSM8K pair builder, prep-data on pair rows, and the row checks of tokenize_pairs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import GSM8K, invoke

from rlkit.cli.data_cmds import register
from rlkit.core.data.gsm8k_pairs import build_gsm8k_pairs, corrupt_solution, wrong_answer
from rlkit.core.data.pairs import read_pair_rows, tokenize_pairs
from rlkit.errors import UserError


def test_corrupt_solution_changes_the_last_calculation_and_the_answer() -> None:
    solution = "She sold 48/2 = 24 in May.\nShe sold 48+24 = 72 in all, 72 clips.\n#### 72"
    assert corrupt_solution(solution, 72, 75) == "She sold 48/2 = 24 in May.\nShe sold 48+24 = 75 in all, 75 clips.\n#### 75"
    # The answer last stated on an earlier line: that line changes, later lines do not.
    solution = "Total 1,000 dollars.\nShe keeps it.\n#### 1000"
    assert corrupt_solution(solution, 1000, 997) == "Total 997 dollars.\nShe keeps it.\n#### 997"
    # 72 inside 172 or 7.2 is another number, left alone; no line states 72: only the final line changes.
    solution = "It is 172 or 7.2.\n#### 72"
    assert corrupt_solution(solution, 72, 70) == "It is 172 or 7.2.\n#### 70"


def test_wrong_answer_is_seeded_and_never_negative() -> None:
    draws = [wrong_answer(3, random.Random(f"0:train:{i}")) for i in range(200)]
    assert draws == [wrong_answer(3, random.Random(f"0:train:{i}")) for i in range(200)]
    assert all(d != 3 and 0 <= d <= 12 for d in draws)  # 3 - 3 = 0 is the lowest, 3 + 9 = 12 the highest
    assert {d for d in draws if d < 3} and {d for d in draws if d > 3}  # both directions happen


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_prep_data_writes_pairs(tmp_path: Path) -> None:
    records = [{"question": "48 and half of it?", "answer": "48/2 = <<48/2=24>>24\n48+24 = <<48+24=72>>72\n#### 72"},
               {"question": "Half?", "answer": "#### 0.5"}]
    write_jsonl(tmp_path / "src" / "train.jsonl", records)
    write_jsonl(tmp_path / "src" / "test.jsonl", records[:1])
    result = invoke(register, "prep-data", "gsm8k-pairs", "--source", str(tmp_path / "src"), "--out",
                    str(tmp_path / "out"), "--instruction", "", "-o", "seed=3")
    assert result.exit_code == 0, result.output
    assert "not a whole number" in " ".join(result.output.split())
    (row,) = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    wrong = wrong_answer(72, random.Random("3:train:0"))
    assert row["prompt"] == [{"role": "user", "content": "48 and half of it?"}]
    assert row["chosen"] == "48/2 = 24\n48+24 = 72\n#### 72"  # calculator annotations dropped
    assert row["rejected"] == f"48/2 = 24\n48+24 = {wrong}\n#### {wrong}"
    assert row["extra_info"]["wrong_answer"] == str(wrong)
    # The RL columns stay, so `rlkit eval` can score generations on the pairs' prompts.
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"] == {"style": "rule", "ground_truth": "72"}
    assert read_pair_rows(tmp_path / "out" / "test.parquet", "data.val_files")[0]["chosen"] == row["chosen"]


@pytest.mark.skipif(not GSM8K.is_dir(), reason="the real GSM8K files are not here")
def test_gsm8k_pairs_from_the_real_files() -> None:
    splits = build_gsm8k_pairs(str(GSM8K))
    assert [len(splits["train"]), len(splits["test"])] == [7473, 1319]
    for row in splits["test"]:
        answer, wrong = row["reward_model"]["ground_truth"], row["extra_info"]["wrong_answer"]
        assert answer != wrong
        assert row["chosen"].rpartition("####")[2].strip().replace(",", "") == answer  # the reference's own spelling
        assert row["rejected"].endswith(f"#### {wrong}")
        assert "<<" not in row["chosen"]
    # Deterministic per seed; another seed gives other wrong answers.
    assert build_gsm8k_pairs(str(GSM8K))["test"] == splits["test"]
    other = build_gsm8k_pairs(str(GSM8K), seed=1)["test"]
    assert sum(a["rejected"] != b["rejected"] for a, b in zip(other, splits["test"])) > 1000


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from rlkit.core.tiny import build_tiny_qwen2

    return AutoTokenizer.from_pretrained(build_tiny_qwen2(tmp_path_factory.mktemp("tiny")))


PROMPT = [{"role": "user", "content": "1+1?"}]  # <|im_start|> 1 + 1 ? <|im_end|> <|im_start|> = 7 tokens


def test_pairs_tokenize_prompt_and_responses_apart(tokenizer) -> None:
    (pair,) = tokenize_pairs([("p.parquet", [{"prompt": PROMPT, "chosen": "2", "rejected": "3 3"}])], tokenizer,
                             max_prompt_length=7, max_response_length=4)
    assert pair.prompt_token_ids == tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True,
                                                                  tokenize=True, return_dict=False)
    assert len(pair.prompt_token_ids) == 7
    eos = tokenizer.eos_token_id
    assert pair.chosen_token_ids == [tokenizer.convert_tokens_to_ids("2"), eos]
    assert pair.rejected_token_ids[-1] == eos and len(pair.rejected_token_ids) == 4  # '3', ' ', '3', EOS


@pytest.mark.parametrize("bad, message", [
    ({"chosen": "", "rejected": "3"}, "row 1: 'chosen' is empty"),
    ({"chosen": "2", "rejected": "  "}, "row 1: 'rejected' is empty"),
    ({"chosen": "2", "rejected": None}, "row 1: 'rejected' is NoneType, not text"),
    ({"chosen": "2", "rejected": "2"}, "row 1: 'chosen' and 'rejected' are the same text"),
    ({"prompt": 4, "chosen": "2", "rejected": "3"},
     "row 1: column 'prompt' holds int 4; expected a string or a list of"),
    ({"prompt": [{"role": "user"}], "chosen": "2", "rejected": "3"},
     "row 1: column 'prompt', message 0 has content NoneType None; expected a string"),
    ({"chosen": "2", "rejected": "3 3 3"}, "row 1: prompt (7 tokens) + the longer response (6 tokens with EOS) "
                                             "is 13 tokens > data.max_prompt_length + data.max_response_length = 11"),
])
def test_bad_pairs_name_file_and_row(tokenizer, bad, message) -> None:
    rows = [{"prompt": PROMPT, "chosen": "2", "rejected": "3"}, {"prompt": PROMPT, **bad}]
    with pytest.raises(UserError) as caught:
        tokenize_pairs([("pairs.parquet", rows)], tokenizer, max_prompt_length=7, max_response_length=4)
    assert str(caught.value).startswith(f"1 bad pair(s): pairs.parquet, {message}")


def test_every_bad_pair_is_counted_and_the_first_five_named(tokenizer) -> None:
    good, same = {"prompt": PROMPT, "chosen": "2", "rejected": "3"}, {"prompt": PROMPT, "chosen": "2", "rejected": "2"}
    rows = [good, same, good, *[same] * 6]  # bad: rows 1 and 3-8
    with pytest.raises(UserError) as caught:
        tokenize_pairs([("a.parquet", rows[:5]), ("b.parquet", rows[5:])], tokenizer, max_prompt_length=7,
                       max_response_length=4)
    text = str(caught.value)
    assert text.startswith("7 bad pair(s) (the first 5 shown): a.parquet, row 1: 'chosen' and 'rejected' are the same text")
    assert [f"{f}.parquet, row {i}:" in text for f, i in [("a", 3), ("a", 4), ("b", 0), ("b", 1), ("b", 2), ("b", 3)]] == \
        [True, True, True, True, False, False]


def test_overlong_pairs_can_be_filtered(tokenizer) -> None:
    rows = [{"prompt": PROMPT, "chosen": "2", "rejected": "3 3 3"}, {"prompt": PROMPT, "chosen": "2", "rejected": "3"}]
    pairs = tokenize_pairs([("pairs.parquet", rows)], tokenizer, max_prompt_length=7, max_response_length=4,
                           overlong="filter")
    assert [p.index for p in pairs] == [0] and len(pairs[0].rejected_token_ids) == 2
    with pytest.raises(UserError, match=r"no usable pairs in \['pairs.parquet'\] \(1 dropped as too long\)"):
        tokenize_pairs([("pairs.parquet", rows[:1])], tokenizer, max_prompt_length=7, max_response_length=4,
                       overlong="filter")


def test_pair_file_without_its_columns(tmp_path: Path) -> None:
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([{"prompt": "x", "chosen": "a"}]), tmp_path / "p.parquet")
    with pytest.raises(UserError, match=r"p.parquet lacks column\(s\) \['rejected'\]"):
        read_pair_rows(tmp_path / "p.parquet", "data.train_files")
    pq.write_table(pa.Table.from_pylist([{"prompt": "x", "chosen": "a", "rejected": "b"}]).slice(0, 0),
                   tmp_path / "empty.parquet")
    with pytest.raises(UserError, match=r"empty.parquet \(data.val_files\) has no rows"):
        read_pair_rows(tmp_path / "empty.parquet", "data.val_files")
