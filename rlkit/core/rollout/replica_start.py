"""Starting the replicas of rollout.vllm.replicas: together where their KV caches' sizes are known beforehand.

vLLM sizes an engine's KV cache as it starts, by profiling: it reads the device's free memory before and after a
forward pass and counts every change as its own. A second engine starting beside it on the same device allocates
its weights, activations and KV cache meanwhile, which the profile would count (a smaller, even negative, KV
cache) or, where that engine frees memory, fail an assertion. So replicas whose KV size vLLM must measure start
one after another: on an H100 two replicas of a 0.5B policy took 63-82 s to start, about twice one engine's
time (docs/startup.md).

An engine given its KV cache's size (vLLM's kv_cache_memory_bytes) skips the measurement, and such engines can
start at once. That size is the one the device's own first start measured: after replicas started one after
another, the smallest KV size among them is recorded, keyed by everything it depends on (vLLM's engine
arguments but the seed, the model's config, the vLLM and torch versions, the device's name and memory), in
vLLM's cache folder (VLLM_CACHE_ROOT, $RLKIT_CACHE/compile/vllm in rlkit's workers) beside the compiled graphs
the replicas load: deleted with them, the next start measures again. A later start with the same key starts
every replica together with that size, provided the device has the rollout's whole share free
(rollout.gpu_memory_utilization of its memory), which each replica's own check then finds whatever the others
hold by then. Should they fail to start together with it, the record goes and they start one after another,
measuring again: a stale record costs start-up time, never the run. On a CPU a replica's KV cache is
VLLM_CPU_KVCACHE_SPACE: replicas always start together.

The caller's work handed to the start (rlkit.core.rollout.engines.BesideStart: the trainer's model load and compile
warm-up) runs on the calling thread while the replicas start, if the device has room for the rollout's share and
what the work holds at once; otherwise before they start. Beside replicas that measure their KV caches, the work's
prelude (the model's load, whose memory stays) runs first and the rest's memory is taken from the device beforehand
(`hold_cached`), so that their profiles find the device's use unchanged; should they fail to start with company,
they start again alone.

One engine in a process of its own (rollout.vllm.streaming or separate_process, one replica) starts the same way:
its KV size recorded at its first start on a device, the caller's work beside its start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from rlkit.core.cluster.worker_env import compile_cache_root

if TYPE_CHECKING:
    from rlkit.core.rollout.engines import BesideStart

logger = logging.getLogger("rlkit")

RECORDS = "rlkit-kv-sizes"  # the folder under VLLM_CACHE_ROOT
KV_ARGUMENT = "kv_cache_memory_bytes"  # vLLM's engine argument


class Replica(Protocol):
    def kv_cache_bytes(self) -> int | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class StartPlan:
    together: bool
    kv_cache_bytes: int | None  # each replica's KV size, when rlkit gives it (None: vLLM's own sizing)
    why: str


def plan_start(
    *, on_gpu: bool, recorded: int | None, given_by_user: bool, free_bytes: int, share_bytes: int
) -> StartPlan:
    """How the replicas start. `recorded`: the KV size this device's first start with these settings measured;
    `given_by_user`: rollout.vllm.engine_kwargs sets kv_cache_memory_bytes; `free_bytes` of the device now,
    `share_bytes` the rollout's whole share of it."""
    if not on_gpu:
        return StartPlan(True, None, "on a CPU each replica's KV cache has the size VLLM_CPU_KVCACHE_SPACE gives")
    if given_by_user:
        return StartPlan(True, None, f"rollout.vllm.engine_kwargs.{KV_ARGUMENT} sizes each replica's KV cache")
    if recorded is None:
        return StartPlan(False, None, "a first start with these settings on this device: vLLM measures each KV cache")
    if free_bytes < share_bytes:
        return StartPlan(
            False,
            None,
            f"the device has {free_bytes / 2**30:.1f} GiB free, less than the rollout's share "
            f"{share_bytes / 2**30:.1f} GiB: vLLM measures each KV cache",
        )
    return StartPlan(True, recorded, f"each with the {recorded / 2**30:.2f} GiB KV cache an earlier start measured")


