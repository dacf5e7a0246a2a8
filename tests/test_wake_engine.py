"""A colocated engine wakes only after PyTorch's cached blocks are handed back (measured on an
H200: the update's ~45 GiB of activations stayed cached beside vLLM while it generated)."""

from __future__ import annotations

import torch

from rlkit.core.cluster.device_worker import DeviceWorker


class RecordingEngine:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def wake_up(self, weights_only: bool = False) -> None:
        self.calls.append(f"wake_up(weights_only={weights_only})")


def worker(use_cuda: bool, calls: list[str]) -> DeviceWorker:
    w = DeviceWorker.__new__(DeviceWorker)  # no config or process group needed for this method
    w.use_cuda, w.engine = use_cuda, RecordingEngine(calls)
    return w


def test_the_cache_is_emptied_before_a_cuda_engine_wakes(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    worker(True, calls).wake_engine(weights_only=True)
    assert calls == ["empty_cache", "wake_up(weights_only=True)"]


def test_a_cpu_worker_only_wakes_its_engine(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    worker(False, calls).wake_engine()
    assert calls == ["wake_up(weights_only=False)"]
