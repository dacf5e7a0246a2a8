"""Predicted time per phase and per step, scaled from the measured H200 benchmark (docs/benchmarks.md).

Training passes take FLOPs / (devices x MFU x peak), with the MFU each pass reached in the
benchmark; generation takes generated tokens / the benchmark's decode rate, scaled by parameter
count (decoding reads every weight per token, so its speed goes as 1 / parameters); the weight
sync scales with the bytes moved. Responses are counted at data.max_response_length, so the
prediction is an upper bound for runs whose answers end early.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.core.planning.shape import ModelShape
from rlkit.recipes.schema import RLConfig

# The measured benchmark (docs/benchmarks.md, "Calibration of rlkit plan" mirrors this table):
# Qwen2.5-0.5B-shaped model, 64 prompts x 8 samples, 256 + 512 tokens, vLLM CUDA graphs, model.compile.
CALIBRATION = {
    "device": "NVIDIA H200",
    "params": 494_032_768,           # the benchmark model's parameters (tied embeddings once)
    "peak_flops": 800e12,            # bf16 matrix-multiply rate measured on the same GPUs (785-818 TFLOP/s)
    "mfu_forward_1gpu": 0.40,        # ref / old-log-prob passes: 39.7-41.2%
    "mfu_update_1gpu": 0.38,         # update: 36.6-40.0%
    "mfu_forward_2gpu": 0.25,        # 2 GPUs: ref 25.1%
    "mfu_update_2gpu": 0.31,         # 2 GPUs: update 31.0%
    "decode_tokens_per_s": 43_500,   # generated tokens/s of one engine inside a step (6.03 s for 262,144)
    "log_prob_decode_factor": 0.65,  # decode speed while the engine returns log-probs (0.6-0.7x)
    "sync_bytes_per_s": 9.4e9,       # colocated sync: 1.98 GB of fp32 tensors in ~0.21 s
    "split_sync_bytes_per_s": 0.25e9,  # split placement: 0.99 GB of bf16 through Ray's object store in 3.92 s
    "controller_s_per_sample": 0.19 / 512,  # reward + advantages + batch assembly: ~0.19 s for 512 responses
}


@dataclass
class StepTime:
    phases: dict[str, float]
    notes: list[str]

    @property
    def step(self) -> float:
        return sum(self.phases.values())


def mfu(kind: str, devices: int) -> float:
    """The benchmark's MFU for `kind` (forward/update): one GPU's, or two GPUs' for two or more."""
    return CALIBRATION[f"mfu_{kind}_{'1gpu' if devices == 1 else '2gpu'}"]


def step_time(config: RLConfig, shape: ModelShape, critic: ModelShape | None = None) -> StepTime:
    cal, data, world = CALIBRATION, config.data, config.world_size
    samples = data.train_batch_size * config.samples_per_prompt
    forward = samples * shape.forward_flops(data.max_prompt_length, data.max_response_length)
    peak = cal["peak_flops"] * world
    phases: dict[str, float] = {}
    notes = [f"calibrated on {cal['device']} (docs/benchmarks.md); responses at full length"]
    if world > 2:
        notes.append(f"{world} training devices: the 2-GPU MFU is assumed (measured on 1 and 2)")
    passes = (4 if config.model.gradient_checkpointing else 3) * config.actor.ppo_epochs
    if config.offline:  # objective sft: no generation, log-prob passes, weight sync or reward
        return StepTime({"update": passes * forward / (peak * mfu("update", world))}, notes)
    engines = world if config.rollout.placement == "colocated" else config.rollout.devices
    rate = cal["decode_tokens_per_s"] * cal["params"] / shape.params
    every = config.rollout.log_prob_check_freq
    with_log_probs = 1.0 if config.needs_rollout_log_probs else (1.0 / every if every else 0.0)
    slowdown = with_log_probs / cal["log_prob_decode_factor"] + (1 - with_log_probs)
    generated = samples * data.max_response_length
    phases["gen"] = generated / engines / rate * slowdown
    if config.algorithm.adv_estimator == "remax":
        phases["gen_baseline"] = data.train_batch_size * data.max_response_length / engines / rate
    if not config.old_log_probs_from_update:
        phases["old_log_prob"] = forward / (peak * mfu("forward", world))
    if config.needs_reference:
        phases["ref"] = forward / (peak * mfu("forward", world))
    if critic is not None:
        critic_forward = samples * critic.forward_flops(data.max_prompt_length, data.max_response_length)
        phases["values"] = critic_forward / (peak * mfu("forward", world))
        phases["update_critic"] = 3 * critic_forward / (peak * mfu("update", world))
    phases["update_actor"] = passes * forward / (peak * mfu("update", world))
    if config.rollout.placement == "colocated":
        phases["sync"] = 4 * shape.params / cal["sync_bytes_per_s"]
    else:
        phases["sync"] = 2 * shape.params / cal["split_sync_bytes_per_s"]
    phases["reward+adv"] = samples * cal["controller_s_per_sample"]
    if config.model.gradient_checkpointing:
        notes.append("gradient checkpointing: one more forward in the update")
    return StepTime(phases, notes)


def run_cost(config: RLConfig, step_seconds: float, usd_per_gpu_hour: float | None) -> dict[str, float]:
    """Wall time, GPU-hours and (when a price is given) cost of trainer.total_steps steps."""
    devices = config.trainer.nnodes * config.trainer.n_gpus_per_node
    seconds = step_seconds * config.trainer.total_steps
    out = {"hours": seconds / 3600, "gpu_hours": seconds * devices / 3600, "devices": float(devices)}
    if usd_per_gpu_hour is not None:
        out["usd"] = out["gpu_hours"] * usd_per_gpu_hour
    return out