def start_replicas(
    start_one: Callable[[int | None], Replica],
    count: int,
    *,
    arguments: dict[str, Any],
    device: torch.device,
    share: float,
    beside_start: BesideStart | None = None,
) -> tuple[list[Any], StartPlan]:
    """`count` engines from `start_one(kv_cache_bytes)`, together or one after another (`plan_start`), and the
    plan they started by. `arguments`: vLLM's engine arguments of one replica (the record's key); `share`:
    rollout.gpu_memory_utilization, the fraction of the device all replicas take together; `beside_start` the
    caller's work, run once: beside the start where the device has room for both, else before it."""
    on_gpu = device.type == "cuda"
    key = record_key(arguments, device) if on_gpu else ""
    free_bytes, total_bytes = torch.cuda.mem_get_info(device) if on_gpu else (0, 0)
    share_bytes = int(share * total_bytes)
    plan = plan_start(
        on_gpu=on_gpu,
        recorded=read_record(key) if on_gpu else None,
        given_by_user=KV_ARGUMENT in arguments,
        free_bytes=free_bytes,
        share_bytes=share_bytes,
    )
    way = (
        ("with a known KV size" if plan.together else "measuring its KV cache")
        if count == 1
        else ("together" if plan.together else "in turn")
    )
    logger.info("rollout: %d vLLM engine process(es) start %s: %s", count, way, plan.why)
    beside = beside_start
    if beside is not None and not room_beside(
        on_gpu=on_gpu, free_bytes=free_bytes, share_bytes=share_bytes, beside_bytes=beside.bytes
    ):
        beside.run(beside=False)
        beside = None
    elif beside is not None:
        if on_gpu and not plan.together:  # measuring: what stays on the device comes first, the rest draws on a block
            beside.run_prelude()
            hold_cached(beside.bytes - beside.prelude_bytes, device)
        logger.info("rollout: %s runs beside the replicas' start", beside.what)
    if plan.together:
        try:
            return start_group(start_one, count, plan.kv_cache_bytes, together=True, beside_start=beside), plan
        except BesideStartFailed as failed:
            raise failed.__cause__ from None  # type: ignore[misc]
        except Exception as error:
            if plan.kv_cache_bytes is None:  # nothing of rlkit's to take back: the start itself failed
                raise
            # The recorded size no longer fits (another tenant, a driver's overhead): measured again, in turn.
            logger.warning(
                "rollout: the replicas failed to start together with the recorded KV size (%s: %s); "
                "they start one after another and measure it again",
                type(error).__name__,
                error,
            )
            record_path(key).unlink(missing_ok=True)
            plan = StartPlan(False, None, f"starting together failed ({type(error).__name__}): measured again")
        beside = None  # it ran beside the failed start
    try:
        engines = start_group(start_one, count, None, together=False, beside_start=beside)
    except BesideStartFailed as failed:
        raise failed.__cause__ from None  # type: ignore[misc]
    except Exception as error:
        if beside is None:
            raise
        # Whatever the company did to the start (memory, time), the replicas get a start of their own.
        logger.warning(
            "rollout: the replicas failed to start with %s beside them (%s: %s); they start again alone",
            beside.what,
            type(error).__name__,
            error,
        )
        engines = start_group(start_one, count, None, together=False)
    if on_gpu and KV_ARGUMENT not in arguments:
        measured = [engine.kv_cache_bytes() for engine in engines]
        if all(measured):
            write_record(key, min(measured), arguments)  # type: ignore[type-var]
    return engines, plan


class BesideStartFailed(Exception):
    """The caller's work run beside the replicas' start failed (its error is the cause): not the replicas' own."""


