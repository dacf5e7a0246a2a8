"""The rollout-engine registry: `rollout.name` picks one; its module is imported only when chosen.

Every engine is built here, from the run's rollout section, by one path: the policy workers
(colocated) and the rollout workers (split placement) call `make_engine` alike. An engine's
own options live under `rollout.<name>.*` (rlkit.recipes.rollout_schema); what it needs from
other sections (the model's path and dtype, the longest sequence, its seed) the caller passes
explicitly. A new engine is a module with a `RolloutEngine` subclass plus a factory below,
named in rlkit.core.registrations.

A caller may hand work of its own to run while the engine starts (`BesideStart`: the trainer's compile warm-up,
rlkit.core.train.warmup). Every factory runs it exactly once: beside the start where the device has room for both
and nothing the start measures would see it (vLLM replicas in engine-core processes of their own, their KV sizes
known or measured with the work's memory taken beforehand: rlkit.core.rollout.replica_start), else before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from rlkit.core.registrations import ENGINES
from rlkit.core.rollout.base import RolloutEngine

if TYPE_CHECKING:
    from rlkit.recipes.rollout_schema import RolloutConfig

EngineFactory = Callable[..., RolloutEngine]


@dataclass
class BesideStart:
    """The caller's work to run while an engine starts, on the calling thread, once; it holds at most `bytes` of
    the engine's device at its peak, which the caller gives back (torch.cuda.empty_cache) before a start it ran
    ahead of and after one it ran beside. `what` names it in the log; `ran_beside` tells, once it ran, whether
    that was beside the start (True) or before it (False).

    `prelude` (the models' load) is the part whose memory stays on the device after the work (`prelude_bytes` of
    `bytes`): it may run beside a start that measures nothing of the device, never beside one that measures
    (a KV cache sized by profiling), which runs it first (`run_prelude`), the rest of the work beside."""

    work: Callable[[bool], None]  # called with `ran_beside`
    bytes: int
    what: str
    prelude: Callable[[], None] | None = None
    prelude_bytes: int = 0
    ran_beside: bool | None = None

    def run_prelude(self) -> None:
        """The prelude, now, if it has not run."""
        if self.prelude is not None:
            prelude, self.prelude = self.prelude, None
            prelude()

    def run(self, *, beside: bool) -> None:
        self.run_prelude()
        self.ran_beside = beside
        self.work(beside)


def run_before(beside_start: BesideStart | None) -> None:
    """An engine whose start cannot have company runs the caller's work first."""
    if beside_start is not None:
        beside_start.run(beside=False)


def make_engine(
    rollout: RolloutConfig,
    model_path: str,
    *,
    max_model_len: int,
    device: torch.device,
    dtype: str,
    seed: int,
    sleep_mode: bool,
    beside_start: BesideStart | None = None,
) -> RolloutEngine:
    """The engine `rollout.name` names, for `model_path` on `device`, holding sequences of up to
    `max_model_len` tokens (data.max_prompt_length + data.max_response_length).

    `sleep_mode`: the engine shares its device with training and releases memory between rollouts.
    `beside_start`: the caller's work, run once before this returns, beside the start where it can be.
    """
    return ENGINES.get(rollout.name)(
        rollout,
        model_path,
        max_model_len=max_model_len,
        device=device,
        dtype=dtype,
        seed=seed,
        sleep_mode=sleep_mode,
        beside_start=beside_start,
    )


