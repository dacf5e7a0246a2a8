"""Predicted time per phase and per step, from what each phase does on the device (docs/benchmarks.md).

Training pass: its matrix-multiply FLOPs at a fixed share of the device's peak, plus a fixed cost per
micro-batch (kernel launches, FSDP hooks, the log-probs over the vocabulary); the fixed cost is why a
small model on small micro-batches reaches a lower MFU than a 7B. The update is forward + backward
(2 passes of work; 1 with LoRA, whose frozen weights need no gradient) + the recompute with gradient
checkpointing. Generation: the prompts' prefill as a forward, then one decode step per response token;
a step costs a fixed time per layer, a time per sequence (sampling over the vocabulary) and the longer
of reading every weight and the live KV cache from HBM and computing 2 FLOPs a parameter per sequence.
Weight sync: a fixed cost plus bytes moved. The constants were fitted on four H200 runs (CALIBRATION;
bench/plan_time_fit.py refits them). Responses count at data.max_response_length, so the prediction
is an upper bound for runs whose answers end early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.phase_plan import phase_plan
from rlkit.core.planning.shape import ModelShape
from rlkit.core.rollout.base import check_stride
from rlkit.recipes.schema import RLConfig

# docs/benchmarks.md, "Calibration of rlkit plan", mirrors this table. "fit" = least squares over the four
# one-H200 runs of 2026-12-01 (vLLM 0.26 with CUDA graphs, torch 2.11; 256 + 512 tokens, 8 samples a prompt):
# 0.5B 64 prompts compiled at 32768 micro-batch tokens, and 0.5B / 3B / 7B-LoRA-16 at 16 prompts, eager,
# checkpointed, 8192 tokens; bench/plan_time_fit.py holds their numbers and refits.
CALIBRATION = {
    "device": "NVIDIA H200",
    "peak_flops": 800e12,  # bf16 matrix-multiply rate measured on the same GPUs (785-818 TFLOP/s)
    "hbm_bytes_per_s": 4.3e12,  # assumed, not measured: ~90% of the H200's 4.8 TB/s datasheet bandwidth
    "matmul_efficiency": 0.74,  # fit: share of peak_flops a training pass's matrix products reach
    "forward_s_per_micro_batch": 0.041,  # fit: fixed cost of one micro-batch's forward (ref / old-log-prob)
    "update_s_per_micro_batch": 0.056,  # fit: the same for each forward-sized pass of the update
    "decode_s_per_layer": 86e-6,  # fit: fixed cost of a decode step per decoder layer (launches, norms)
    "decode_s_per_sequence": 11.7e-6,  # fit: per decode step and sequence (sampling over the vocabulary)
    "log_prob_decode_factor": 0.65,  # decode speed while the engine returns log-probs (session 2: 0.6-0.7x)
    "sync_s": 0.28,  # fit: fixed cost of a colocated weight sync
    "sync_bytes_per_s": 47e9,  # fit: colocated sync rate (4 bytes a parameter, as the sync counts them)
    "split_sync_bytes_per_s": 0.25e9,  # split placement: 0.99 GB of bf16 through Ray's object store in 3.92 s
    "multi_gpu_forward_efficiency": 0.25 / 0.40,  # forward MFU on 2 GPUs / on 1, session 2's bench (25.1% / 40%)
    "multi_gpu_update_efficiency": 0.31 / 0.38,  # update MFU on 2 GPUs / on 1 (31.0% / 38%)
    "controller_s_per_sample": 0.19 / 512,  # reward + advantages + batch assembly: ~0.19 s for 512 responses
}


TIMING_KEYS = {"adv": "reward+adv"}  # the controller also scores rewards beside computing advantages


@dataclass
class StepTime:
    phases: dict[str, float]
    notes: list[str]

    @property
    def step(self) -> float:
        return sum(self.phases.values())


def micro_batches(sequences: int, sequence_tokens: int, budget: int, group: int = 1) -> int:
    """Micro-batches that pack `sequences` full-length sequences at `budget` tokens each (a group stays whole)."""
    per_micro = max(1, budget // (sequence_tokens * group)) * group
    return math.ceil(sequences / per_micro)


def pass_seconds(flops: float, micro: int, passes: float, kind: str, devices: int, cal: dict = CALIBRATION) -> float:
    """`passes` forward-sized passes over `flops` (one forward, whole batch) split over `devices`, `micro`
    micro-batches per device per pass; kind "forward" or "update" picks the fixed cost and the 2-GPU share."""
    seconds = passes * (
        flops / devices / (cal["peak_flops"] * cal["matmul_efficiency"]) + micro * cal[f"{kind}_s_per_micro_batch"]
    )
    return seconds / (cal[f"multi_gpu_{kind}_efficiency"] if devices > 1 else 1.0)


def decode_step_seconds(
    shape: ModelShape, concurrent: int, context: float, weight_bytes: int, cal: dict = CALIBRATION
) -> float:
    """One decode step of `concurrent` sequences with `context` tokens each in the KV cache."""
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * weight_bytes
    read = (weight_bytes * shape.params + concurrent * context * kv_per_token) / cal["hbm_bytes_per_s"]
    compute = concurrent * 2 * shape.params / (cal["peak_flops"] * cal["matmul_efficiency"])
    return shape.layers * cal["decode_s_per_layer"] + concurrent * cal["decode_s_per_sequence"] + max(read, compute)


def generate_seconds(
    shape: ModelShape,
    sequences: int,
    concurrent: int,
    prompt: int,
    response: int,
    weight_bytes: int = 2,
    cal: dict = CALIBRATION,
) -> float:
    """One engine generating `sequences` responses of `response` tokens, at most `concurrent` at once."""
    prefill = sequences * prompt * 2 * shape.params / (cal["peak_flops"] * cal["matmul_efficiency"])
    rounds = math.ceil(sequences / concurrent)
    running = min(sequences, concurrent)
    return prefill + rounds * response * decode_step_seconds(shape, running, prompt + response / 2, weight_bytes, cal)


def step_time(
    config: RLConfig,
    shape: ModelShape,
    critic: ModelShape | None = None,
    *,
    micro_batch_tokens: int,
    kv_tokens: float | None = None,
    cal: dict = CALIBRATION,
) -> StepTime:
    """Seconds per phase of one step. `micro_batch_tokens`: the update's token budget as the memory model
    sized it; `kv_tokens`: what one engine's KV cache holds (fewer full sequences at once when short);
    `cal`: the constants (bench/plan_time_fit.py passes others to fit them)."""
    data, world, algorithm = config.data, config.world_size, Algorithm.from_config(config)
    samples = data.train_batch_size * config.samples_per_prompt
    sequence = data.max_prompt_length + data.max_response_length
    forward = samples * shape.forward_flops(data.max_prompt_length, data.max_response_length)
    group = config.micro_batch_group
    whole = micro_batches(math.ceil(samples / world), sequence, micro_batch_tokens, group)  # a log-prob pass
    per_mini = config.actor.mini_batch_size * config.samples_per_prompt
    update_micro = micro_batches(math.ceil(per_mini / world), sequence, micro_batch_tokens, group) * math.ceil(
        samples / per_mini
    )
    notes = [f"calibrated on {cal['device']} (docs/benchmarks.md); responses at full length"]
    if world > 2:
        notes.append(f"{world} training devices: the 2-GPU efficiency is assumed (measured on 1 and 2)")
    lora = bool(config.model.lora.rank)
    passes = (2 if lora else 3) + (1 if config.model.gradient_checkpointing else 0)
    update = pass_seconds(forward, update_micro, passes * config.actor.ppo_epochs, "update", world, cal)
    if config.actor.fused_lm_head:  # its backward computes the head's logits again (its saved memory traffic: unpriced)
        head = samples * 2 * shape.hidden * shape.vocab * data.max_response_length
        update += pass_seconds(head, 0, config.actor.ppo_epochs, "update", world, cal)
        notes.append("actor.fused_lm_head: one more head matmul in the update; not calibrated on a GPU")
    reference = pass_seconds(forward, whole, 1, "forward", world, cal)
    if config.offline:  # no generation, weight sync or reward; dpo: the reference's log-prob pass
        return StepTime({**({"ref": reference} if algorithm.reference else {}), "update": update}, notes)
    engines = world if config.rollout.placement == "colocated" else config.rollout.devices
    per_engine = math.ceil(samples / engines)
    concurrent = min(per_engine, config.rollout.max_num_seqs)
    if kv_tokens is not None and kv_tokens // sequence < concurrent:
        concurrent = max(1, int(kv_tokens // sequence))
        notes.append(f"the KV cache holds {concurrent} full-length sequences at once: generation in rounds")
    if config.rollout.name == "vllm" and config.rollout.vllm.replicas > 1:
        notes.append(
            f"rollout.vllm.replicas={config.rollout.vllm.replicas}: generation is priced as one engine's "
            "(replicas are not calibrated)"
        )
    every = config.rollout.log_prob_check_freq
    # A check step's log-probs come from a share of the samples (all of an agent's episodes: check_stride)
    checked = 1.0 if config.rollout.agent.loop != "single_turn" else 1.0 / check_stride(samples)
    with_log_probs = 1.0 if algorithm.rollout_log_probs else (checked / every if every else 0.0)
    slowdown = with_log_probs / cal["log_prob_decode_factor"] + (1 - with_log_probs)
    weight_bytes = 4 if config.model.dtype == "float32" else 2
    baseline = math.ceil(data.train_batch_size / engines)  # gen_baseline: one greedy sample per prompt
    critic_forward = (
        samples * critic.forward_flops(data.max_prompt_length, data.max_response_length) if critic is not None else 0.0
    )
    prices: dict[str, Callable[[], float]] = {  # each phase of the step's plan (rlkit.core.algos.phase_plan)
        "gen": lambda: (
            slowdown
            * generate_seconds(
                shape, per_engine, concurrent, data.max_prompt_length, data.max_response_length, weight_bytes, cal
            )
        ),
        "gen_baseline": lambda: generate_seconds(
            shape,
            baseline,
            min(baseline, config.rollout.max_num_seqs),
            data.max_prompt_length,
            data.max_response_length,
            weight_bytes,
            cal,
        ),
        "old_log_prob": lambda: reference,
        "ref": lambda: reference,
        "values": lambda: pass_seconds(critic_forward, whole, 1, "forward", world, cal),
        "adv": lambda: samples * cal["controller_s_per_sample"],
        "update_critic": lambda: pass_seconds(critic_forward, update_micro, 3, "update", world, cal),
        "update_actor": lambda: update,
        "sync": lambda: (
            cal["sync_s"] + 4 * shape.params / cal["sync_bytes_per_s"]
            if config.rollout.placement == "colocated"
            else 2 * shape.params / cal["split_sync_bytes_per_s"]
        ),
    }
    phases = {TIMING_KEYS.get(phase, phase): prices[phase]() for phase in phase_plan(algorithm).phases}
    if config.model.gradient_checkpointing:
        notes.append("gradient checkpointing: one more forward in the update")
    if lora:
        notes.append("LoRA: the backward computes no gradient for the frozen weights (one pass less)")
    return StepTime(phases, notes)


def run_cost(config: RLConfig, step_seconds: float, usd_per_gpu_hour: float | None) -> dict[str, float]:
    """Wall time, GPU-hours and (when a price is given) cost of trainer.total_steps steps."""
    devices = config.trainer.nnodes * config.trainer.n_gpus_per_node
    seconds = step_seconds * config.trainer.total_steps
    out = {"hours": seconds / 3600, "gpu_hours": seconds * devices / 3600, "devices": float(devices)}
    if usd_per_gpu_hour is not None:
        out["usd"] = out["gpu_hours"] * usd_per_gpu_hour
    return out
