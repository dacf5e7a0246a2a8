"""The rollout-engine registry: engines by name, imported only when chosen."""

from __future__ import annotations

from typing import Any

import torch

from rlkit.core.rollout.base import RolloutEngine


def make_engine(name: str, model_path: str, *, dtype: str, seed: int, max_model_len: int,
                device: torch.device, gpu_memory_utilization: float = 0.5, enforce_eager: bool | None = None,
                max_num_seqs: int = 256, sleep_mode: bool = False,
                engine_kwargs: dict[str, Any] | None = None) -> RolloutEngine:
    """`sleep_mode`: the engine shares its device with training and releases memory between rollouts;
    `engine_kwargs`: further vllm.LLM arguments."""
    if name == "vllm":
        from rlkit.core.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, dtype=dtype, seed=seed, max_model_len=max_model_len, device=device,
                          gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                          max_num_seqs=max_num_seqs, sleep_mode=sleep_mode, engine_kwargs=engine_kwargs)
    if name == "hf":
        from rlkit.core.rollout.hf_engine import HFEngine

        return HFEngine(model_path, dtype=dtype, device=device)
    raise ValueError(f"unknown rollout engine {name!r} (vllm, hf)")
