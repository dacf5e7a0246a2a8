"""A rollout-only worker (split placement): one Ray actor per rollout device, holding an engine.

It trains nothing; after each update it loads the weights that training rank 0 put into
Ray's object store (rlkit.core.cluster.placement), bucket by bucket.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.rollout import sync_check
from rlkit.core.rollout.base import RolloutSample, Sampling
from rlkit.core.rollout.engines import make_engine
from rlkit.core.rollout.sync_check import FirstSyncProbe
from rlkit.core.train import fsdp


class RolloutWorker(DeviceWorker):
    """A rollout-only rank (split placement): an engine on its own device, fed weights by the trainer."""

    def setup(self) -> dict[str, Any]:
        self.phase = "setup/rollout-engine"
        cfg = self.config
        # Seeds continue after the training ranks', which seed their own engines when colocated.
        self.engine = make_engine(cfg, self.model_path, device=self.device,
                                  dtype=fsdp.compute_dtype(cfg.model.dtype, self.device),
                                  seed=cfg.trainer.seed + 10_000 + self.rank, sleep_mode=False)
        self.sync_probe = FirstSyncProbe()
        self.phase = "idle"
        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id()}

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        self.phase = "generate"
        samples = self.engine.generate(prompts, sampling)
        self.sync_probe.record(prompts, samples)
        self.phase = "idle"
        return samples

    def load_weights(self, bucket_refs: list) -> dict[str, float]:
        self.phase = "load_weights"
        start, moved = time.perf_counter(), 0

        def weights():
            nonlocal moved
            for ref in bucket_refs:
                for name, tensor in ray.get(ref):
                    moved += tensor.numel() * tensor.element_size()
                    yield name, tensor.to(self.device)

        checked = self.sync_probe.measure(self.engine, lambda: sync_check.load_weights(self.engine, weights()))
        self.phase = "idle"
        return {"bytes": float(moved), "seconds": time.perf_counter() - start, **checked}

    def engine_log_probs(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        return self.engine.score(sequences, prompt_len)
