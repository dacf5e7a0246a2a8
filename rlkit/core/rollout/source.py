"""Where the learner's batches come from: schedulers around the rollout's stages.

The controller asks a rollout source for the next step's batch and does not care how it was made.
Every source runs the same stages (rlkit.core.rollout.stages: prompts -> generate -> score -> group
filter) through `stage_batch`; a scheduler decides only when a step's generation is submitted and
with which policy version. `SyncScheduler` (rollout.mode=sync) generates each step's batch when the
step asks for it, with the current policy; `AsyncScheduler` (rlkit.core.rollout.async_source,
one_step_off/async) keeps batches in flight while the learner trains. The controller picks one
from rollout.mode when it is built.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from rlkit.core.batch import Batch
from rlkit.core.rollout.dynamic_sampling import group_rows
from rlkit.core.rollout.stages import RolloutStages, ScoredRound, group_filter
from rlkit.core.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from rlkit.core.controller.placement import Placement


class RolloutSource(Protocol):
    def next_batch(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """The step's scored batch (prompt-major, rollout.n samples per group) and its rollout metrics;
        phase times are added to `timing`."""

    def sync_weights(self, step: int) -> dict[str, float]:
        """After step `step`'s update: the rollout engines get its weights (policy version `step`); sync metrics."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue exactly (the data position)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def stage_batch(
    stages: RolloutStages,
    step: int,
    timing: dict[str, float],
    first_round: Callable[[], list[Trajectory]],
    greedy_trajectories: Callable[[Batch], list[Trajectory]],
) -> tuple[Batch, dict[str, float]]:
    """The step's batch through the stages, whatever the schedule: round 0's trajectories (`first_round()`)
    scored; with dynamic sampling (DAPO), its extra rounds generated now with the current policy (version
    step - 1); with ReMax, the greedy baseline's trajectories (`greedy_trajectories(batch)`) scored onto it."""

    def scored_round(round_index: int) -> ScoredRound:
        trajectories = first_round() if round_index == 0 else generate_round(stages, step, round_index, timing)
        batch = stages.score.batch(trajectories)
        with timed(timing, "reward"):
            scores, metrics = stages.score(batch, [t.reward_outcome for t in trajectories])
        metrics.update(stages.score.episode_metrics(trajectories, step))
        return trajectories, batch.update(scores), metrics

    if stages.algorithm.group_filter:
        batch, metrics = group_filter(
            scored_round,
            target=stages.train_batch_size,
            max_rounds=stages.plan.gen_rounds,
            pad_id=stages.score.pad_id,
            keys=stages.score.keys,
        )
    else:
        _, batch, metrics = scored_round(0)
        metrics["rollout/samples"] = float(len(batch))
    if stages.greedy_baseline:  # an extra, greedy rollout (ReMax)
        with timed(timing, "gen_baseline"):
            metrics.update(stages.score.baseline(batch, greedy_trajectories(batch)))
    return batch, metrics


def generate_round(stages: RolloutStages, step: int, round_index: int, timing: dict[str, float]) -> list[Trajectory]:
    """The next train_batch_size prompts, generated now with the current policy (version step - 1)."""
    prompts = stages.prompts.take()
    with timed(timing, "gen"):
        return stages.generate(prompts, stages.generate.sampling(step, round_index=round_index), step - 1)


class SyncScheduler:
    """rollout.mode=sync: each step's batch generated when the step asks for it, with the policy as it is now."""

    def __init__(self, stages: RolloutStages, placement: Placement) -> None:
        self.stages, self.placement = stages, placement

    def next_batch(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        # The policy at step `step` is the weights after step - 1: its version, also when that step left them
        # as they were (critic warm-up, no sync), so versions count steps and staleness never exceeds the schedule.
        return stage_batch(
            self.stages,
            step,
            timing,
            first_round=lambda: generate_round(self.stages, step, 0, timing),
            greedy_trajectories=lambda batch: self.greedy_now(batch, step),
        )

    def greedy_now(self, batch: Batch, step: int) -> list[Trajectory]:
        """ReMax: one greedy response per prompt of the batch, generated now."""
        rows, row_index = self.stages.prompts.rows, batch.meta["row_index"]
        prompts = [rows[row_index[group[0]]] for group in group_rows(batch["group_ids"])]
        return self.stages.generate(prompts, self.stages.generate.sampling(step, greedy=True), step - 1)

    def sync_weights(self, step: int) -> dict[str, float]:
        return self.placement.sync_weights()

    def state_dict(self) -> dict[str, Any]:
        return self.stages.prompts.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stages.prompts.load_state_dict(state)


@contextmanager
def timed(timing: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall time to timing[name] (a phase may run several times in a step)."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
