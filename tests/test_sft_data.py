"""SFT rows -> token ids and loss masks (by hand, on the tiny model's one-token-a-character
tokenizer), bad rows named with their file and row at preflight (exit 2, no run directory), and
`rlkit prep-data gsm8k --format sft` on the real GSM8K files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import GSM8K, invoke, require_gsm8k
from typer.testing import CliRunner

from rlkit.cli.data_cmds import register
from rlkit.cli.main import app
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.sft import sft_batch, tokenize_sft_row, tokenize_sft_rows
from rlkit.errors import UserError

# The tiny tokenizer: <pad> 0, <|im_start|> 1, <|im_end|> 2 (its EOS), then one id per character.
START, END = 1, 2


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("rlkit:tiny-qwen2"))


def chars(tokenizer, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token a character
    return ids


def test_prompt_and_response_are_tokenized_apart_and_the_response_ends_in_eos(tokenizer) -> None:
    prompt, response, mask = tokenize_sft_row({"prompt": [{"role": "user", "content": "3+4="}], "response": "7"},
                                              tokenizer)
    # The template: <|im_start|>content<|im_end|>, then the generation prompt <|im_start|>.
    assert prompt == [START, *chars(tokenizer, "3+4="), END, START]
    assert response == [*chars(tokenizer, "7"), END] and mask == [1, 1]
    plain = tokenize_sft_row({"prompt": "echo 5", "response": "5"}, tokenizer)  # a plain-text prompt: no template
    assert plain == (chars(tokenizer, "echo 5"), [*chars(tokenizer, "5"), END], [1, 1])


def test_messages_train_every_assistant_turn_up_to_its_end_token(tokenizer) -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "1"},
                {"role": "assistant", "content": "22"}, {"role": "user", "content": "3"},
                {"role": "assistant", "content": "4"}]
    prompt, response, mask = tokenize_sft_row({"messages": messages}, tokenizer)
    ids = {c: chars(tokenizer, c)[0] for c in "s1234"}
    assert prompt == [START, ids["s"], END, START, ids["1"], END, START]
    assert response == [ids["2"], ids["2"], END, START, ids["3"], END, START, ids["4"], END]
    assert mask == [1, 1, 1, 0, 0, 0, 0, 1, 1]
    # Cut at turn boundaries, the pieces are exactly the template's rendering of the whole chat.
    assert prompt + response == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)


def test_completion_only_loss_false_trains_every_token_but_the_first(tokenizer) -> None:
    row = {"prompt": [{"role": "user", "content": "1"}], "response": "2"}
    full, = tokenize_sft_rows([("f", [row])], tokenizer, max_length=16, completion_only=False)
    assert full.prompt_ids == [START]
    assert full.response_ids == [chars(tokenizer, "1")[0], END, START, chars(tokenizer, "2")[0], END]
    assert full.loss_mask == [1] * 5


def test_batch_layout_left_pads_prompts_and_masks_padding(tokenizer) -> None:
    rows = [{"prompt": "12", "response": "3"}, {"prompt": "4", "response": "56"}]
    batch = sft_batch(tokenize_sft_rows([("f", rows)], tokenizer, max_length=8), pad_id=0)
    one, two, three, four, five, six = (chars(tokenizer, d)[0] for d in "123456")
    assert batch["input_ids"].tolist() == [[one, two, three, END, 0], [0, four, five, six, END]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.meta["row_index"] == [0, 1]


def test_bad_rows_are_all_named_with_file_and_row(tokenizer) -> None:
    rows = [{"prompt": "1", "response": "2"}, {"prompt": "1", "response": ""}, {"prompt": "1", "response": None},
            {"prompt": "1", "response": "123456"}, {"messages": [{"role": "user", "content": "1"}]},
            {"prompt": "", "response": "2"}, {"messages": [{"role": "assistant", "content": "1"}]}]
    with pytest.raises(UserError) as caught:
        tokenize_sft_rows([("train.parquet", rows)], tokenizer, max_length=6)
    message = str(caught.value)
    assert message.startswith("6 bad SFT row(s) (the first 5 shown): ")
    assert "train.parquet, row 1: column 'response' is missing or empty" in message
    assert "train.parquet, row 2: column 'response' is missing or empty" in message
    # "1" + "123456" + EOS = 1 + 7 tokens.
    assert "train.parquet, row 3: 1 prompt + 7 response tokens > data.max_prompt_length + " \
           "data.max_response_length = 6" in message
    assert "train.parquet, row 4: 'messages' has no assistant message to train on" in message
    assert "train.parquet, row 5: column 'prompt' is empty" in message
    assert "row 6" not in message  # five are named, the rest counted
    with pytest.raises(ValueError, match="'messages' starts with an assistant message"):
        tokenize_sft_row(rows[6], tokenizer)  # nothing before it: no prompt to predict its first token from
    assert "row 0" not in message


SMALL = ["data.max_prompt_length=16", "data.max_response_length=16"]  # the tiny model's context is 256


def test_overlong_rows_can_be_filtered_instead(tokenizer, caplog) -> None:
    rows = [{"prompt": "1", "response": "2"}, {"prompt": "1", "response": "123456"}]
    with caplog.at_level("WARNING"):
        kept = tokenize_sft_rows([("f", rows)], tokenizer, max_length=6, overlong="filter")
    assert [e.response_ids for e in kept] == [[*chars(tokenizer, "2"), END]]
    assert "dropped 1 of 2 SFT rows longer than data.max_prompt_length + data.max_response_length = 6" in caplog.text
    with pytest.raises(UserError, match="no usable rows"):
        tokenize_sft_rows([("f", rows[1:])], tokenizer, max_length=6, overlong="filter")


def test_preflight_reports_a_bad_row_with_exit_2_before_the_run_dir_exists(tmp_path: Path) -> None:
    import ray

    good = {"prompt": [{"role": "user", "content": "1+1="}], "response": "2"}
    data = write_parquet([good, good, {**good, "response": "   "}, good], tmp_path / "train.parquet")
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", "sft", "--model", "rlkit:tiny-qwen2", f"data.train_files=[{data}]",
                                      "data.train_batch_size=2", "actor.mini_batch_size=2", *SMALL,
                                      f"trainer.runs_dir={runs}"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"1 bad SFT row(s): {data}, row 2: column 'response' is missing or empty" in " ".join(result.output.split())
    assert not runs.exists() and not ray.is_initialized()


@pytest.mark.parametrize("key", ["rollout.n=4", "actor.use_kl_loss=true", "trainer.val_n=4"])
def test_rl_only_keys_on_an_sft_command_line_are_refused(tmp_path: Path, key: str) -> None:
    result = CliRunner().invoke(app, ["train", "sft", "--model", "rlkit:tiny-qwen2", key,
                                      f"data.train_files=[{tmp_path / 'x.parquet'}]"])
    assert result.exit_code == 2
    assert f"{key.split('=')[0]} (command line): has no effect: objective sft generates nothing" in \
        " ".join(result.output.split())


def test_rows_without_prompt_response_or_messages_columns(tmp_path: Path) -> None:
    data = write_parquet([{"prompt": "1", "completion": "2"}], tmp_path / "train.parquet")
    result = CliRunner().invoke(app, ["train", "sft", "--model", "rlkit:tiny-qwen2", f"data.train_files=[{data}]",
                                      "data.train_batch_size=1", "actor.mini_batch_size=1", *SMALL,
                                      f"trainer.runs_dir={tmp_path / 'runs'}"])
    assert result.exit_code == 2
    assert "SFT rows need 'prompt' + 'response' or 'messages'" in " ".join(result.output.split())


def test_prep_data_gsm8k_format_sft_from_the_real_files(tmp_path: Path) -> None:
    require_gsm8k()
    result = invoke(register, "prep-data", "gsm8k", "--format", "sft", "--source", str(GSM8K), "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    source = [json.loads(line) for line in (GSM8K / "train.jsonl").read_text().splitlines()]
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert len(rows) == len(source) == 7473
    first = rows[0]  # "Natalia sold 48/2 = <<48/2=24>>24 clips in May. ... #### 72"
    assert first["response"] == ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether "
                                 "in April and May.\n#### 72")
    rl_rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert all(r["response"].endswith(f"#### {source_answer(r)}") for r in rl_rows)
    assert all("<<" not in r["response"] for r in rows)
    # The prompt is the RL row's, so an SFT run and a later GRPO run see the same prompts.
    rl = invoke(register, "prep-data", "gsm8k", "--source", str(GSM8K), "--out", str(tmp_path / "rl"))
    assert rl.exit_code == 0
    assert [r["prompt"] for r in pq.read_table(tmp_path / "rl" / "train.parquet").to_pylist()] == \
           [r["prompt"] for r in rows]


def source_answer(row: dict) -> str:
    return row["extra_info"]["answer"].rsplit("####", 1)[1].strip()


def test_format_is_refused_by_builders_without_it(tmp_path: Path) -> None:
    result = invoke(register, "prep-data", "humaneval", "--format", "sft", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "takes no option 'format'" in result.output


def test_dry_run_counts_rows_and_names_no_engine(tmp_path: Path) -> None:
    data = write_parquet([{"prompt": "1+1=", "response": "2"}] * 8, tmp_path / "train.parquet")
    result = CliRunner().invoke(app, ["train", "sft", "--dry-run", "--model", "rlkit:tiny-qwen2",
                                      f"data.train_files=[{data}]", "data.train_batch_size=8",
                                      "actor.mini_batch_size=4", *SMALL])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "each step takes 8 rows of data.train_files (sft: no generation)" in text
    assert "2 optimizer step(s) per step: 2 mini-batch(es) of 4 rows (4 sequences) x 1 epoch(s)" in text
    assert "data: 8 training and 0 validation prompt + response / messages rows" in text
    assert "rollout engine" not in text


def test_an_sft_run_needs_data_files() -> None:
    result = CliRunner().invoke(app, ["train", "sft", "--model", "rlkit:tiny-qwen2"])
    assert result.exit_code == 2
    assert "objective sft trains on rows of data files" in " ".join(result.output.split())


@pytest.mark.parametrize("row, message", [
    ({"prompt": 5, "response": "2"}, "column 'prompt' holds int 5; expected a string or a list of"),
    ({"messages": ["hi", "there"]}, "column 'messages', message 0 is str 'hi'; expected a {'role', 'content'} dict"),
    ({"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": 2}]},
     "column 'messages', message 1 has content int 2; expected a string"),
])
def test_a_column_of_the_wrong_type_is_named_not_a_crash(tokenizer, row, message) -> None:
    with pytest.raises(UserError) as caught:
        tokenize_sft_rows([("train.parquet", [row])], tokenizer, max_length=64)
    assert f"train.parquet, row 0: {message}" in str(caught.value)
