"""The rollout batch layout (packing and micro-batching: tests/test_packing.py)."""

from __future__ import annotations

import pytest
import torch

from rlkit.core.batch import Batch, build_batch
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import RolloutSample
from rlkit.core.rollout.trajectory import Trajectory


def _samples():
    short, long = PromptRow(0, [5, 6], "d", "1"), PromptRow(1, [7, 8, 9], "d", "2")
    return [Trajectory.single_turn(short, 0, RolloutSample(0, [11, 2], [-0.5, -0.25], True)),
            Trajectory.single_turn(long, 1, RolloutSample(0, [12, 13, 14], [-1.0, -2.0, -3.0], False))]


def test_build_batch_pads_prompts_left_and_responses_right():
    batch = build_batch(_samples(), pad_id=0)
    assert batch["input_ids"].tolist() == [[0, 5, 6, 11, 2, 0], [7, 8, 9, 12, 13, 14]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2, 3, 3], [0, 1, 2, 3, 4, 5]]
    assert batch["responses"].tolist() == [[11, 2, 0], [12, 13, 14]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]
    assert batch["finished"].tolist() == [True, False]
    assert batch["rollout_log_prob_rows"].tolist() == [True, True]
    assert batch.meta["ground_truth"] == ["1", "2"]


def test_a_check_steps_rows_without_engine_log_probs_are_marked():
    """On a check step a share of the samples returns log-probs (Sampling.log_prob_every): the others' rows hold
    zeros, which rollout_log_prob_rows tells from log-probs of 0; without any, neither key is there."""
    short, long = _samples()
    without = Trajectory.single_turn(PromptRow(0, [5, 6], "d", "1"), 0, RolloutSample(0, [11, 2], [], True))
    batch = build_batch([without, long], pad_id=0)
    assert batch["rollout_log_probs"].tolist() == [[0.0, 0.0, 0.0], [-1.0, -2.0, -3.0]]
    assert batch["rollout_log_prob_rows"].tolist() == [False, True]
    assert not {"rollout_log_probs", "rollout_log_prob_rows"} & set(build_batch([without], pad_id=0).tensors)


def test_loss_mask_trains_only_the_policys_tokens_while_attention_sees_them_all():
    """Two turns: policy tokens [11, 12], a tool's answer [40, 41] (mask 0), policy again [13]."""
    row = PromptRow(0, [5, 6], "d", "1")
    turns = Trajectory(row, 0, response_ids=[11, 12, 40, 41, 13], loss_mask=[1, 1, 0, 0, 1],
                       log_probs=[-0.5, -0.25, 0.0, 0.0, -1.0], finish_reason="stop", policy_version=3)
    one = Trajectory.single_turn(PromptRow(1, [7], "d", "2"), 1, RolloutSample(0, [12], [-2.0], False))
    batch = build_batch([turns, one], pad_id=0)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert batch["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0, 0.0, -1.0], [-2.0, 0.0, 0.0, 0.0, 0.0]]
    assert batch["policy_version"].tolist() == [3, 0]
    assert batch["finished"].tolist() == [True, False]


def test_a_trajectory_refuses_masks_that_do_not_line_up():
    row = PromptRow(0, [5], "d", "1")
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 tokens"):
        Trajectory(row, 0, response_ids=[1, 2], loss_mask=[1])
    with pytest.raises(ValueError, match="finish_reason"):
        Trajectory(row, 0, response_ids=[1], loss_mask=[1], finish_reason="eos")


def test_batch_chunk_keeps_rows_and_meta_together():
    batch = Batch({"x": torch.arange(8).view(4, 2)}, {"m": list("abcd")})
    parts = batch.chunk(2)
    assert parts[1]["x"].tolist() == [[4, 5], [6, 7]] and parts[1].meta["m"] == ["c", "d"]
    assert parts[0]["x"].tolist() == [[0, 1], [2, 3]] and parts[0].meta["m"] == ["a", "b"]
