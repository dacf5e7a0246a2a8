"""The environment every worker runs in, Ray actor or in-process object (no Ray import here)."""

from __future__ import annotations

import os
from pathlib import Path

from rlkit.core.bytecode import cache_root
from rlkit.recipes.schema import RLConfig

WORKER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM logs every weight reload; the live metrics table is what a person watches.
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    # vLLM's CPU build (no effect on GPUs): a small KV cache instead of a share of all RAM,
    # and no core pinning, so several workers on one host don't pin to the same cores.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
# NVLink multicast (NVLS) in NCCL, torch symmetric memory and NVSHMEM: set to off unless
# trainer.nvlink_multicast, since on hosts without a working multicast fabric it fails or hangs.
MULTICAST_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# What torch.compile (inductor, Triton) and vLLM (its compiled graphs) keep between runs, under one folder,
# so that a run of a recipe compiled before starts from them (docs/startup.md).
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "VLLM_CACHE_ROOT": "vllm"}


def compile_cache_root() -> Path:
    """$RLKIT_CACHE/compile (RLKIT_CACHE: ~/.cache/rlkit unless set, the tiny model's folder too)."""
    return cache_root() / "compile"


def worker_env(config: RLConfig) -> dict[str, str]:
    """Environment of every worker: rlkit's settings and compile caches, then the caller's VLLM_*/RLKIT_*
    variables and cache folders."""
    caches = {key: str(compile_cache_root() / folder) for key, folder in COMPILE_CACHES.items()}
    env = {**WORKER_ENV, **caches, **({} if config.trainer.nvlink_multicast else MULTICAST_OFF_ENV)}
    callers = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "RLKIT_")) or k in COMPILE_CACHES}
    return {**env, **callers}
