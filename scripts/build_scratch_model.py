"""Build a model from scratch for a task: a BPE tokenizer trained on the task's text and a fresh Qwen2.

  python scripts/build_scratch_model.py --data data/sft/train.parquet --out models/arith [--size tiny] [--vocab 512]

--data is a parquet of SFT rows (prompt + response, e.g. `rlkit prep-data arithmetic --format sft`, or
messages, with tools: `rlkit prep-data tool-arithmetic --format sft`); the tokenizer is trained on every
prompt, response and message in it, and on the tool schemas its chat template shows. --out is then a `--model DIR` for
`rlkit train sft` (sizes: rlkit.core.train.scratch.SIZES). The warm-start walkthrough in the README
uses it: a model built this way knows nothing until SFT teaches it the format and the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlkit.core.train.scratch import SIZES, build_task_model  # noqa: E402


def texts(path: str) -> list[str]:
    """Every prompt message, response and chat message of a parquet of SFT rows, and each row's tools
    (the JSON schemas, as the chat template writes them into the prompt)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    out = []
    for row in rows:
        prompt = row.get("prompt")
        out += [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt or []]
        if row.get("response") is not None:
            out.append(row["response"])
        else:
            out += [m["content"] for m in row.get("messages") or [] if m["role"] != "user"]
        if row.get("tools"):
            tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
            out += [json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="parquet of SFT rows (prompt + response)")
    parser.add_argument("--out", required=True, help="new model directory")
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--vocab", type=int, default=512, help="BPE vocabulary size, special tokens included")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = build_task_model(texts(args.data), args.out, size=args.size, vocab_size=args.vocab, seed=args.seed)
    print(f"built {folder}: {json.loads((folder / 'rlkit_scratch.json').read_text())}")


if __name__ == "__main__":
    main()
