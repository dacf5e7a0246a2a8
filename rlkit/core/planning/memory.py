"""Memory of one training device, per phase, for a config: what `rlkit plan` adds up.

What lives on a training device (FSDP2 over W = config.world_size ranks):
  state        actor fp32 weights, gradients and AdamW moments (16 bytes a parameter / W), the
               reference's fp32 weights (4 / W), the critic's state (16 / W of its parameters);
               with LoRA the frozen fp32 base (4 / W), which is also the reference, and 16 bytes
               per adapter parameter
  compute copy the compute-dtype copy FSDP2 gathers: the whole model with one rank (kept from
               forward to backward; the reference, which has no backward, keeps it), two
               layers and the root with more
  activations  what one update micro-batch of T tokens saves for backward (per-token bytes
               measured on the packed Qwen2-style path: ACTIVATION_BYTES; tests/test_plan.py
               re-measures them), with checkpointing each layer's input plus one layer recomputed
  logits       the head's output at the K response positions, kept for backward, its gradient,
               and the fp32 log-prob chunks (rlkit.core.train.logprobs); with actor.fused_lm_head
               one chunk of logits and the head weight's fp32 gradient sum instead
  vLLM         colocated: rollout.gpu_memory_utilization of the device while generating; asleep
               (weights and KV cache freed: the sync reloads the weights) while training; during the
               sync its whole share (measured: waking only its weights did not lower the peak)
Peaks: generate = state + vLLM share; update = state + compute copy + activations + logits;
sync = state + vLLM share + one gathered fp32 tensor. PyTorch's cached blocks are handed back
before the engine wakes (Generator.wake_engine, rlkit.core.rollout.generator), so the update's
activations are not in the generate or sync peaks.

What is resident and which peaks a step reaches are read from the step's phases: the RL step's plan
(rlkit.core.algos.phase_plan, the phases rlkit.core.planning.timing prices), or an sft / dpo step's.
The reference's weights are there when the plan has `ref`, the critic's when it has `update_critic`;
each phase names the peak it reaches in PEAK_OF_PHASE, and a phase missing there fails the plan
(KeyError) until it is priced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.phase_plan import phase_plan
from rlkit.core.planning.shape import ModelShape
from rlkit.core.train import fast_paths
from rlkit.core.train.logprobs import CHUNK_ELEMENTS
from rlkit.recipes.schema import RLConfig

GIB = 2**30
DEVICE_RESERVE = int(1.5 * GIB)  # CUDA context, NCCL buffers, allocator slack: never available to rlkit
VLLM_OVERHEAD = 1 * GIB  # vLLM's profiling activations and CUDA graphs inside its share (approximate)
CPU_KV_CACHE = 1 * GIB  # VLLM_CPU_KVCACHE_SPACE, which rlkit sets for its CPU workers

# The memory peak each phase of a step reaches on a training device. None: the phase has no peak of its
# own, below the update's: a log-prob or value pass (old_log_prob, ref, values) runs forward only and saves
# nothing for backward; the critic's update is the actor's without the vocabulary's logits (its head has one
# output); adv is the controller's arithmetic. generate and sync are the engine's: on a training device only
# when it is colocated.
PEAK_OF_PHASE: dict[str, str | None] = {
    "gen": "generate",
    "gen_baseline": "generate",
    "old_log_prob": None,
    "ref": None,
    "values": None,
    "adv": None,
    "update_critic": None,
    "update_actor": "update",
    "sync": "sync",
}
PEAKS = ("update", "generate", "sync")  # the order `rlkit plan` lists them
ENGINE_PEAKS = ("generate", "sync")


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes saved for backward per token: per decoder layer a*hidden + b*intermediate + c*heads + d;
    outside the layers e*hidden + f*head_dim (rotary tables) + g, and h*hidden per response token (head input)."""

    hidden: float
    intermediate: float
    heads: float
    const: float
    root_hidden: float
    root_head_dim: float
    root_const: float
    response_hidden: float
    checkpointed_hidden: float  # per layer with gradient checkpointing: the layer's input


