"""A rollout-only worker (split placement): one Ray actor per rollout device (or one object beside the training
worker's, trainer.workers=in_process), composing a generation role.

It trains nothing; after each update it loads the weights training rank 0 sends (the weight-export
role, rlkit.core.train.weight_export): over a collective of their own
(rlkit.core.cluster.weight_transfer), or bucket by bucket from Ray's object store
(rollout.weight_sync). Its calls run one at a time in the order they were submitted, so a weight
load queued behind a generation waits for it (asynchronous rollout).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch

from rlkit.core.cluster.calls import method_name
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.roles import serve
from rlkit.core.cluster.weight_transfer import TensorSpec, TransferGroup, WeightReceiver
from rlkit.core.rollout.generator import Generator
from rlkit.core.train import fsdp


class RolloutWorker(DeviceWorker):
    """A rollout-only rank (split placement): an engine on its own device (`generation`), fed weights by the
    trainer."""

    generation: Generator

    generate = serve("generation", Generator.generate)
    generate_scored = serve("generation", Generator.generate_scored)
    agent_episodes = serve("generation", Generator.agent_episodes)
    validation_episodes = serve("generation", Generator.validation_episodes)
    engine_log_probs = serve("generation", Generator.engine_log_probs)

    def setup(self) -> dict[str, Any]:
        cfg = self.config
        began = time.perf_counter()
        with self.reporting("setup/rollout-engine"):
            # Seeds continue after the training ranks', which seed their own engines when colocated.
            self.dtype = fsdp.compute_dtype(cfg.model.dtype, self.device)
            # The engine has this device to itself: it never sleeps.
            self.generation = Generator.start(
                self,
                cfg,
                self.model_path,
                device=self.device,
                dtype=self.dtype,
                seed=cfg.trainer.seed + 10_000 + self.rank,
                sleep_mode=False,
            )
        self.freeze_heap()
        self.idle_since = time.perf_counter()  # when the last call ended: the rollout's idle time starts there
        parts = self.generation.engine.start_parts()
        return {"rank": self.rank, "startup": {"rollout_engine_start": self.idle_since - began, **parts}}

    def timed(self, method: Callable[..., Any], *args: Any) -> tuple[Any, dict[str, float]]:
        """`method`'s result (generate, agent_episodes), and how long this worker sat idle before the call and
        then ran it (asynchronous rollout's rollout/* timings)."""
        start = time.perf_counter()
        result = getattr(self, method_name(type(self), method))(*args)
        return result, self._timing(start)

    def _timing(self, start: float) -> dict[str, float]:
        end = time.perf_counter()
        timing = {"idle_seconds": start - self.idle_since, "seconds": end - start}
        self.idle_since = end
        return timing

    def join_weight_transfer(
        self, host: str, port: int, world_size: int, specs: list[TensorSpec], bucket_bytes: int
    ) -> None:
        """Join training rank 0's transfer group as rank 1 + this worker's rank."""
        timeouts = self.config.trainer.phase_timeout_s, self.config.rollout.weight_sync_timeout_s
        group = TransferGroup(
            host,
            port,
            1 + self.rank,
            world_size,
            self.device,
            handshake_timeout_s=timeouts[0],
            transfer_timeout_s=timeouts[1],
        )
        self.weight_receiver = WeightReceiver(group, specs, fsdp.DTYPES[self.dtype], bucket_bytes)

    def receive_weights(self) -> dict[str, float]:
        """Load the weights training rank 0 broadcasts, bucket by bucket, straight into the engine."""
        return self._load("receive_weights", self.weight_receiver.receive())

    def load_weights(self, bucket_refs: list) -> dict[str, float]:
        """Load the weights training rank 0 shared (rollout.weight_sync=object_store; in-process workers: always)."""
        return self._load(
            "load_weights", ((name, tensor.to(self.device)) for ref in bucket_refs for name, tensor in self.fetch(ref))
        )

    def _load(self, phase: str, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        start = time.perf_counter()
        with self.reporting(phase):
            moved, checked = self.generation.load(named_tensors)
        return {"bytes": moved, **self._timing(start), **checked}
