"""What every rank-holding worker shares: its device, and joining a torch.distributed group."""

from __future__ import annotations

import gc
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.cluster.roles import check_served_names
from rlkit.recipes.schema import RLConfig


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class DeviceWorker(PhaseReporter):
    """Rank `rank` of `world_size` on one device: Ray's GPU (visible as cuda:0) or the CPU. A subclass composes
    the roles that work there (rlkit.core.cluster.roles) and lists the calls each serves."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_served_names(cls)

    def __init__(self, config: RLConfig, model_path: str, rank: int, world_size: int) -> None:
        self.config, self.model_path, self.rank, self.world_size = config, model_path, rank, world_size
        device = config.trainer.device
        self.use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        self.device = torch.device("cuda", 0) if self.use_cuda else torch.device("cpu")
        if not self.use_cuda:
            torch.set_num_threads(config.trainer.cpu_threads_per_worker)

    def freeze_heap(self) -> None:
        """The end of a worker's set-up in a process of its own (Ray): one collection, then every object so far (the
        models, compiled graphs, the engines' clients, Ray's) moved out of reach of Python's collector, as vLLM does
        in its engine's process. A step makes few objects that live on, so a full collection during one then walks
        those alone instead of the whole heap (a 12-layer model's worker on a CPU: 0.79 s in two collections over
        four steps before, 0.006 s after). Frozen objects are still freed by reference counting; only cycles among
        them would outlive their use. In-process workers (the caller's process: tests, notebooks) leave its heap
        alone."""
        if self.config.trainer.workers == "in_process":
            return
        gc.collect()
        gc.freeze()

    def address(self) -> tuple[str, int]:
        """Where rank 0 of a group can be reached: this host and a free port."""
        return socket.gethostbyname(socket.gethostname()), free_port()

    def share(self, value: Any) -> Any:
        """`value` for another worker: a ref into Ray's object store, or `value` itself when every worker is an
        object in this process (trainer.workers=in_process)."""
        if self.config.trainer.workers == "in_process":
            return value
        import ray  # the in-process path never imports Ray

        return ray.put(value)

    def fetch(self, shared: Any) -> Any:
        """What another worker's `share` gave."""
        if self.config.trainer.workers == "in_process":
            return shared
        import ray

        return ray.get(shared)

    def join_process_group(self, master_addr: str, master_port: int) -> None:
        """Every group of workers (policy, critic) is its own torch.distributed world, each Ray actor being a
        process of its own. In-process workers (trainer.workers=in_process) share their process's world of one:
        the group that joins first starts it, a colocated critic finds it started."""
        if dist.is_initialized() and dist.get_world_size() == self.world_size == 1:
            return
        self._join(master_addr, master_port)

    @in_phase("setup/process-group")
    def _join(self, master_addr: str, master_port: int) -> None:
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        if self.use_cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group("nccl" if self.use_cuda else "gloo", rank=self.rank, world_size=self.world_size)

    def save_checkpoint(self, folder: str) -> None:
        """This rank's sharded state into `folder` (collective: every rank calls it with the same folder)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpointed state")

    def load_checkpoint(self, folder: str) -> None:
        """This rank's sharded state from `folder`, as save_checkpoint wrote it."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpointed state")