# Measured with saved-tensor hooks on the tiny Qwen2 (hidden 128-256, intermediate 256-512, 2-8 layers,
# 1-4 KV heads), fp32 and bf16 compute: RMSNorm's fp32 upcast makes bf16 more than half of fp32.
ACTIVATION_BYTES = {
    4: ActivationBytes(
        hidden=44,
        intermediate=16,
        heads=4,
        const=8,
        root_hidden=8,
        root_head_dim=8,
        root_const=21,
        response_hidden=4,
        checkpointed_hidden=4,
    ),
    2: ActivationBytes(
        hidden=26,
        intermediate=8,
        heads=4,
        const=8,
        root_hidden=6,
        root_head_dim=4,
        root_const=21,
        response_hidden=2,
        checkpointed_hidden=2,
    ),
}


@dataclass
class MicroBatch:
    tokens: int  # T: real tokens of one update micro-batch on one device (worst case: full lengths)
    response_tokens: int  # K: the positions that predict a response token


@dataclass
class DeviceMemory:
    """Bytes on one training device: named parts, and the peaks (update, generate, sync) built from them."""

    parts: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    micro_batch_tokens: int = 0  # the update micro-batch's token budget (the time model counts micro-batches)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def peak(self) -> float:
        return self.phases[self.peak_phase]


def step_phases(config: RLConfig, algorithm: Algorithm) -> tuple[str, ...]:
    """The phases of one step: the RL step's plan, or an sft / dpo step's (dpo: the reference's log-probs,
    then the update; neither generates nor syncs)."""
    if config.offline:
        return (*(["ref"] if algorithm.reference else []), "update_actor")
    return phase_plan(algorithm).phases


def compute_bytes(config: RLConfig, on_gpu: bool) -> int:
    dtype = config.model.dtype
    return 2 if dtype == "bfloat16" or (dtype == "auto" and on_gpu) else 4


