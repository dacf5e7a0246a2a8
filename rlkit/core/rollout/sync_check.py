"""The weight-sync check: a rollout engine that is not running the trained weights stops the run.

Two tests, both on what the engine computes (not on what was sent to it):
- A weight load that changes the weights must change the engine's outputs: an engine scores
  one sequence it sampled before and after such a load (`SyncProbe`, once per engine: the
  first load whose weights, in the engine's dtype, differ from the previous load's; an
  update with a zero gradient changes nothing). Identical log-probs mean the weights never
  arrived (e.g. names the engine silently skipped). A stale engine trains the policy on the
  base model's samples without any other sign, for as long as the run lasts.
- On check steps (rollout.log_prob_check_freq) the engine's log-probs of the tokens it just
  sampled must match the trainer's: `rollout/log_prob_diff` <= rollout.log_prob_tolerance
  (with rollout.mode=sync: asynchronous rollout samples with older policies on purpose).

A failure raises `WeightSyncError` (rollout.sync_check=error, the default) or logs a warning (warn).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

import torch

from rlkit.core.cluster import faults
from rlkit.core.cluster.failures import TROUBLESHOOTING, RunFailure
from rlkit.core.rollout.base import RolloutEngine, RolloutSample
from rlkit.recipes.schema import RolloutConfig

logger = logging.getLogger("rlkit")

# What the first weight-changing load did to the engine's log-probs of its probe (max |after - before|).
FIRST_CHANGE_KEY = "sync/first_change"
GAP_KEY = "rollout/log_prob_diff"


class WeightSyncError(RunFailure):
    """The rollout engine does not compute with the weights being trained."""


class SyncProbe:
    """One sequence an engine sampled, scored before and after the first load that changes the weights."""

    def __init__(self) -> None:
        self.sequence: list[int] | None = None
        self.prompt_len = 0
        self.fingerprint: torch.Tensor | None = None  # the last load's weights, summed per tensor
        self.done = False
        self.before: torch.Tensor | None = None  # the probe's scores under the weights the next load replaces

    def record(self, prompts: list[list[int]], samples: list[RolloutSample]) -> None:
        """Keep a sample of the first rollout as the probe, less its first token.

        A sampled sequence may fill the engine's whole context, and scoring it asks for one
        more token, so the probe drops the first prompt token (any fixed sequence serves to
        compare before with after).
        """
        if self.done or self.sequence is not None:
            return
        sample = next((s for s in samples if s.token_ids and len(prompts[s.prompt_index]) > 1), None)
        if sample is not None:
            prompt = prompts[sample.prompt_index]
            self.sequence, self.prompt_len = prompt[1:] + sample.token_ids, len(prompt) - 1

    @property
    def pending(self) -> bool:
        """The next load is measured (the engine must then be awake enough to score)."""
        return not self.done and self.sequence is not None and self.fingerprint is not None

    def score_before_load(self, engine: RolloutEngine) -> None:
        """While the next load is measured, score the probe now, at a rollout's end: the engine holds the
        weights that load replaces, and may free them when it sleeps (rlkit.core.rollout.generator)."""
        if self.pending:
            self.before = self._score(engine)

    def load(
        self, engine: RolloutEngine, tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
    ) -> dict[str, float]:
        """Load `tensors` into `engine`; while the check is open, also what the load changed.

        `dtype` is the engine's: weights that differ only below its precision cannot change its outputs.
        """
        if self.done:
            load_weights(engine, tensors)
            return {}
        before, self.before = self.before, None
        if before is None and self.pending:  # no rollout since the last load: the engine still holds its weights
            before = self._score(engine)
        sums: list[torch.Tensor] = []

        def fingerprinted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in tensors:
                sums.append(_fingerprint(tensor, dtype))
                yield name, tensor

        stream = fingerprinted()
        load_weights(engine, stream)
        for _ in stream:  # what an engine left unread is still part of the weights sent (and of every gather)
            pass
        fingerprint = torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.float64)
        changed = self.fingerprint is not None and not torch.equal(fingerprint, self.fingerprint)
        self.fingerprint = fingerprint
        if before is None or not changed:
            return {}
        self.done = True
        return {FIRST_CHANGE_KEY: float((self._score(engine) - before).abs().max())}

    def _score(self, engine: RolloutEngine) -> torch.Tensor:
        # An engine may draw random numbers while scoring; the training RNG streams must not
        # notice (a resumed run probes at another step than the run it continues).
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            return torch.tensor(engine.score([self.sequence], self.prompt_len)[0], dtype=torch.float64)


def _fingerprint(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The sum of `tensor` as the engine holds it (in `dtype`), in float64, 16M elements at a time
    (a float64 copy of a whole embedding would take gigabytes at sync time)."""
    flat = tensor.detach().reshape(-1)
    return sum((part.to(dtype).double().sum() for part in flat.split(1 << 24)), flat.new_zeros((), dtype=torch.float64))


def first_change(results: list[dict[str, Any]]) -> dict[str, float]:
    """The smallest first-load change over every engine that measured one (each must change)."""
    changes = [r[FIRST_CHANGE_KEY] for r in results if FIRST_CHANGE_KEY in r]
    return {FIRST_CHANGE_KEY: min(changes)} if changes else {}


def check_weight_sync(metrics: dict[str, float], rollout: RolloutConfig, step: int) -> None:
    """Take the sync measurements out of a step's metrics and stop the run (or warn) on a failure."""
    change = metrics.pop(FIRST_CHANGE_KEY, None)
    problems = []
    if change is not None:
        logger.info(
            "weight-sync check: the first weight-changing sync moved the engine's log-probs by up to %.3g", change
        )
        if change == 0.0:
            problems.append(
                "a weight sync that changed the weights left the rollout engine's log-probs of a "
                "sampled sequence exactly as they were: the engine is not receiving the trained "
                "weights, so every rollout would come from the base model"
            )
    gap = metrics.get(GAP_KEY)
    # By design the gap is not the sync's: the engine samples a truncated distribution, or (one_step_off,
    # async) the samples come from an older policy than the trainer's; the first-change probe still runs.
    by_design = rollout.top_p < 1.0 or rollout.top_k > 0 or rollout.mode != "sync"
    if gap is not None and not by_design and gap > rollout.log_prob_tolerance:
        problems.append(
            f"the rollout engine's log-probs of the tokens it sampled differ from the trainer's by "
            f"{gap:.4g} nats per token ({GAP_KEY}), over rollout.log_prob_tolerance="
            f"{rollout.log_prob_tolerance:g}: the engine is not computing with the weights being "
            "trained (a failed or partial weight sync), or its numerics differ that much"
        )
    if not problems:
        return
    message = (
        f"weight-sync check failed at step {step}: " + "; and ".join(problems) + ". "
        f"See {TROUBLESHOOTING}, 'The weight-sync check failed'; rollout.sync_check=warn trains on "
        "regardless, a larger rollout.log_prob_tolerance accepts a larger gap."
    )
    if rollout.sync_check == "warn":
        logger.warning(message)
        return
    raise WeightSyncError(message)


def load_weights(engine: RolloutEngine, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """`engine.load_weights(tensors)`, unless fault injection drops this load (RLKIT_FAULT=noop:engine-load:N)."""
    if faults.dropped("engine-load"):
        for _ in tensors:  # still gathered: every rank takes part in each collective
            pass
        return
    engine.load_weights(tensors)
