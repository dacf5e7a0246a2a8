"""Asynchronous rollout: the rollout workers generate the next batches while the learner trains.

rollout.mode=one_step_off keeps one batch ahead, rollout.mode=async rollout.max_staleness
batches ahead (split placement). The controller stays single-threaded: a batch "in flight"
is a set of Ray ObjectRefs of `generate` calls on the rollout workers, and the overlap is
simply that the controller trains before it waits for them.

The schedule is a function of the step alone, never of timing, so runs are reproducible
and resume exactly:
  - At the start of step k the batches of steps k .. k+L (L = the lookahead) are submitted;
    each new one is generated with the policy the engines hold when it was submitted.
  - After step k's update the weights go to the rollout workers (rlkit.core.cluster.placement):
    the load is queued on each worker behind the generation already queued there (an actor
    runs its calls in order), so a weight load never races a generate on the same engine,
    and every batch submitted afterwards is generated with version k.
  - So the batch of step s is generated with version max(0, s - 1 - L) and trained on by
    version s - 1: no trained sample is more than L versions old.
Each trajectory carries its version (`policy_version`); the update corrects for the gap with
importance weights against the engine's log-probs (actor.rollout_is, rlkit.core.algos.losses).

Checkpoints drain: `state_dict` waits for every batch in flight (and the weight load ahead of
it) and saves their trajectories with the checkpoint; a resumed run takes them from there
and submits new batches exactly where the uninterrupted run would (docs/resume.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from rlkit.core.batch import Batch, build_batch
from rlkit.core.rollout.source import Generation, SyncRolloutSource, timed
from rlkit.core.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from rlkit.core.cluster.placement import PendingSync, Placement
    from rlkit.core.data.dataset import PromptRow, PromptSampler
    from rlkit.core.rewards.scoring import RewardScorer
    from rlkit.recipes.schema import RLConfig


@dataclass
class InFlight:
    """The batch of one step, from submission until the learner takes it."""

    step: int                              # the step that trains on it
    generation: Generation | None          # its generate calls; None once collected
    sync: PendingSync | None = None        # the weight load queued on the rollout workers just before it
    trajectories: list[Trajectory] | None = None
    rollout_metrics: dict[str, float] = field(default_factory=dict)  # the rollout side's timings


class AsyncRolloutSource(SyncRolloutSource):
    """Batches generated ahead on the split rollout workers, at most `lookahead` policy versions old."""

    def __init__(self, config: RLConfig, rows: list[PromptRow], sampler: PromptSampler, tokenizer: Any,
                 scorer: RewardScorer, placement: Placement) -> None:
        super().__init__(config, rows, sampler, tokenizer, scorer, placement)
        self.lookahead = 1 if config.rollout.mode == "one_step_off" else config.rollout.max_staleness
        self.queue: list[InFlight] = []      # submitted, not yet trained on; oldest first
        self.submitted_through = 0           # the last step whose batch has been submitted
        self.pending_sync: PendingSync | None = None  # queued after the last submitted batch
        self.carried_metrics: dict[str, float] = {}   # a drained sync's metrics, for the next batch

    # -- the step's batch ---------------------------------------------------------------
    def next_batch(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        self.policy_version = step - 1  # before submitting: see SyncRolloutSource.next_batch
        self.submit_through(step + self.lookahead)
        entry = self.queue.pop(0)
        if entry.step != step:
            raise RuntimeError(f"asynchronous rollout out of step: step {step} found the batch of step {entry.step}")
        with timed(timing, "wait_for_rollout"):  # the trainer waiting for data: 0 when the overlap is complete
            self.collect(entry)
        batch = build_batch(entry.trajectories, pad_id=self.pad_id)
        with timed(timing, "reward"):
            scores, metrics = self.score(batch)
        batch.update(scores)
        return batch, {**metrics, **self.staleness_metrics(batch), **entry.rollout_metrics,
                       "rollout/samples": float(len(batch))}

    def submit_through(self, last_step: int) -> None:
        """Submit the batches of every step up to `last_step`, with the policy the engines will hold."""
        while self.submitted_through < last_step:
            step = self.submitted_through + 1
            prompts = [self.rows[i] for i in self.sampler.next_batch()]
            generation = self.submit_generation(prompts, self.sampling(step), method="generate_timed")
            self.queue.append(InFlight(step, generation, sync=self.pending_sync,
                                       rollout_metrics=self.carried_metrics))
            self.pending_sync, self.carried_metrics = None, {}
            self.submitted_through = step

    def collect(self, entry: InFlight) -> None:
        """Wait for the entry's weight load (it must have worked) and its generation."""
        if entry.sync is not None:
            entry.rollout_metrics.update(self.placement.finish_sync(entry.sync))
            entry.sync = None
        if entry.generation is None:
            return
        results = self.placement.rollout.collect(entry.generation.refs, f"generate (the batch of step {entry.step})")
        entry.trajectories = self.trajectories(entry.generation, [samples for samples, _ in results])
        timings = [timing for _, timing in results]
        entry.rollout_metrics.update({
            "rollout/generate_seconds": max(t["seconds"] for t in timings),
            "rollout/idle_seconds": max(t["idle_seconds"] for t in timings)})  # waiting for a request
        entry.generation = None

    def staleness_metrics(self, batch: Batch) -> dict[str, float]:
        """Versions behind the policy being updated (the current one), over the batch's samples."""
        versions = batch["policy_version"].to(torch.float64)
        staleness = self.policy_version - versions
        return {"rollout/staleness_mean": float(staleness.mean()), "rollout/staleness_max": float(staleness.max()),
                "rollout/policy_version_min": float(versions.min())}

    # -- weights --------------------------------------------------------------------------
    def sync_weights(self, step: int) -> dict[str, float]:
        """The training side now; the rollout side runs when the rollout workers reach it in their queues."""
        if self.pending_sync is not None:  # no batch was submitted since the last sync (e.g. right after a resume)
            self.carried_metrics.update(self.placement.finish_sync(self.pending_sync))
        self.pending_sync = self.placement.start_sync()
        self.policy_version = step
        return dict(self.pending_sync.metrics)

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Drain: wait for everything in flight; the batches not yet trained on are saved with the data position."""
        for entry in self.queue:
            self.collect(entry)
        if self.pending_sync is not None:
            self.carried_metrics.update(self.placement.finish_sync(self.pending_sync))
            self.pending_sync = None
        # The rollout side's timings travel along, so a resumed run logs the same metric keys.
        return {**super().state_dict(), "rollout_submitted_through": self.submitted_through,
                "rollout_carried_metrics": self.carried_metrics,
                "rollout_in_flight": [{"step": e.step, "trajectories": [_plain(t) for t in e.trajectories],
                                       "rollout_metrics": e.rollout_metrics} for e in self.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.submitted_through = state["rollout_submitted_through"]
        self.carried_metrics = dict(state["rollout_carried_metrics"])
        self.queue = [InFlight(e["step"], None, trajectories=[self._trajectory(t) for t in e["trajectories"]],
                               rollout_metrics=dict(e["rollout_metrics"])) for e in state["rollout_in_flight"]]

    def _trajectory(self, plain: dict[str, Any]) -> Trajectory:
        return Trajectory(**{**plain, "row": self.rows[plain["row"]]})


def _plain(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as JSON values: its fields, the prompt row by index (floats round-trip exactly)."""
    plain = {f.name: getattr(trajectory, f.name) for f in fields(trajectory)}
    return {**plain, "row": trajectory.row.index}