def vllm_engine(
    rollout: RolloutConfig,
    model_path: str,
    *,
    max_model_len: int,
    device: torch.device,
    dtype: str,
    seed: int,
    sleep_mode: bool,
    beside_start: BesideStart | None = None,
) -> RolloutEngine:
    from rlkit.core.rollout.vllm_engine import VLLMEngine

    options = rollout.vllm
    replicas = options.replicas
    # What every vLLM engine of the run is started with (rlkit.core.rollout.vllm_engine.engine_arguments).
    settings = dict(
        dtype=dtype,
        seed=seed,
        device=device,
        max_model_len=max_model_len,
        enforce_eager=options.enforce_eager,
        max_num_seqs=rollout.max_num_seqs,
        sleep_mode=sleep_mode,
        prefix_caching=options.prefix_caching,
        engine_kwargs=options.engine_kwargs,
    )

    per_replica = rollout.gpu_memory_utilization / replicas  # replicas share the device's share

    def one_engine(kv_cache_bytes: int | None = None) -> RolloutEngine:
        """One engine; `kv_cache_bytes` sizes its KV cache instead of vLLM's profile (rollout.replica_start)."""
        sized = {} if kv_cache_bytes is None else {"kv_cache_memory_bytes": kv_cache_bytes}
        own = {**settings, "engine_kwargs": {**(options.engine_kwargs or {}), **sized}}
        if options.streaming:
            from rlkit.core.rollout.vllm_async import AsyncVLLMEngine

            return AsyncVLLMEngine(model_path, gpu_memory_utilization=per_replica, **own)
        return VLLMEngine(
            model_path,
            gpu_memory_utilization=per_replica,
            # Replicas in one process would take turns on its interpreter: each engine core gets a process.
            separate_process=options.separate_process or replicas > 1,
            **own,
        )

    if replicas == 1 and not (options.streaming or options.separate_process):
        run_before(beside_start)  # in-process: vLLM's memory profile would count the caller's tensors as its own
        return one_engine()
    from rlkit.core.rollout.replica_start import start_replicas
    from rlkit.core.rollout.replicas import ReplicatedEngine
    from rlkit.core.rollout.vllm_engine import engine_arguments, import_engine_modules

    import_engine_modules()  # once, before the replicas' threads
    on_gpu = device.type == "cuda"
    unplaced = {name: value for name, value in settings.items() if name not in ("device", "sleep_mode")}
    arguments = engine_arguments(
        model_path, on_gpu=on_gpu, gpu_memory_utilization=per_replica, sleep_mode=sleep_mode and on_gpu, **unplaced
    )
    arguments["streaming"] = options.streaming  # the async engine's start differs: part of the record's key
    # One engine in a process of its own starts as a replica does: the caller's work beside it.
    engines, plan = start_replicas(
        one_engine,
        replicas,
        arguments=arguments,
        device=device,
        share=rollout.gpu_memory_utilization,
        beside_start=beside_start,
    )
    return engines[0] if replicas == 1 else ReplicatedEngine(engines, started_together=plan.together)


def sglang_engine(
    rollout: RolloutConfig,
    model_path: str,
    *,
    max_model_len: int,
    device: torch.device,
    dtype: str,
    seed: int,
    sleep_mode: bool,
    beside_start: BesideStart | None = None,
) -> RolloutEngine:
    from rlkit.core.rollout.sglang_engine import SGLangEngine

    options = rollout.sglang
    run_before(beside_start)  # its server sizes its memory from the device's free memory as it starts
    return SGLangEngine(
        model_path,
        dtype=dtype,
        seed=seed,
        device=device,
        max_model_len=max_model_len,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        max_num_seqs=rollout.max_num_seqs,
        sleep_mode=sleep_mode,
        attention_backend=options.attention_backend,
        deterministic=options.deterministic,
        engine_kwargs=options.engine_kwargs,
        streaming=options.streaming,
    )


def hf_engine(
    rollout: RolloutConfig,
    model_path: str,
    *,
    max_model_len: int,
    device: torch.device,
    dtype: str,
    seed: int,
    sleep_mode: bool,
    beside_start: BesideStart | None = None,
) -> RolloutEngine:
    from rlkit.core.rollout.hf_engine import HFEngine

    run_before(beside_start)  # its start is a model load, over in seconds

    return HFEngine(model_path, dtype=dtype, device=device, batch_size=rollout.hf.batch_size)
