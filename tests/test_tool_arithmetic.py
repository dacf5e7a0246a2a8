"""`rlkit prep-data tool-arithmetic`: problems whose answer needs the calculator, as SFT chats that call it (in the
chat template's tool format) or answer without it, and RL rows; the scratch tokenizer's template with tools; SFT
rows with a `tools` column trained on the assistant's turns only."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import invoke

from rlkit.cli.data_cmds import register
from rlkit.core.agents.builtin_tools import calculator
from rlkit.core.agents.tool_arithmetic import build_tool_arithmetic
from rlkit.core.agents.tools import function_schema, parse_tool_calls
from rlkit.core.data.sft import tokenize_sft_row
from rlkit.core.rewards.scoring import rule_for
from rlkit.errors import UserError

SCHEMA = [function_schema(calculator)]


@pytest.fixture(scope="module")
def scratch_tokenizer(tmp_path_factory):
    """The scratch BPE (rlkit.core.train.scratch), trained on a few tool-arithmetic chats."""
    from transformers import AutoTokenizer

    from rlkit.core.train.scratch import build_tokenizer

    rows = build_tool_arithmetic(n_train=50, n_test=5, format="sft")["train"]
    texts = [m["content"] for row in rows for m in row["messages"]] + [row["tools"] for row in rows]
    folder = tmp_path_factory.mktemp("scratch")
    build_tokenizer(texts, folder, vocab_size=400)
    return AutoTokenizer.from_pretrained(folder)


def test_rows_call_the_calculator_or_answer_and_rl_rows_are_scored_by_gsm8k() -> None:
    splits = build_tool_arithmetic(n_train=30, n_test=10, min_digits=3, max_digits=3, format="sft", seed=1)
    row = splits["train"][0]
    expression = row["extra_info"]["expression"]
    a, b = expression.split("*")
    assert len(a) == len(b) == 3 and row["reward_model"]["ground_truth"] == str(int(a) * int(b))
    assert row["data_source"] == "gsm8k/tool_arithmetic"
    user, call, result, answer = row["messages"]
    assert user == row["prompt"][0] and user["content"] == f"What is {expression}? Give the answer after '####'."
    # The call is what the policy writes in the tool loop, parsed as the loop parses it; the tool answers exactly.
    (parsed,) = parse_tool_calls(call["content"])
    assert (parsed.name, parsed.arguments) == ("calculator", {"expression": expression})
    assert result == {"role": "tool", "content": str(int(a) * int(b))}
    assert answer == {"role": "assistant", "content": f"#### {int(a) * int(b)}"}
    assert json.loads(row["tools"]) == SCHEMA
    # The data source falls back to the GSM8K reward: the number after '####' of the policy's turns.
    score = rule_for(row["data_source"], "test")
    assert score(call["content"] + answer["content"], row["reward_model"]["ground_truth"], {})["score"] == 1.0
    # The test split shares no question with the train split.
    train = {r["extra_info"]["expression"] for r in splits["train"]}
    assert not train & {r["extra_info"]["expression"] for r in splits["test"]}

    none = build_tool_arithmetic(n_train=30, n_test=10, min_digits=3, max_digits=3, format="sft", seed=1, tool="none")
    assert none["train"][0]["prompt"] == row["prompt"] and none["train"][0]["response"] == answer["content"]
    assert "messages" not in none["train"][0] and "tools" not in none["train"][0]
    rl = build_tool_arithmetic(n_train=30, n_test=10, min_digits=3, max_digits=3, seed=1)
    assert rl["train"][0] == {k: v for k, v in row.items() if k not in ("messages", "tools")}


def test_operations_and_refused_options() -> None:
    rows = build_tool_arithmetic(n_train=200, n_test=1, min_digits=1, max_digits=2, ops="+-")["train"]
    for row in rows:
        assert "*" not in row["extra_info"]["expression"]
        assert row["reward_model"]["ground_truth"] == str(eval(row["extra_info"]["expression"]))  # noqa: S307
    for options, message in (({"tool": "python"}, "-o tool='python'"), ({"ops": "/"}, "-o ops='/'"),
                             ({"min_digits": 3, "max_digits": 2}, "need 1 <= min_digits"),
                             ({"format": "x"}, "choose one of rl, sft")):
        with pytest.raises(UserError, match=message):
            build_tool_arithmetic(n_train=2, n_test=1, **options)
    with pytest.raises(UserError, match="only 20 different test problems"):  # 1 digit: 10 x 10, 80 of them train
        build_tool_arithmetic(n_train=80, n_test=30, min_digits=1, max_digits=1)


def test_prep_data_writes_the_chats_with_their_tools(tmp_path: Path) -> None:
    result = invoke(register, "prep-data", "tool-arithmetic", "--out", str(tmp_path), "--format", "sft",
                    "-o", "n_train=20", "-o", "n_test=4")
    assert result.exit_code == 0, result.output
    row = pq.read_table(tmp_path / "train.parquet").to_pylist()[0]
    assert json.loads(row["tools"]) == SCHEMA and [m["role"] for m in row["messages"]] == [
        "user", "assistant", "tool", "assistant"]


def test_the_scratch_template_shows_tools_calls_and_results_as_qwen25_does(scratch_tokenizer, tmp_path) -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
    chat = [{"role": "user", "content": "What is 12*34?"}, {"role": "assistant", "content": call},
            {"role": "tool", "name": "calculator", "content": "408"}, {"role": "assistant", "content": "#### 408"}]
    text = scratch_tokenizer.apply_chat_template(chat, tools=SCHEMA, tokenize=False)
    assert text == (
        '<|im_start|>system\nTools (call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>):\n<tools>\n'
        + json.dumps(SCHEMA[0]["function"]) + "\n</tools><|im_end|>\n"
        "<|im_start|>user\nWhat is 12*34?<|im_end|>\n"
        f"<|im_start|>assistant\n{call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n#### 408<|im_end|>\n")
    # An assistant message with structured tool_calls (how TRL's tool loop keeps them) renders the same text.
    structured = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}]}
    assert scratch_tokenizer.apply_chat_template([chat[0], structured, *chat[2:]], tools=SCHEMA, tokenize=False) == text
    # Two results in a row are one user turn; without tools there is no system turn.
    two = scratch_tokenizer.apply_chat_template([chat[0], chat[1], chat[2], {**chat[2], "content": "1"}],
                                                add_generation_prompt=True, tokenize=False)
    assert two.endswith("<tool_response>\n408\n</tool_response>\n<tool_response>\n1\n</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n") and two.startswith("<|im_start|>user\n")
    # TRL passes functions, which transformers turns into a schema with a "return" too: the prompt is the same.
    from transformers.utils import get_json_schema

    assert "return" in get_json_schema(calculator)["function"]
    assert scratch_tokenizer.apply_chat_template(chat, tools=[calculator], tokenize=False) == text
    # The tags are one token each; a task without tool calls keeps its vocabulary (and so its model) as before.
    tokens = scratch_tokenizer.convert_ids_to_tokens(scratch_tokenizer(call)["input_ids"])
    assert tokens[0] == "<tool_call>" and tokens[-1] == "</tool_call>"
    from rlkit.core.train.scratch import build_tokenizer

    plain = build_tokenizer(["What is 12*34? #### 408"], tmp_path, vocab_size=300)
    assert "<tool_call>" not in plain.get_vocab()


def test_sft_rows_with_tools_train_the_call_and_the_answer_not_the_tool_result(scratch_tokenizer) -> None:
    row = build_tool_arithmetic(n_train=1, n_test=1, format="sft", seed=3)["train"][0]
    prompt, response, mask = tokenize_sft_row(row, scratch_tokenizer)
    decode = scratch_tokenizer.decode
    assert decode(prompt) == scratch_tokenizer.apply_chat_template(
        row["prompt"], tools=SCHEMA, add_generation_prompt=True, tokenize=False)
    trained = [i for i, m in zip(response, mask) if m]
    call, result, answer = (m["content"] for m in row["messages"][1:])
    assert decode(trained) == f"{call}<|im_end|>{answer}<|im_end|>"
    context = [i for i, m in zip(response, mask) if not m]
    assert decode(context) == f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n" \
                              "<|im_start|>assistant\n\n"
    with pytest.raises(ValueError, match="column 'tools' is not valid JSON"):
        tokenize_sft_row({**row, "tools": "[{"}, scratch_tokenizer)
    with pytest.raises(ValueError, match="must be a list of function schemas"):
        tokenize_sft_row({**row, "tools": '{"a": 1}'}, scratch_tokenizer)
