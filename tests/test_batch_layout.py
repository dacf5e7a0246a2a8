"""The rollout batch layout (packing and micro-batching: tests/test_packing.py)."""

from __future__ import annotations

import torch

from rlkit.core.batch import Batch, build_batch
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import RolloutSample


def _samples():
    short, long = PromptRow(0, [5, 6], "d", "1"), PromptRow(1, [7, 8, 9], "d", "2")
    return [(short, 0, RolloutSample(0, [11, 2], [-0.5, -0.25], True)),
            (long, 1, RolloutSample(0, [12, 13, 14], [-1.0, -2.0, -3.0], False))]


def test_build_batch_pads_prompts_left_and_responses_right():
    batch = build_batch(_samples(), pad_id=0)
    assert batch["input_ids"].tolist() == [[0, 5, 6, 11, 2, 0], [7, 8, 9, 12, 13, 14]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2, 3, 3], [0, 1, 2, 3, 4, 5]]
    assert batch["responses"].tolist() == [[11, 2, 0], [12, 13, 14]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]
    assert batch["finished"].tolist() == [True, False]
    assert batch.meta["ground_truth"] == ["1", "2"]


def test_batch_chunk_keeps_rows_and_meta_together():
    batch = Batch({"x": torch.arange(8).view(4, 2)}, {"m": list("abcd")})
    parts = batch.chunk(2)
    assert parts[1]["x"].tolist() == [[4, 5], [6, 7]] and parts[1].meta["m"] == ["c", "d"]
    assert parts[0]["x"].tolist() == [[0, 1], [2, 3]] and parts[0].meta["m"] == ["a", "b"]
