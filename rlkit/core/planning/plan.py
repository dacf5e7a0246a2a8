"""`rlkit plan`: will a config fit on its devices, what to turn if not, and what it will cost.

Builds the memory of one training device per phase (rlkit.core.planning.memory), a verdict
against the device's memory less DEVICE_RESERVE, the knob that makes it fit (computed, not
guessed), and the predicted step time and cost (rlkit.core.planning.timing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.core import environment
from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.planning import memory, timing
from rlkit.core.planning.shape import ModelShape, model_shape
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.recipes.schema import RLConfig

GIB = memory.GIB
CALIBRATION_GPU_MIB = 143_771  # an H200 as nvidia-smi reports it: the device the time model was measured on


@dataclass
class Device:
    name: str
    bytes: float
    on_gpu: bool
    measured: bool  # read from this machine (else assumed)


@dataclass
class Plan:
    config: RLConfig
    shape: ModelShape
    device: Device
    memory: memory.DeviceMemory
    kv: dict[str, float] | None
    time: timing.StepTime
    fits: bool
    knobs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def usable(self) -> float:
        return self.device.bytes - (memory.DEVICE_RESERVE if self.device.on_gpu else 0)


def target_device(config: RLConfig, gpu_memory_gib: float | None) -> Device:
    """The device a run would train on: --gpu-memory-gib, this machine's first GPU, or its RAM per CPU worker."""
    if gpu_memory_gib is not None:
        return Device("GPU (--gpu-memory-gib)", gpu_memory_gib * GIB, True, False)
    gpus = environment.gpus()
    if gpus and config.trainer.device != "cpu":
        return Device(gpus[0].name, gpus[0].memory_mib * 2**20, True, True)
    if config.trainer.device == "cuda":
        name = f"{timing.CALIBRATION['device']} (assumed: no GPU here)"
        return Device(name, CALIBRATION_GPU_MIB * 2**20, True, False)
    workers = config.trainer.nnodes * config.trainer.n_gpus_per_node
    return Device(
        f"CPU worker (1/{workers} of this host's available memory)",
        environment.available_memory_bytes() / max(workers, 1),
        False,
        True,
    )


def build_plan(config: RLConfig, *, gpu_memory_gib: float | None = None) -> Plan:
    path = resolve_model_path(config.model.path)
    shape = model_shape(path)
    critic = model_shape(path, value_head=True) if Algorithm.from_config(config).critic else None
    reward = model_shape(resolve_model_path(config.reward_model.path)) if config.reward_model.path else None
    device = target_device(config, gpu_memory_gib)
    mem = memory.training_device(config, shape, device.bytes, on_gpu=device.on_gpu, critic=critic, reward_model=reward)
    kv = (
        memory.kv_cache(config, shape, device.bytes, device.on_gpu)
        if config.rollout.name == "vllm" and not config.offline
        else None
    )
    time = timing.step_time(
        config,
        shape,
        critic,
        micro_batch_tokens=mem.micro_batch_tokens,
        kv_tokens=kv["tokens"] if kv and device.on_gpu else None,
    )
    plan = Plan(config, shape, device, mem, kv, time, fits=False)
    plan.fits = mem.peak <= plan.usable
    if not plan.fits:
        plan.knobs = knobs(plan, critic, reward)
    plan.warnings = engine_warnings(plan)
    return plan


def knobs(plan: Plan, critic: ModelShape | None, reward: ModelShape | None) -> list[str]:
    """Settings that bring the peak under the device's memory, most direct first."""
    config, usable, mem = plan.config, plan.usable, plan.memory
    found = []

    def fits_with(**changes: dict) -> bool:
        changed = config.model_copy(
            update={section: getattr(config, section).model_copy(update=values) for section, values in changes.items()}
        )
        return (
            memory.training_device(
                changed, plan.shape, plan.device.bytes, on_gpu=plan.device.on_gpu, critic=critic, reward_model=reward
            ).phases[mem.peak_phase]
            <= usable
        )

    if mem.peak_phase in ("generate", "sync"):  # both hold the engine's whole share
        state = mem.phases[mem.peak_phase] - memory.engine_bytes(
            config, plan.shape, plan.device.bytes, plan.device.on_gpu
        )
        share = (usable - state) / plan.device.bytes
        if share > 0.05:
            now = config.rollout.gpu_memory_utilization
            found.append(f"rollout.gpu_memory_utilization={share - 0.01:.2f} (now {now:g})")
    if mem.peak_phase == "update":
        if not config.model.gradient_checkpointing and fits_with(model={"gradient_checkpointing": True}):
            found.append("model.gradient_checkpointing=true")
        budget = config.actor.micro_batch_tokens
        while budget > 256 and not fits_with(actor={"micro_batch_tokens": budget}):
            budget //= 2
        if budget < config.actor.micro_batch_tokens and fits_with(actor={"micro_batch_tokens": budget}):
            found.append(f"actor.micro_batch_tokens={budget} (now {config.actor.micro_batch_tokens})")
    for per_node in (2, 4, 8):
        if per_node > config.trainer.n_gpus_per_node and fits_with(trainer={"n_gpus_per_node": per_node}):
            found.append(f"trainer.n_gpus_per_node={per_node} (the model state shards over more devices)")
            break
    return found or ["a larger device, or a smaller model: no single setting here is enough"]


def engine_warnings(plan: Plan) -> list[str]:
    kv, config = plan.kv, plan.config
    if kv is None or not plan.device.on_gpu:
        return []
    if kv["bytes"] <= 0:
        return [
            f"vLLM's share (rollout.gpu_memory_utilization={config.rollout.gpu_memory_utilization:g}) does not "
            f"hold its {kv['weights'] / GIB:.1f} GiB of weights plus ~{memory.VLLM_OVERHEAD / GIB:.0f} GiB of "
            "working memory: its start fails; raise rollout.gpu_memory_utilization"
        ]
    if kv["tokens"] < kv["wanted_tokens"]:
        held = int(kv["tokens"] // (config.data.max_prompt_length + config.data.max_response_length))
        return [
            f"the KV cache holds ~{int(kv['tokens']):,} tokens: {held} of the {int(kv['sequences'])} sequences "
            "each engine decodes at once fit at full length, the rest wait (slower, not an error); raise "
            "rollout.gpu_memory_utilization or lower rollout.max_num_seqs"
        ]
    return []


def checkpoint_bytes(config: RLConfig) -> int | None:
    """Disk for the run's checkpoints (trainer.keep_last + the one being written): fp32 weights and AdamW
    moments, 12 bytes a parameter, plus the critic's; None when the model's config cannot be read here."""
    try:
        path = resolve_model_path(config.model.path) if config.model.path else None
        if path is None:
            return None
        params = model_shape(path).params
        if Algorithm.from_config(config).critic:
            params += model_shape(path, value_head=True).params
    except Exception:  # noqa: BLE001 - a disk estimate must not fail doctor
        return None
    return 12 * params * (config.trainer.keep_last + 1)
