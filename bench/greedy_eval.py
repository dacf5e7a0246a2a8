"""Greedy accuracy of a model on RL rows scored by rlkit's GSM8K reward (rlkit's val/reward/mean@1, with transformers).

  python bench/greedy_eval.py --model DIR [--model DIR ...] --data test.parquet [--max-new-tokens 160]
      [--json-out FILE]

bench/learning.py scores its SFT checkpoints with it (several in one process: {"scores": {model: accuracy}}, and
"accuracy" for one); bench/trl_learning.py validates TRL's model with it, in the tool loop where TRL has tools
(greedy_tool_accuracy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlkit.core.rewards.gsm8k import gsm8k_reward  # noqa: E402


def reward(completions: list, ground_truth: list[str], **_) -> list[float]:
    """rlkit's GSM8K reward in TRL's signature (conversational completions: a list of messages each). As rlkit
    scores an episode, the text scored is the policy's own turns (every assistant message, not the tools')."""
    texts = [policy_text(c) if isinstance(c, list) else c for c in completions]
    return [gsm8k_reward(text, truth, {})["score"] for text, truth in zip(texts, ground_truth)]


def policy_text(messages: list[dict]) -> str:
    return "".join(m.get("content") or "" for m in messages if m.get("role", "assistant") == "assistant")


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, batch_size: int = 256) -> float:
    """Share of test prompts whose greedy answer the GSM8K reward scores 1 (rlkit's val/reward/mean@1)."""
    import torch

    was_training = model.training
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    correct = 0.0
    try:
        for begin in range(0, len(rows), batch_size):
            chunk = rows[begin:begin + batch_size]
            prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                       for r in chunk]
            batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
            correct += sum(r for r in reward([[{"content": t}] for t in texts],
                                             [row["reward_model"]["ground_truth"] for row in chunk]))
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()
    return correct / len(rows)


def greedy_tool_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, tools: list, max_turns: int,
                         batch_size: int = 256) -> tuple[float, float]:
    """(accuracy, tool calls per episode) of greedy episodes in rlkit's tool loop: each turn is generated from the
    chat so far (rendered with the tools' schemas), its calls (rlkit's parser) are answered by the tools as "tool"
    messages, a turn without a call ends the episode; the policy's turns are scored together (rlkit's
    val/reward/mean@1 and val/agent/tool_calls of rollout.agent.loop=tool, with transformers)."""
    import torch

    from rlkit.core.agents.tools import Tool, ToolCall, parse_tool_calls

    by_name = {tool.name: tool for tool in (Tool.from_function(fn) for fn in tools)}
    schemas = [tool.schema for tool in by_name.values()]

    def answer(call: ToolCall | str) -> str:
        tool = by_name.get(getattr(call, "name", None))
        if tool is None:
            return f"error: {call}" if isinstance(call, str) else f"error: there is no tool {call.name!r}"
        try:
            return str(tool.fn(**call.arguments))
        except Exception as exc:  # noqa: BLE001 - the model reads any failure, as in rlkit's loop
            return f"error: {type(exc).__name__}: {exc}"

    was_training = model.training
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    chats = [list(r["prompt"]) for r in rows]
    texts, calls, open_ = [""] * len(rows), [0] * len(rows), list(range(len(rows)))
    try:
        for turn in range(max_turns):
            for begin in range(0, len(open_), batch_size):
                chunk = open_[begin:begin + batch_size]
                prompts = [tokenizer.apply_chat_template(chats[i], tools=schemas, add_generation_prompt=True,
                                                         tokenize=False) for i in chunk]
                batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
                with torch.no_grad():
                    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
                for i, text in zip(chunk, tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:],
                                                                 skip_special_tokens=True)):
                    texts[i] += text
                    chats[i].append({"role": "assistant", "content": text})
                    found = parse_tool_calls(text) if turn < max_turns - 1 else []
                    calls[i] += len(found)
                    chats[i] += [{"role": "tool", "name": getattr(c, "name", "error"), "content": answer(c)}
                                 for c in found]
            open_ = [i for i in open_ if chats[i][-1]["role"] == "tool"]
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()
    scores = reward(texts, [row["reward_model"]["ground_truth"] for row in rows])
    return sum(scores) / len(rows), sum(calls) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, action="append", help="a model directory (repeatable)")
    parser.add_argument("--data", required=True, help="parquet of RL rows (prompt, reward_model.ground_truth)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json-out", default=None, help="also write the result here")
    args = parser.parse_args()
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = pq.read_table(args.data).to_pylist()
    scores = {}
    for folder in args.model:
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        scores[folder] = greedy_accuracy(model.to(device), AutoTokenizer.from_pretrained(folder), rows,
                                         args.max_new_tokens)
        print(f"{folder}: {scores[folder]:.3f}", flush=True)
    result = json.dumps({"rows": len(rows), "scores": scores,
                         **({"accuracy": scores[args.model[0]]} if len(args.model) == 1 else {})})
    print(result)
    if args.json_out:
        Path(args.json_out).write_text(result)


if __name__ == "__main__":
    main()