def start_group(
    start_one: Callable[[int | None], Replica],
    count: int,
    kv_cache_bytes: int | None,
    *,
    together: bool,
    beside_start: BesideStart | None = None,
) -> list[Any]:
    """`count` engines, each on a thread of its own (`together`) or one after another on one thread, and
    `beside_start` meanwhile on this one. If an engine fails, those that started are closed and its error raised;
    if `beside_start` fails, every engine is closed once started (BesideStartFailed)."""
    started: list[Any] = []

    def in_turn() -> None:
        for _ in range(count):
            started.append(start_one(kv_cache_bytes))

    if not together and beside_start is None:  # on this thread
        try:
            in_turn()
        except Exception:
            for engine in started:
                engine.close()
            raise
        return started
    beside_error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=count if together else 1, thread_name_prefix="rlkit-replica-start") as pool:
        futures = [pool.submit(start_one, kv_cache_bytes) for _ in range(count)] if together else [pool.submit(in_turn)]
        if beside_start is not None:
            try:
                beside_start.run(beside=True)
            except Exception as error:  # the engines first finish starting, then close
                beside_error = error
        wait(futures)
    errors = [future.exception() for future in futures if future.exception() is not None]
    if together:
        started = [future.result() for future in futures if future.exception() is None]
    if errors or beside_error is not None:
        for engine in started:
            engine.close()
        if beside_error is not None:
            raise BesideStartFailed(str(beside_error)) from beside_error
        raise errors[0]  # type: ignore[misc]
    return started


def room_beside(*, on_gpu: bool, free_bytes: int, share_bytes: int, beside_bytes: int) -> bool:
    """Whether the caller's work may run beside the replicas' start: the device holds the rollout's share and the
    work's bytes at once."""
    return not on_gpu or free_bytes >= share_bytes + beside_bytes


def hold_cached(nbytes: int, device: torch.device) -> None:
    """Have torch's caching allocator take `nbytes` of the device now, in one block it keeps cached once freed.

    A replica measuring its KV cache counts any change of the device's used memory while it profiles as its own
    (vLLM's memory profile: the device's used memory less its own process's torch memory): the work beside it
    draws on this block instead of the device, so the device's use stays as the replica found it. The caller
    gives the block back (torch.cuda.empty_cache) once the replicas have started."""
    torch.empty(nbytes, dtype=torch.uint8, device=device)


# -- records ----------------------------------------------------------------------------------------------------
def record_key(arguments: dict[str, Any], device: torch.device) -> str:
    """What a replica's measured KV size depends on, hashed: its engine arguments but the seed (ranks differ in
    it), the model's config.json where the model is a local folder, vLLM's and torch's versions, the device."""
    import vllm

    model = Path(str(arguments.get("model", "")))
    config = model / "config.json"
    properties = torch.cuda.get_device_properties(device)
    factors = {
        "arguments": {name: value for name, value in arguments.items() if name != "seed"},
        "model_config": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else "",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "device": [properties.name, properties.total_memory],
    }
    return hashlib.sha256(json.dumps(factors, sort_keys=True, default=str).encode()).hexdigest()[:20]


def record_path(key: str) -> Path:
    vllm_cache = os.environ.get("VLLM_CACHE_ROOT") or compile_cache_root() / "vllm"  # rlkit's workers set it
    return Path(vllm_cache) / RECORDS / f"{key}.json"


def read_record(key: str) -> int | None:
    """The recorded KV size for `key`; None where there is none or it cannot be read (a first start again)."""
    try:
        value = json.loads(record_path(key).read_text())[KV_ARGUMENT]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def write_record(key: str, kv_cache_bytes: int, arguments: dict[str, Any]) -> None:
    """Write the record atomically (another run may read it); a failure to write costs only the next start's
    speed, so it is logged, not raised."""
    path = record_path(key)
    body = {KV_ARGUMENT: int(kv_cache_bytes), "arguments": {k: str(v) for k, v in arguments.items() if k != "seed"}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(body, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError as error:
        logger.warning("rollout: the replicas' KV size was not recorded (%s): the next start measures it again", error)
