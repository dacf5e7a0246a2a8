"""The weight-sync check (rlkit.core.rollout.sync_check): what stops a run, what only warns, and
the probe that sees whether a weight load changed what the engine computes."""

from __future__ import annotations

import logging

import pytest
import torch

from rlkit.core.cluster import faults
from rlkit.core.rollout.base import RolloutEngine, RolloutSample
from rlkit.core.rollout.sync_check import (
    FIRST_CHANGE_KEY,
    SyncProbe,
    WeightSyncError,
    check_weight_sync,
    first_change,
    load_weights,
)
from rlkit.recipes.schema import RolloutConfig


class ShiftEngine(RolloutEngine):
    """Scores every token at log-prob -1 - (sum of the loaded weights): a load shows in its outputs."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.scored: list[tuple[list[int], int]] = []

    def generate(self, prompts, sampling):
        raise NotImplementedError

    def load_weights(self, named_tensors) -> None:
        self.offset = sum(float(t.sum()) for _, t in named_tensors)

    def score(self, sequences, prompt_len):
        self.scored.append((sequences[0], prompt_len))
        return [[-1.0 - self.offset] * (len(s) - prompt_len) for s in sequences]


def test_a_gap_over_the_tolerance_stops_the_run_with_the_reason() -> None:
    metrics = {"rollout/log_prob_diff": 0.3, "reward/mean": 1.0}
    with pytest.raises(WeightSyncError, match=r"failed at step 7: .* differ from the trainer's by 0\.3 nats per "
                                              r"token .*rollout\.log_prob_tolerance=0\.05"):
        check_weight_sync(metrics, RolloutConfig(), step=7)
    check_weight_sync({"rollout/log_prob_diff": 0.05}, RolloutConfig(), step=7)  # at the tolerance: fine
    check_weight_sync({"rollout/log_prob_diff": 0.3}, RolloutConfig(log_prob_tolerance=0.5), step=7)


def test_truncated_or_stale_sampling_differs_by_design_and_is_not_held_to_the_tolerance() -> None:
    check_weight_sync({"rollout/log_prob_diff": 0.4}, RolloutConfig(top_p=0.9), step=3)
    check_weight_sync({"rollout/log_prob_diff": 0.4}, RolloutConfig(top_k=20), step=3)
    # Asynchronous rollout trains on samples of older policies: the gap is their staleness.
    check_weight_sync({"rollout/log_prob_diff": 0.4}, RolloutConfig(mode="one_step_off"), step=3)


def test_a_sync_that_changed_nothing_stops_the_run_and_the_key_leaves_the_metrics() -> None:
    metrics = {FIRST_CHANGE_KEY: 0.0, "reward/mean": 0.5}
    with pytest.raises(WeightSyncError, match="changed the weights left the rollout engine's log-probs"):
        check_weight_sync(metrics, RolloutConfig(), step=1)
    metrics = {FIRST_CHANGE_KEY: 0.02, "reward/mean": 0.5}
    check_weight_sync(metrics, RolloutConfig(), step=1)
    assert metrics == {"reward/mean": 0.5}  # logged once in console.log, not a metric that comes and goes


def test_warn_mode_logs_the_same_reason_and_trains_on(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        check_weight_sync({FIRST_CHANGE_KEY: 0.0, "rollout/log_prob_diff": 1.0}, RolloutConfig(sync_check="warn"), 4)
    assert "changed the weights left" in caplog.text and "by 1 nats per token" in caplog.text


def test_the_probe_checks_the_first_load_that_changes_the_weights_and_no_other() -> None:
    engine, probe = ShiftEngine(), SyncProbe()

    def load(*values: float) -> dict[str, float]:
        return probe.load(engine, [("w", torch.tensor(list(values)))], torch.float32)

    assert load(0.25) == {} and not engine.scored  # nothing sampled yet: the load is only fingerprinted
    # Not an empty response, nor a prompt of one token (the probe leaves out the first token).
    probe.record([[4, 5, 6], [7]], [RolloutSample(1, [8], [], True), RolloutSample(0, [], [], True),
                                   RolloutSample(0, [8, 9], [], True)])
    probe.record([[1]], [RolloutSample(0, [2], [], True)])  # later rollouts keep the first probe
    assert probe.pending
    assert load(0.25) == {} and probe.pending  # the same weights (a zero-gradient update): nothing to see
    assert load(0.25, 0.5) == {FIRST_CHANGE_KEY: 0.5}
    assert engine.scored == [([5, 6, 8, 9], 2)] * 3 and not probe.pending
    assert load(1.0) == {} and engine.offset == 1.0 and len(engine.scored) == 3  # later loads: unmeasured


def test_weights_equal_in_the_engines_dtype_are_no_change() -> None:
    engine, probe = ShiftEngine(), SyncProbe()
    probe.record([[4, 5]], [RolloutSample(0, [6], [], True)])
    probe.load(engine, [("w", torch.tensor([1.0]))], torch.bfloat16)
    # 1 + 2^-10 rounds to 1 in bfloat16 (8 bits of mantissa): an engine in bf16 cannot tell them apart.
    assert probe.load(engine, [("w", torch.tensor([1.0 + 2 ** -10]))], torch.bfloat16) == {} and probe.pending


def test_every_engine_must_change_so_the_smallest_change_counts() -> None:
    measured = [{FIRST_CHANGE_KEY: 0.3}, {"sync/bytes": 1.0}, {FIRST_CHANGE_KEY: 0.0}]
    assert first_change(measured) == {FIRST_CHANGE_KEY: 0.0}
    assert first_change([{"sync/bytes": 1.0}]) == {}


def test_fault_injection_drops_the_chosen_load_after_gathering_its_tensors(monkeypatch) -> None:
    monkeypatch.setenv(faults.ENV, "noop:engine-load:2")
    monkeypatch.setattr(faults, "_reached", faults.Counter())
    engine, gathered = ShiftEngine(), []

    def tensors(value: float):
        gathered.append(value)
        yield "w", torch.tensor([value])

    offsets = []
    for value in (1.0, 2.0, 3.0):
        load_weights(engine, tensors(value))
        offsets.append(engine.offset)
    assert offsets == [1.0, 1.0, 3.0]  # the second load never reached the engine
    assert gathered == [1.0, 2.0, 3.0]  # but still took part in every gather
