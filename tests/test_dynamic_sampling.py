"""DAPO dynamic sampling's collector and the group filter stage: which groups a step trains on, over several rounds."""

from __future__ import annotations

import torch

from rlkit.core.algos.dapo import groups_with_signal
from rlkit.core.batch import build_batch
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.dynamic_sampling import GroupCollector, group_rows
from rlkit.core.rollout.stages import ScoredRound, group_filter
from rlkit.core.rollout.trajectory import Trajectory


def add_round(collector: GroupCollector[str], names: list[str], group_ids: list[int], scores: list[float]) -> None:
    ids, values = torch.tensor(group_ids), torch.tensor(scores)
    collector.add(names, ids, {"scores": values}, groups_with_signal(values, ids))


def test_group_rows_in_order_of_first_appearance() -> None:
    assert group_rows(torch.tensor([3, 3, 1, 1, 3])) == [[0, 1, 4], [2, 3]]


def test_collects_groups_with_signal_until_full() -> None:
    collector: GroupCollector[str] = GroupCollector(target=2)
    # Round 1: group 0 [1, 1] has no signal, group 1 [0, 1] has.
    add_round(collector, ["a0", "a1", "b0", "b1"], [0, 0, 1, 1], [1.0, 1.0, 0.0, 1.0])
    assert not collector.full
    # Round 2 reuses group ids 0 and 1 for new prompts: [0, 0] drops, [1, 0] keeps.
    add_round(collector, ["c0", "c1", "d0", "d1"], [0, 0, 1, 1], [0.0, 0.0, 1.0, 0.0])
    assert collector.full
    groups, tensors, metrics = collector.take()
    assert groups == [["b0", "b1"], ["d0", "d1"]]
    assert torch.equal(tensors["scores"], torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert metrics == {"dapo/gen_rounds": 2.0, "dapo/groups_dropped": 2.0, "dapo/groups_filled": 0.0}


def test_surplus_groups_of_the_last_round_are_left_out() -> None:
    collector: GroupCollector[str] = GroupCollector(target=1)
    add_round(collector, ["a0", "a1", "b0", "b1"], [0, 0, 1, 1], [0.0, 1.0, 1.0, 0.0])
    groups, tensors, metrics = collector.take()
    assert groups == [["a0", "a1"]]
    assert torch.equal(tensors["scores"], torch.tensor([0.0, 1.0]))
    assert metrics["dapo/groups_dropped"] == 0.0


def test_short_batch_is_filled_with_dropped_groups_in_order() -> None:
    collector: GroupCollector[str] = GroupCollector(target=3)
    add_round(collector, ["a0", "a1", "b0", "b1"], [0, 0, 1, 1], [1.0, 1.0, 0.0, 0.5])
    add_round(collector, ["c0", "c1", "d0", "d1"], [5, 5, 6, 6], [0.0, 0.0, 0.2, 0.2])
    # Rounds ran out with one group with signal (b): a and c fill the batch, d stays dropped.
    groups, tensors, metrics = collector.take()
    assert groups == [["b0", "b1"], ["a0", "a1"], ["c0", "c1"]]
    assert torch.equal(tensors["scores"], torch.tensor([0.0, 0.5, 1.0, 1.0, 0.0, 0.0]))
    assert metrics == {"dapo/gen_rounds": 2.0, "dapo/groups_dropped": 1.0, "dapo/groups_filled": 2.0}


def test_the_group_filter_stage_scores_rounds_until_enough_groups_have_signal() -> None:
    """Two prompts a round, two samples each: round 0 keeps row 1 (row 0 scored [1, 1]), round 1 fills the
    batch with row 2; row 3's group is surplus. The kept groups are renumbered 0 and 1."""
    scores = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [1.0, 0.0], 3: [0.0, 1.0], 4: [0.0, 1.0], 5: [0.0, 1.0]}
    asked: list[int] = []

    def scored_round(round_index: int) -> ScoredRound:
        asked.append(round_index)
        rows = [PromptRow(i, [7, 8], "synthetic/echo", str(i)) for i in (2 * round_index, 2 * round_index + 1)]
        trajectories = [Trajectory(row, group, [5], [1]) for group, row in enumerate(rows) for _ in range(2)]
        values = torch.tensor([s for row in rows for s in scores[row.index]])
        batch = build_batch(trajectories, pad_id=0).update({"scores": values - 0.5, "verifier_scores": values})
        return trajectories, batch, {"reward/mean": float(values.mean())}

    batch, metrics = group_filter(scored_round, target=2, max_rounds=3, pad_id=0)
    assert asked == [0, 1]
    assert batch.meta["row_index"] == [1, 1, 2, 2]
    assert batch["group_ids"].tolist() == [0, 0, 1, 1]
    assert batch["verifier_scores"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert batch["scores"].tolist() == [-0.5, 0.5, 0.5, -0.5]
    # The last round's own metrics, and over all 8 samples: shaped scores summing to 5 - 8 * 0.5 = 1.
    assert metrics == {"reward/mean": 0.5, "dapo/gen_rounds": 2.0, "dapo/groups_dropped": 1.0,
                       "dapo/groups_filled": 0.0, "rollout/samples": 8.0, "dapo/reward_mean_sampled": 0.125}


def test_the_group_filter_keeps_every_key_the_scoring_gives_with_its_groups() -> None:
    """gdpo's reward components travel with their groups: round 0 keeps row 1's group, round 1 row 2's."""
    scores = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [1.0, 0.0], 3: [1.0, 1.0]}

    def scored_round(round_index: int) -> ScoredRound:
        rows = [PromptRow(i, [7, 8], "synthetic/echo", str(i)) for i in (2 * round_index, 2 * round_index + 1)]
        trajectories = [Trajectory(row, group, [5], [1]) for group, row in enumerate(rows) for _ in range(2)]
        values = torch.tensor([s for row in rows for s in scores[row.index]])
        components = torch.tensor([[float(row.index), s] for row in rows for s in scores[row.index]])
        batch = build_batch(trajectories, pad_id=0).update(
            {"scores": values, "verifier_scores": values, "reward_components": components})
        return trajectories, batch, {}

    keys = ("scores", "verifier_scores", "reward_components")
    batch, _ = group_filter(scored_round, target=2, max_rounds=2, pad_id=0, keys=keys)
    assert batch["reward_components"].tolist() == [[1.0, 0.0], [1.0, 1.0], [2.0, 1.0], [2.0, 0.0]]
