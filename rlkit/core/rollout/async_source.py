"""Asynchronous rollout: the rollout workers generate the next batches while the learner trains.

rollout.mode=one_step_off keeps one batch ahead, rollout.mode=async rollout.max_staleness
batches ahead (split placement). The controller stays single-threaded: a batch "in flight"
is a set of Ray ObjectRefs of the rollout workers' calls (`generate`, or `agent_episodes` with an
agent loop; ReMax adds its greedy baseline's calls right behind them), and the overlap is simply
that the controller trains before it waits for them.

The schedule is a function of the step alone, never of timing, so runs are reproducible
and resume exactly:
  - At the start of step k the batches of steps k .. k+L (L = the lookahead) are submitted;
    each new one is generated with the policy the engines hold when it was submitted.
  - After step k's update the weights go to the rollout workers (rlkit.core.controller.placement):
    the load is queued on each worker behind the generation already queued there (an actor
    runs its calls in order), so a weight load never races a generate on the same engine,
    and every batch submitted afterwards is generated with version k.
  - So the batch of step s is generated with version max(0, s - 1 - L) and trained on by
    version s - 1: no trained sample is more than L versions old. A version is the last
    completed step, so a step that leaves the weights as they are (critic warm-up) still counts.
  - ReMax's greedy baseline is submitted right behind its batch: the same prompts, the same version.
  - DAPO's extra rounds (too few groups with signal) are generated when the step takes its batch,
    behind the batches in flight, with version s - 1: the rounds a step needs depend on its scores,
    which exist only then, so the schedule stays a function of the step (and of the run's scores).
Each trajectory carries its version (`policy_version`); the update corrects for the gap with
importance weights against the engine's log-probs (actor.rollout_correction, rlkit.core.algos.rollout_correction).

Checkpoints drain: `state_dict` waits for every batch in flight (and the weight load ahead of
it) and saves their trajectories with the checkpoint; a resumed run takes them from there
and submits new batches exactly where the uninterrupted run would (docs/resume.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from rlkit.core.batch import Batch
from rlkit.core.rewards.worker_pool import Outcome
from rlkit.core.rollout.source import stage_batch, timed
from rlkit.core.rollout.stages import Generation, RolloutStages
from rlkit.core.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from rlkit.core.controller.placement import PendingSync, Placement
    from rlkit.recipes.rollout_schema import RolloutConfig


@dataclass
class InFlight:
    """The batch of one step, from submission until the learner takes it."""

    step: int  # the step that trains on it
    generations: list[Generation]  # its calls: the samples', then ReMax's baseline's; [] once collected
    sync: PendingSync | None = None  # the weight load queued on the rollout workers just before it
    trajectories: list[Trajectory] | None = None
    baseline: list[Trajectory] | None = None  # ReMax: one greedy response per prompt, in prompt order
    rollout_metrics: dict[str, float] = field(default_factory=dict)  # the rollout side's timings


class AsyncScheduler:
    """Batches generated ahead on the split rollout workers, at most `lookahead` policy versions old."""

    def __init__(self, stages: RolloutStages, placement: Placement, rollout: RolloutConfig) -> None:
        self.stages, self.placement = stages, placement
        self.lookahead = 1 if rollout.mode == "one_step_off" else rollout.max_staleness
        self.policy_version = 0  # the last completed step: its weights are the engines' (0: the base model)
        self.queue: list[InFlight] = []  # submitted, not yet trained on; oldest first
        self.submitted_through = 0  # the last step whose batch has been submitted
        self.pending_sync: PendingSync | None = None  # queued after the last submitted batch
        self.carried_metrics: dict[str, float] = {}  # a drained sync's metrics, for the next batch

    # -- the step's batch ---------------------------------------------------------------
    def next_batch(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """Round 0 and ReMax's baseline: generated ahead. DAPO's extra rounds: generated now, behind the
        batches in flight, with the current policy (version step - 1)."""
        self.policy_version = step - 1  # the policy at step `step` (see SyncScheduler.next_batch)
        self.submit_through(step + self.lookahead)
        entry = self.queue.pop(0)
        if entry.step != step:
            raise RuntimeError(f"asynchronous rollout out of step: step {step} found the batch of step {entry.step}")
        with timed(timing, "wait_for_rollout"):  # the trainer waiting for data: 0 when the overlap is complete
            self.collect(entry)
        batch, metrics = stage_batch(
            self.stages,
            step,
            timing,
            first_round=lambda: entry.trajectories,
            greedy_trajectories=lambda _: entry.baseline,
        )
        return batch, {**metrics, **self.staleness_metrics(batch), **entry.rollout_metrics}

    def submit_through(self, last_step: int) -> None:
        """Submit the batches of every step up to `last_step`, with the policy the engines will hold."""
        generate = self.stages.generate
        while self.submitted_through < last_step:
            step = self.submitted_through + 1
            prompts = self.stages.prompts.take()
            generations = [generate.submit(prompts, generate.sampling(step), self.policy_version, timed=True)]
            if self.stages.greedy_baseline:  # queued right behind: no weight load between
                greedy = generate.sampling(step, greedy=True)
                generations.append(generate.submit(prompts, greedy, self.policy_version, timed=True))
            self.queue.append(InFlight(step, generations, sync=self.pending_sync, rollout_metrics=self.carried_metrics))
            self.pending_sync, self.carried_metrics = None, {}
            self.submitted_through = step

    def collect(self, entry: InFlight) -> None:
        """Wait for the entry's weight load (it must have worked) and its calls."""
        if entry.sync is not None:
            entry.rollout_metrics.update(self.placement.finish_sync(entry.sync))
            entry.sync = None
        if not entry.generations:
            return
        results = [
            self.placement.rollout.collect(g.refs, f"generate (the batch of step {entry.step})")
            for g in entry.generations
        ]
        entry.trajectories, *baseline = [
            self.stages.generate.trajectories(g, [out for out, _ in r]) for g, r in zip(entry.generations, results)
        ]
        entry.baseline = baseline[0] if baseline else None
        per_rank = list(zip(*results))  # per rank: (result, timing) of each call
        entry.rollout_metrics.update(
            {
                "rollout/generate_seconds": max(sum(t["seconds"] for _, t in calls) for calls in per_rank),
                # waiting for the first request (the baseline's is queued right behind it)
                "rollout/idle_seconds": max(calls[0][1]["idle_seconds"] for calls in per_rank),
            }
        )
        entry.generations = []

    def staleness_metrics(self, batch: Batch) -> dict[str, float]:
        """Versions behind the policy being updated (the current one), over the batch's samples."""
        versions = batch["policy_version"].to(torch.float64)
        staleness = self.policy_version - versions
        return {
            "rollout/staleness_mean": float(staleness.mean()),
            "rollout/staleness_max": float(staleness.max()),
            "rollout/policy_version_min": float(versions.min()),
        }

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
        return {
            **self.stages.prompts.state_dict(),
            "rollout_submitted_through": self.submitted_through,
            "rollout_carried_metrics": self.carried_metrics,
            "rollout_in_flight": [
                {
                    "step": e.step,
                    "trajectories": [_plain(t) for t in e.trajectories],
                    "baseline": None if e.baseline is None else [_plain(t) for t in e.baseline],
                    "rollout_metrics": e.rollout_metrics,
                }
                for e in self.queue
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stages.prompts.load_state_dict(state)
        self.submitted_through = state["rollout_submitted_through"]
        self.carried_metrics = dict(state["rollout_carried_metrics"])
        self.queue = [
            InFlight(
                e["step"],
                [],
                trajectories=[self._trajectory(t) for t in e["trajectories"]],
                baseline=(
                    None
                    if e.get("baseline") is None  # absent in checkpoints before ReMax
                    else [self._trajectory(t) for t in e["baseline"]]
                ),
                rollout_metrics=dict(e["rollout_metrics"]),
            )
            for e in state["rollout_in_flight"]
        ]

    def _trajectory(self, plain: dict[str, Any]) -> Trajectory:
        outcome = plain.get("reward_outcome")  # absent in checkpoints before reward.while_generating
        return Trajectory(
            **{
                **plain,
                "row": self.stages.prompts.rows[plain["row"]],
                "reward_outcome": None if outcome is None else Outcome(**outcome),
            }
        )


def _plain(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as JSON values: its fields, the prompt row by index, its reward outcome as a dict (floats
    round-trip exactly)."""
    plain = {f.name: getattr(trajectory, f.name) for f in fields(trajectory)}
    outcome = trajectory.reward_outcome
    return {**plain, "row": trajectory.row.index, "reward_outcome": None if outcome is None else asdict(outcome)}
