"""The GSM8K-format arithmetic task (`rlkit prep-data arithmetic`) and the tokenizer/model built for it."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import invoke

from rlkit.cli.data_cmds import register
from rlkit.core.data.arithmetic import DATA_SOURCE, build_arithmetic, corpus, make_problem
from rlkit.core.rewards.registry import answer_fn_for, reward_fn_for

LINE = re.compile(r"(\d+)([-+*/])(\d+)=(?:<<\1\2\3=(\d+)>>)?(\d+)\.$")


def check_solution(question: str, solution: str) -> list[tuple[int, str, int, int]]:
    """Every calculation line of a worked solution: right, chained on the previous result, the operand
    taken from the question; returns them as (left, op, right, result)."""
    *lines, final = solution.split("\n")
    calcs = []
    for line in lines:
        match = LINE.search(line)
        assert match, line
        left, op, right, annotated, result = match.groups()
        left, right, result = int(left), int(right), int(result)
        assert annotated is None or int(annotated) == result
        assert result == {"+": left + right, "-": left - right, "*": left * right, "/": left // right}[op], line
        assert op != "/" or left % right == 0
        calcs.append((left, op, right, result))
    start = int(re.match(r"\w+ has (\d+) ", question).group(1))
    assert [c[0] for c in calcs] == [start] + [c[3] for c in calcs[:-1]]  # each step works on the last result
    assert all(f" {c[2]} " in f" {question} " for c in calcs)                # operands come from the question
    assert final == f"#### {calcs[-1][3]}"
    return calcs


def test_problems_are_right_chained_and_within_the_knobs() -> None:
    rng = random.Random(3)
    for _ in range(300):
        steps = rng.randint(1, 4)
        question, solution, answer = make_problem(rng, steps=steps, max_number=12, max_factor=4, max_value=90)
        calcs = check_solution(question, solution)
        assert len(calcs) == steps and answer == calcs[-1][3]
        assert all(0 <= c[3] <= 90 for c in calcs)
        assert all(c[2] <= 12 for c in calcs if c[1] in "+-") and all(2 <= c[2] <= 4 for c in calcs if c[1] in "*/")
        assert all(c[1] != "/" for c in calcs[:-1])  # sharing out only ends a problem ("how many does each get?")
        assert question.endswith("?")


def test_annotated_calculations_are_gsm8k_style() -> None:
    question, solution, _ = make_problem(random.Random(0), steps=2, max_number=9, max_factor=3, max_value=50,
                                         calc="annotated")
    check_solution(question, solution)
    left, op, right, result = check_solution(question, solution)[0]
    assert f"{left}{op}{right}=<<{left}{op}{right}={result}>>{result}." in solution


def test_builder_is_seeded_held_out_and_scored_by_the_gsm8k_reward() -> None:
    splits = build_arithmetic(n_train=400, n_test=100, seed=7, format="sft")
    assert splits == build_arithmetic(n_train=400, n_test=100, seed=7, format="sft")
    assert splits["train"] != build_arithmetic(n_train=400, n_test=100, seed=8, format="sft")["train"]
    train, test = splits["train"], splits["test"]
    assert (len(train), len(test)) == (400, 100)
    questions = [row["extra_info"]["question"] for row in train + test]
    assert len(set(questions)) == 500  # no repeats, and no test question is a train question
    steps = {row["response"].count("\n") for row in train}
    assert steps == {2, 3, 4}  # the default 2-4 calculations (lines before '#### N')
    reward, answer = reward_fn_for(DATA_SOURCE), answer_fn_for(DATA_SOURCE)
    for row in train[:50]:
        check_solution(row["extra_info"]["question"], row["response"])
        truth = row["reward_model"]["ground_truth"]
        assert row["prompt"][0]["content"].startswith(row["extra_info"]["question"] + " Let's think step by step")
        assert reward(row["response"], truth, {})["score"] == 1.0
        assert answer(row["response"]) == truth
        wrong = row["response"].rsplit("#### ", 1)[0] + f"#### {int(truth) + 1}"
        assert reward(wrong, truth, {})["score"] == 0.0
    rl = build_arithmetic(n_train=400, n_test=100, seed=7)
    assert [{k: v for k, v in row.items() if k != "response"} for row in train] == rl["train"]
    assert "response" not in rl["train"][0]
    assert len(corpus(splits)) == 800 and corpus(splits)[1] == train[0]["response"]


def test_prep_data_writes_sft_rows_and_names_a_bad_option(tmp_path: Path) -> None:
    result = invoke(register, "prep-data", "arithmetic", "--out", str(tmp_path), "-o", "n_train=64",
                    "-o", "n_test=16", "--format", "sft", "-o", "max_steps=2", "--instruction", "")
    assert result.exit_code == 0, result.output
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert len(rows) == 64 and len(pq.read_table(tmp_path / "test.parquet").to_pylist()) == 16
    assert rows[0]["prompt"] == [{"role": "user", "content": rows[0]["extra_info"]["question"]}]
    assert rows[0]["response"].endswith(f"#### {rows[0]['reward_model']['ground_truth']}")
    assert {row["response"].count("\n") for row in rows} == {2}
    bad = invoke(register, "prep-data", "arithmetic", "--out", str(tmp_path), "-o", "format=dpo")
    assert bad.exit_code == 2 and "format='dpo'; choose one of rl, sft" in bad.output and "Traceback" not in bad.output
    # 3120 different one-step problems exist at these settings (names x items x numbers): 4000 are too many
    # (the default 20000 would try 50 x 20000 draws before saying so: 30 s).
    few = invoke(register, "prep-data", "arithmetic", "--out", str(tmp_path), "-o", "max_number=2", "-o", "n_train=4000",
                 "-o", "max_value=3", "-o", "max_factor=1", "-o", "max_steps=1", "-o", "min_steps=1")
    assert few.exit_code == 2 and "only 3120 different train problems" in few.output


def test_task_tokenizer_and_model_load_as_a_hub_model_would(tmp_path: Path) -> None:
    """A trained BPE (digits one token each) with a Qwen2 chat template, and a Qwen2 model beside it:
    AutoTokenizer gives the trained tokenizer's ids, the template frames a chat, the model runs."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.core.train.scratch import build_task_model

    splits = build_arithmetic(n_train=300, n_test=20, format="sft")
    folder = build_task_model(corpus(splits), tmp_path / "model", size="tiny", vocab_size=400)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    trained = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for row in splits["test"]:
        for text in (row["prompt"][0]["content"], row["response"]):
            assert tokenizer(text)["input_ids"] == trained.encode(text).ids
            assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("has 176 apples")["input_ids"])
    assert pieces[pieces.index("1"):pieces.index("1") + 3] == ["1", "7", "6"]  # digit by digit
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert "user" in tokenizer.convert_ids_to_tokens(tokenizer(chat)["input_ids"])  # a merged role name
    model = AutoModelForCausalLM.from_pretrained(folder)
    config = model.config
    assert (config.model_type, config.head_dim, config.hidden_size, config.num_hidden_layers) == ("qwen2", 64, 128, 2)
    assert config.vocab_size % 64 == 0 and config.vocab_size >= len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    logits = model(torch.tensor([tokenizer(chat)["input_ids"]])).logits
    assert logits.shape[-1] == config.vocab_size and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        from rlkit.core.train.scratch import build_model
        build_model(tmp_path / "x", tokenizer, size="huge")
