"""A colocated engine wakes only after PyTorch's cached blocks are handed back (measured on an
H200: the update's ~45 GiB of activations stayed cached beside vLLM while it generated)."""

from __future__ import annotations

import torch

from rlkit.core.cluster.phases import PhaseReporter
from rlkit.core.rollout.base import RolloutEngine
from rlkit.core.rollout.generator import Generator
from rlkit.recipes.loader import load_config


class RecordingEngine(RolloutEngine):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def generate(self, prompts, sampling):
        raise AssertionError("not generating here")

    def load_weights(self, named_tensors) -> None:
        raise AssertionError("not loading here")

    def score(self, sequences, prompt_len):
        raise AssertionError("not scoring here")

    def wake_up(self, weights_only: bool = False) -> None:
        self.calls.append(f"wake_up(weights_only={weights_only})")


class Reporter(PhaseReporter):
    rank = 0


def generation(device: str, sleep_mode: bool, calls: list[str]) -> Generator:
    engine = RecordingEngine(calls)
    config = load_config("grpo-demo")
    return Generator(Reporter(), config.rollout.agent, config.data, "unused", engine, device=torch.device(device),
                     dtype="float32", sleep_mode=sleep_mode)


def test_the_cache_is_emptied_before_a_sleeping_cuda_engine_wakes(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    generation("cuda", True, calls).wake_engine(weights_only=True)
    assert calls == ["empty_cache", "wake_up(weights_only=True)"]


def test_a_cpu_engine_only_wakes(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    generation("cpu", True, calls).wake_engine()
    assert calls == ["wake_up(weights_only=False)"]


def test_an_engine_that_never_sleeps_keeps_the_cache(monkeypatch) -> None:
    """A rollout worker's engine has its device to itself: no update's blocks to hand back."""
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    generation("cuda", False, calls).wake_engine()
    assert calls == ["wake_up(weights_only=False)"]
