"""Disk cost and write time of one recorded step (trainer.record_rollouts) for a GSM8K-sized GRPO step.

The `grpo` recipe's step: 64 prompts x 8 samples = 512 sequences, KL loss (reference log-probs), an
old-log-prob pass (old log-probs, entropy), and on log-prob check steps the engine's log-probs. Token
ids are drawn uniformly from Qwen2.5's 151,936-token vocabulary and log-probs are random floats, so
neither compresses better than real ones would: an upper bound per token. Lengths are GSM8K's
(prompt: question + instruction, response: a worked answer) at ~4 characters per token, when
`--gsm8k DIR` (the folder of GSM8K's train.jsonl) is given, else the recipe's maxima (512 + 1024).

    python bench/record_size.py --gsm8k ~/data/gsm8k/raw      # results: docs/replay.md
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from rlkit.core.batch import build_batch
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.state import records

VOCAB, PROMPTS, SAMPLES, CHARS_PER_TOKEN = 151_936, 64, 8, 4
INSTRUCTION_TOKENS = 30  # 'Let's think step by step and output the final answer after "####".' and the chat template


def lengths(gsm8k: Path | None, rng: random.Random) -> list[tuple[int, int]]:
    """(prompt, response) token counts, one per prompt."""
    if gsm8k is None:
        return [(512, 1024)] * PROMPTS
    rows = [json.loads(line) for line in (gsm8k / "train.jsonl").read_text().splitlines()[: PROMPTS * 4]]
    chosen = rng.sample(rows, PROMPTS)
    return [
        (len(r["question"]) // CHARS_PER_TOKEN + INSTRUCTION_TOKENS, max(1, len(r["answer"]) // CHARS_PER_TOKEN))
        for r in chosen
    ]


def step_batch(gsm8k: Path | None, engine_log_probs: bool, seed: int = 0):
    rng = random.Random(seed)
    trajectories = []
    for group, (prompt_len, response_len) in enumerate(lengths(gsm8k, rng)):
        row = PromptRow(group, [rng.randrange(VOCAB) for _ in range(prompt_len)], "openai/gsm8k", "42", {})
        for _ in range(SAMPLES):
            n = max(1, min(1024, int(response_len * rng.uniform(0.5, 2.0))))  # samples differ in length
            ids = [rng.randrange(VOCAB) for _ in range(n)]
            log_probs = [-rng.expovariate(2.0) for _ in range(n)] if engine_log_probs else []
            trajectories.append(Trajectory(row, group, ids, loss_mask=[1] * n, log_probs=log_probs))
    batch = build_batch(trajectories, pad_id=0)
    mask = batch["response_mask"].float()
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 2, (len(trajectories),), generator=generator).float()
    batch["scores"] = batch["verifier_scores"] = scores
    advantages = (scores - scores.view(PROMPTS, SAMPLES).mean(1).repeat_interleave(SAMPLES))[:, None] * mask
    batch["advantages"] = batch["returns"] = advantages
    batch["token_rewards"] = torch.zeros_like(mask)
    for key in ("old_log_probs", "ref_log_probs", "entropy"):
        batch[key] = -torch.rand(mask.shape, generator=generator) * mask
    return batch, int(mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gsm8k", type=Path, help="folder of GSM8K's train.jsonl (else the recipe's maximum lengths)")
    args = parser.parse_args()
    for engine in (False, True):
        batch, tokens = step_batch(args.gsm8k, engine)
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            path = records.write_record(records.record_path(Path(folder), 1), 1, batch, {})
            seconds = time.perf_counter() - start
            size = path.stat().st_size
        shape = "x".join(map(str, batch["input_ids"].shape))
        print(
            f"{'with' if engine else 'without'} engine log-probs: {len(batch)} sequences, batch {shape}, "
            f"{tokens} response tokens: {size / 1e6:.2f} MB ({size / tokens:.1f} bytes per response token), "
            f"written in {seconds:.2f} s"
        )


if __name__ == "__main__":
    main()
