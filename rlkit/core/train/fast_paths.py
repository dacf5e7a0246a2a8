"""The settings the benchmark proves faster on GPUs, resolved from "auto" where the run starts.

docs/benchmarks.md measured one H200: compiled decoder layers lift the ref / old-log-prob /
update passes from 27-28% to ~40% MFU; vLLM with CUDA graphs decodes ~2x faster than eager;
micro-batches of 32k tokens instead of 16k. On CPU none of this helps (compile costs minutes on
2 cores, vLLM's CPU build has no CUDA graphs), so "auto" means: on with CUDA, off on CPU. Each
stays a switch: model.compile=false, rollout.vllm.enforce_eager=true, actor.micro_batch_tokens=N.

The micro-batch budget is sized from the GPU memory free once the models are loaded: what the
update will still allocate (fp32 gradients and AdamW moments of this rank's shard, a critic
beside it) and a reserve (the sleeping rollout engine's leftovers, FSDP's gathered layers, the
allocator's fragmentation) are taken off, and the rest is divided by an estimate of the
activation bytes one token costs in forward + backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlkit.recipes.actor_schema import CPU_MICRO_BATCH_TOKENS

if TYPE_CHECKING:
    from rlkit.recipes.actor_schema import ActorConfig
    from rlkit.recipes.model_schema import ModelConfig
    from rlkit.recipes.rollout_schema import RolloutConfig

MAX_AUTO_TOKENS = 65536  # beyond this a bigger micro-batch no longer speeds up the passes
TOKEN_GRANULE = 1024  # auto budgets are multiples of this
RESERVE_FRACTION = 0.10  # of the device's memory, plus RESERVE_BYTES, never planned for activations
RESERVE_BYTES = 2 << 30
GRAD_AND_ADAM_BYTES = 12  # per trainable fp32 parameter: gradient 4 + two AdamW moments 8
CRITIC_BYTES = 16  # per critic parameter: weights, gradient and AdamW moments, fp32


def compile_enabled(setting: bool | str, device_type: str) -> bool:
    """model.compile resolved: "auto" compiles on CUDA only."""
    return device_type == "cuda" if setting == "auto" else bool(setting)


def cuda_graphs_enabled(enforce_eager: bool | None, device_type: str) -> bool:
    """rollout.vllm.enforce_eager resolved the way the vLLM engine does: None = CUDA graphs on CUDA."""
    return device_type == "cuda" if enforce_eager is None else not enforce_eager


def activation_bytes_per_token(
    model_config: Any, dtype_bytes: int, gradient_checkpointing: bool, *, fused_head: bool = False
) -> int:
    """Bytes one token keeps alive from forward to backward (a generous estimate for a Llama/Qwen-style
    decoder), plus its share of the vocabulary head at a response position (logits and their gradient),
    which the fused head (`fused_head`, actor.fused_lm_head) never holds: its chunks are in the reserve.

    Per layer: the tensors autograd saves (norm inputs and outputs, the q/k/v/o projections'
    inputs and outputs, attention's output, the MLP's gate, up, activation and product) come to
    about 18 x hidden + 4 x intermediate + 6 x kv-width elements in the compute dtype, and the
    RMSNorms' fp32 copies to 16 x hidden bytes. With gradient checkpointing each layer keeps only
    its input, and one layer at a time is recomputed.
    """
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    hidden = int(text.hidden_size)
    intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv_width = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
    per_layer = dtype_bytes * (18 * hidden + 4 * intermediate + 6 * kv_width) + 16 * hidden
    layers = int(text.num_hidden_layers)
    body = layers * dtype_bytes * hidden + per_layer if gradient_checkpointing else layers * per_layer
    return body + (0 if fused_head else 2 * dtype_bytes * int(text.vocab_size))


def auto_micro_batch_tokens(
    *,
    free_bytes: int,
    total_bytes: int,
    trainable_params: int,
    critic_params: int,
    bytes_per_token: int,
    longest_sequence: int,
) -> int:
    """The token budget that fits what is left of `free_bytes` after the update's own allocations and a
    reserve: a multiple of TOKEN_GRANULE, at most MAX_AUTO_TOKENS, and never below one full-length
    sequence (a sequence always runs whole)."""
    reserve = int(RESERVE_FRACTION * total_bytes) + RESERVE_BYTES
    left = free_bytes - GRAD_AND_ADAM_BYTES * trainable_params - CRITIC_BYTES * critic_params - reserve
    tokens = min(MAX_AUTO_TOKENS, max(0, left) // bytes_per_token // TOKEN_GRANULE * TOKEN_GRANULE)
    return max(tokens, longest_sequence)


@dataclass
class FastPaths:
    """What a rank resolved, with the settings as configured; `describe` words it for the start-up log."""

    compile: bool
    cuda_graphs: bool | None  # None: the rollout engine is not vLLM, or there is none (sft, dpo)
    micro_batch_tokens: int
    settings: dict[str, str]  # model.compile, rollout.name, rollout.vllm.enforce_eager, actor.micro_batch_tokens
    free_gib: float | None = None  # the free memory an auto budget was sized from (GPU)

    def describe(self) -> str:
        engine = self.settings["rollout.name"]
        graphs = (
            (f"CUDA graphs n/a (rollout.name={engine})" if engine else "no rollout engine")
            if self.cuda_graphs is None
            else f"vLLM CUDA graphs {'on' if self.cuda_graphs else 'off'} (rollout.vllm.enforce_eager="
            f"{self.settings['rollout.vllm.enforce_eager']})"
        )
        budget = self.settings["actor.micro_batch_tokens"]
        sized = (
            f", sized from {self.free_gib:.0f} GiB free"
            if self.free_gib is not None
            else ", the CPU default"
            if budget == "auto"
            else ""
        )
        return (
            f"fast paths: torch.compile {'on' if self.compile else 'off'} (model.compile="
            f"{self.settings['model.compile']}), {graphs}, micro-batches of {self.micro_batch_tokens} tokens "
            f"(actor.micro_batch_tokens={budget}{sized})"
        )


def resolve(
    model: ModelConfig,
    rollout: RolloutConfig,
    actor: ActorConfig,
    device_type: str,
    *,
    sized: tuple[int, float] | None = None,
    with_engine: bool = True,
) -> FastPaths:
    """The fast paths of the model, rollout and actor sections on `device_type`; `sized` = (tokens, free GiB)
    when an auto budget was sized from a GPU's memory (auto_micro_batch_tokens); `with_engine=False` for a run
    that starts no rollout engine (sft, dpo), whose rollout section says nothing about it."""
    if actor.micro_batch_tokens != "auto":
        tokens = actor.micro_batch_tokens
    elif sized is None:
        tokens = CPU_MICRO_BATCH_TOKENS
    else:
        tokens = sized[0]
    eager = {None: "auto", True: "true", False: "false"}[rollout.vllm.enforce_eager]
    return FastPaths(
        compile=compile_enabled(model.compile, device_type),
        cuda_graphs=cuda_graphs_enabled(rollout.vllm.enforce_eager, device_type)
        if with_engine and rollout.name == "vllm"
        else None,
        micro_batch_tokens=tokens,
        settings={
            "model.compile": str(model.compile).lower(),
            "rollout.name": rollout.name if with_engine else "",
            "rollout.vllm.enforce_eager": eager,
            "actor.micro_batch_tokens": str(actor.micro_batch_tokens),
        },
        free_gib=sized[1] if sized and actor.micro_batch_tokens == "auto" else None,
    )
