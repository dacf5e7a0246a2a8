"""Greedy accuracy of a model on RL rows scored by rlkit's GSM8K reward (rlkit's val/reward/mean@1, with transformers).

  python bench/greedy_eval.py --model DIR --data test.parquet [--max-new-tokens 160] [--json-out FILE]

bench/learning.py picks its SFT checkpoint with it; bench/trl_learning.py validates TRL's model with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlkit.core.rewards.gsm8k import gsm8k_reward  # noqa: E402


def reward(completions: list, ground_truth: list[str], **_) -> list[float]:
    """rlkit's GSM8K reward in TRL's signature (conversational completions: a list of messages each)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [gsm8k_reward(text, truth, {})["score"] for text, truth in zip(texts, ground_truth)]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="parquet of RL rows (prompt, reward_model.ground_truth)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json-out", default=None, help="also write the result here")
    args = parser.parse_args()
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    rows = pq.read_table(args.data).to_pylist()
    accuracy = greedy_accuracy(model.to(device), AutoTokenizer.from_pretrained(args.model), rows, args.max_new_tokens)
    result = json.dumps({"model": args.model, "rows": len(rows), "accuracy": accuracy})
    print(result)
    if args.json_out:
        Path(args.json_out).write_text(result)


if __name__ == "__main__":
    main()
