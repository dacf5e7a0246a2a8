"""A colocated engine frees its weights when it sleeps after a rollout (vLLM sleep level 2), since the weight
sync after the update loads them all: no host copy to allocate and fill. A rollout that finds them freed with
no sync since loads the trainer's and the engine keeps them from then on; the sync check scores its probe
before the sleep that frees them (rlkit.core.rollout.generator, rlkit.core.rollout.sync_check)."""

from __future__ import annotations

import math

import torch

from rlkit.core.cluster.phases import PhaseReporter
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling
from rlkit.core.rollout.generator import Generator
from rlkit.core.rollout.sync_check import FIRST_CHANGE_KEY
from rlkit.recipes.loader import load_config


class Engine(RolloutEngine):
    """Records its calls; its weights are one number, which a sleep that frees them turns to garbage (NaN)."""

    discards_weights = True

    def __init__(self) -> None:
        self.calls: list = []
        self.weight = 0.5  # the checkpoint's

    def generate(self, prompts, sampling, token_limits=None):
        self.calls.append("generate")
        assert not math.isnan(self.weight), "generating with freed weights"
        return [RolloutSample(i, [7, 8], [], True) for i in range(len(prompts))]

    def score(self, sequences, prompt_len):
        self.calls.append("score")
        return [[self.weight] * (len(s) - prompt_len) for s in sequences]

    def load_weights(self, named_tensors) -> None:
        tensors = dict(named_tensors)
        self.calls.append(("load", sorted(tensors)))
        self.weight = float(tensors["w"])

    def sleep(self, discard_weights: bool = False) -> None:
        self.calls.append(("sleep", discard_weights))
        if discard_weights:
            self.weight = math.nan

    def wake_up(self, weights_only: bool = False) -> None:
        self.calls.append(("wake_up", weights_only))


class Reporter(PhaseReporter):
    rank = 0


def generation(trainer_weight: list[float], sleep_mode: bool = True) -> tuple[Generator, Engine]:
    engine = Engine()
    config = load_config("grpo-demo")
    generator = Generator(
        Reporter(), config.rollout.agent, config.data, "unused", engine, device=torch.device("cpu"), dtype="float32",
        sleep_mode=sleep_mode, weights=lambda: iter([("w", torch.tensor(trainer_weight[0]))]),
    )
    return generator, engine


def rollout(generator: Generator) -> None:
    generator.generate([[1, 2, 3]], Sampling(n=1, max_tokens=2))


def test_each_rollout_frees_the_weights_the_sync_after_it_loads_again():
    generator, engine = generation([0.5])
    generator.sync_probe.done = True  # the check's own scoring is the next test's
    rollout(generator)
    generator.sync_weights()
    rollout(generator)
    assert engine.calls == [
        ("wake_up", False), "generate", ("sleep", True),
        ("wake_up", True), ("load", ["w"]),  # the sync wakes the weights alone and loads every one
        ("wake_up", False), "generate", ("sleep", True),
    ]
    assert generator.weights_discarded and generator.discard_on_sleep


def test_a_second_rollout_before_a_sync_loads_the_trainers_weights_and_the_engine_keeps_them_after():
    """Dynamic sampling's next round, ReMax's baseline: the weights freed come back from the trainer, whose
    weights they are, and later sleeps keep a copy (a load per round would cost more than the copies)."""
    generator, engine = generation([0.5])
    generator.sync_probe.done = True
    rollout(generator)
    engine.calls.clear()
    rollout(generator)
    assert engine.calls == [
        ("wake_up", False), ("wake_up", True), ("load", ["w"]), "generate", ("sleep", False)
    ]
    assert engine.weight == 0.5 and not generator.weights_discarded and not generator.discard_on_sleep


def test_validation_on_a_rank_without_prompts_still_takes_part_in_the_load():
    """Loading gathers the trainer's full tensors, a collective: every rank loads at the same call."""
    generator, engine = generation([0.5])
    generator.sync_probe.done = True
    rollout(generator)
    engine.calls.clear()
    assert generator.validation_episodes([], [], Sampling()) == []
    assert engine.calls == [("wake_up", True), ("load", ["w"])]


def test_the_sync_check_scores_its_probe_before_the_sleep_that_frees_the_weights():
    trainer = [0.5]
    generator, engine = generation(trainer)
    rollout(generator)  # the probe's sequence
    generator.sync_weights()  # the first load: its fingerprint
    trainer[0] = 3.0  # an update
    rollout(generator)
    assert engine.calls[-3:] == ["generate", "score", ("sleep", True)]
    # The load that changes the weights measured from 0.5 (not from the NaN of the freed weights) to 3.0.
    assert generator.sync_weights()[FIRST_CHANGE_KEY] == 2.5


def test_an_engine_that_cannot_free_its_weights_or_has_no_trainer_beside_it_keeps_them():
    generator, engine = generation([0.5], sleep_mode=False)  # a rollout worker's engine never sleeps
    assert not generator.discard_on_sleep
    engine = Engine()
    engine.discards_weights = False  # SGLang, the HF engine, vLLM without sleep mode
    config = load_config("grpo-demo")
    generator = Generator(Reporter(), config.rollout.agent, config.data, "unused", engine, device=torch.device("cpu"),
                          dtype="float32", sleep_mode=True, weights=lambda: iter([]))
    generator.sync_probe.done = True
    rollout(generator)
    assert engine.calls[-1] == ("sleep", False)