def micro_batch(config: RLConfig, budget: int, world_size: int | None = None) -> MicroBatch:
    """The largest update micro-batch a device packs: its share of a mini-batch, capped by the token budget."""
    data, world = config.data, world_size or config.world_size
    sequence = data.max_prompt_length + data.max_response_length
    share = config.actor.mini_batch_size * config.samples_per_prompt * sequence // world
    tokens = min(share, max(budget, sequence * config.micro_batch_group))  # a dpo pair runs whole
    return MicroBatch(tokens, tokens * data.max_response_length // sequence)


def token_budget(
    config: RLConfig,
    shape: ModelShape,
    device_bytes: float,
    *,
    on_gpu: bool,
    loaded_bytes: float,
    trainable_params: float,
    critic_params: float,
) -> int:
    """actor.micro_batch_tokens, with "auto" sized as a GPU worker sizes it at start-up
    (rlkit.core.train.fast_paths): from the memory left once its models are loaded, before the
    engine starts (it sleeps during the update)."""
    budget = config.actor.micro_batch_tokens
    if budget != "auto":
        return budget
    if not on_gpu:
        return fast_paths.CPU_MICRO_BATCH_TOKENS
    dims = SimpleNamespace(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        head_dim=shape.head_dim,
        num_key_value_heads=shape.kv_heads,
        num_hidden_layers=shape.layers,
        vocab_size=shape.vocab,
    )
    per_token = fast_paths.activation_bytes_per_token(
        dims, compute_bytes(config, on_gpu), config.model.gradient_checkpointing, fused_head=config.actor.fused_lm_head
    )
    return fast_paths.auto_micro_batch_tokens(
        free_bytes=int(device_bytes - DEVICE_RESERVE - loaded_bytes),
        total_bytes=int(device_bytes),
        trainable_params=int(trainable_params),
        critic_params=int(critic_params),
        bytes_per_token=per_token,
        longest_sequence=(config.data.max_prompt_length + config.data.max_response_length) * config.micro_batch_group,
    )


def activation_bytes(shape: ModelShape, batch: MicroBatch, compute: int, checkpointing: bool) -> dict[str, float]:
    """What one micro-batch's forward saves for backward (without the logits) and, with checkpointing,
    the one layer whose activations are recomputed at a time in backward."""
    c = ACTIVATION_BYTES[compute]
    layer = c.hidden * shape.hidden + c.intermediate * shape.intermediate + c.heads * shape.heads + c.const
    root = c.root_hidden * shape.hidden + c.root_const
    rotary = c.root_head_dim * shape.head_dim
    head_input = batch.response_tokens * c.response_hidden * shape.hidden
    if not checkpointing:
        return {"saved": batch.tokens * (shape.layers * layer + root + rotary) + head_input, "recomputed": 0.0}
    saved = batch.tokens * (shape.layers * c.checkpointed_hidden * shape.hidden + root) + head_input
    return {"saved": saved, "recomputed": batch.tokens * (layer + rotary)}


def logits_bytes(shape: ModelShape, batch: MicroBatch, compute: int, *, fused: bool = False) -> dict[str, float]:
    """The head's logits kept for backward (with fp32 log-sum-exp and entropy), their gradient, and the
    fp32 chunk buffers the log-prob kernel works in (two of them in backward). `fused` (actor.fused_lm_head):
    no logits, one chunk of them at a time instead, and the head weight's gradient summed in fp32 beside the
    compute-dtype product of a chunk (counted with LoRA too, where the head is frozen: a small overestimate)."""
    k, v = batch.response_tokens, shape.vocab
    chunk = min(k, max(1, CHUNK_ELEMENTS // v))
    if fused:
        return {
            "fused head chunks": chunk * v * (compute + 2 * 4) + 8 * k,
            "head weight gradient, summed in fp32": v * shape.hidden * (4 + compute),
        }
    return {"logits": k * v * compute + 8 * k, "logits gradient": k * v * compute, "log-prob chunks": 2 * chunk * v * 4}


def training_device(
    config: RLConfig,
    shape: ModelShape,
    device_bytes: float,
    *,
    on_gpu: bool,
    critic: ModelShape | None = None,
    reward_model: ModelShape | None = None,
) -> DeviceMemory:
    """Every part on one training device and the peaks its step's phases reach (update, generate, sync).
    `critic`: the value model's shape, which a step with a critic needs."""
    world, compute = config.world_size, compute_bytes(config, on_gpu)
    phases = step_phases(config, Algorithm.from_config(config))
    peaks = {PEAK_OF_PHASE[phase] for phase in phases}
    if config.rollout.placement != "colocated":  # the engine generates on its own devices
        peaks -= set(ENGINE_PEAKS)
    if "update_critic" in phases and critic is None:
        raise ValueError("the step updates a critic: pass its shape (critic=)")
    critic = critic if "update_critic" in phases else None
    mem = DeviceMemory()
    parts = mem.parts
    lora = config.model.lora
    if lora.rank:  # the base is frozen and is also the reference (adapters off): no second model
        adapters = shape.lora_params(lora.rank, lora.target_modules)
        parts["base weights (fp32, frozen; also the reference)"] = 4 * shape.params / world
        parts[f"LoRA adapters, gradients, AdamW (fp32, {adapters / 1e6:.1f}M)"] = 16 * adapters / world
    else:
        parts["actor weights (fp32)"] = 4 * shape.params / world
        parts["actor gradients (fp32)"] = 4 * shape.params / world
        parts["AdamW moments (fp32)"] = 8 * shape.params / world
    separate_reference = "ref" in phases and not lora.rank
    if separate_reference:
        parts["reference weights (fp32)"] = 4 * shape.params / world
    if critic is not None:
        parts["critic weights, gradients, AdamW"] = 16 * critic.params / world
    if reward_model is not None:
        parts["reward model (fp32)"] = 4 * reward_model.params
    dtype = "bf16" if compute == 2 else "fp32"
    if world == 1 and separate_reference:
        # One rank keeps a module's gathered copy until its backward, which the reference never runs.
        parts[f"reference compute copy ({dtype}, kept with one rank)"] = shape.params * compute
    state = sum(parts.values())
    # One rank gathers the whole model once (a copy, fp32 compute too); more ranks a layer or two at a time.
    copy = shape.params * compute if world == 1 else (2 * shape.layer_params + shape.root_params) * compute
    # What a worker holds when it sizes an auto budget, before its engine starts: the fp32 policy (or frozen
    # base), the reference, the reward model. The critic and the update's own state are terms of the sizing.
    loaded = 4 * shape.params / world * (2 if separate_reference else 1) + (
        4 * reward_model.params if reward_model is not None else 0
    )
    trainable = shape.lora_params(lora.rank, lora.target_modules) if lora.rank else shape.params
    batch = micro_batch(
        config,
        token_budget(
            config,
            shape,
            device_bytes,
            on_gpu=on_gpu,
            loaded_bytes=loaded,
            trainable_params=trainable / world,
            critic_params=critic.params / world if critic else 0,
        ),
    )
    mem.micro_batch_tokens = batch.tokens
    parts[f"actor compute copy ({dtype})"] = copy
    activations = activation_bytes(shape, batch, compute, config.model.gradient_checkpointing)
    parts[f"activations ({batch.tokens} tokens{', checkpointed' if config.model.gradient_checkpointing else ''})"] = (
        activations["saved"]
    )
    if activations["recomputed"]:
        parts["one layer recomputed in backward"] = activations["recomputed"]
    head = logits_bytes(shape, batch, compute, fused=config.actor.fused_lm_head)
    parts.update({f"{k} ({batch.response_tokens} response tokens)": b for k, b in head.items()})
    engine = 0.0
    if peaks & set(ENGINE_PEAKS):
        engine = engine_bytes(config, shape, device_bytes, on_gpu)
        parts["vLLM share while generating" if on_gpu else "rollout engine (CPU: weights + KV cache)"] = engine
        mem.notes.append("vLLM sleeps while training (weights and KV cache freed, reloaded at the sync): ~0 in update")
    largest = max(shape.vocab, shape.intermediate) * shape.hidden * 4  # one gathered fp32 tensor
    price = {
        "update": lambda: state + copy + sum(activations.values()) + sum(head.values()),
        "generate": lambda: state + engine,
        # The sync wakes only the engine's weights, yet on an H200 (vLLM 0.26) its peak was the
        # generate phase's: the engine's whole share is counted (docs/benchmarks.md, calibration).
        "sync": lambda: state + max(engine, shape.params * compute) + largest,
    }
    mem.phases = {peak: price[peak]() for peak in PEAKS if peak in peaks}
    return mem


def engine_bytes(config: RLConfig, shape: ModelShape, device_bytes: float, on_gpu: bool) -> float:
    """What the engine holds while generating: its share of the GPU, or on CPU its weights and KV space."""
    if on_gpu and config.rollout.name == "vllm":
        return config.rollout.gpu_memory_utilization * device_bytes
    weights = shape.params * compute_bytes(config, on_gpu)
    if config.rollout.name != "vllm":
        return weights
    return config.rollout.vllm.replicas * (weights + CPU_KV_CACHE)  # each replica its weights and KV space


def kv_cache(config: RLConfig, shape: ModelShape, device_bytes: float, on_gpu: bool) -> dict[str, float]:
    """vLLM's KV cache on one device: bytes, tokens it holds, and tokens a full batch of sequences needs.
    Replicas (rollout.vllm.replicas) split the device's share, each holding its own copy of the weights."""
    c = compute_bytes(config, on_gpu)  # the engine runs in the compute dtype
    replicas = config.rollout.vllm.replicas
    weights = shape.params * c
    share = config.rollout.gpu_memory_utilization * device_bytes
    space = (share - replicas * (weights + VLLM_OVERHEAD)) if on_gpu else replicas * CPU_KV_CACHE
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * c
    engines = config.world_size if config.rollout.placement == "colocated" else config.rollout.devices
    per_device = -(-config.data.train_batch_size * config.rollout.n // engines)
    sequences = min(replicas * config.rollout.max_num_seqs, per_device)
    wanted = sequences * (config.data.max_prompt_length + config.data.max_response_length)
    return {
        "bytes": space,
        "weights": weights,
        "tokens": max(space, 0) / per_token,
        "wanted_tokens": float(wanted),
        "sequences": float(sequences),
    }
