"""An FSDP2-sharded transformers model and the passes the workers run on it.

Every rank holds 1/world of each parameter (DTensor shards, fp32: the master weights and
the optimizer state stay fp32); forward all-gathers a layer at a time and casts it to the
compute dtype. Models run on packed sequences (rlkit.core.train.packing), attention through
rlkit.core.train.packed_attention.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlkit.core.train import logprobs, packed_attention, packed_layout
from rlkit.core.train.compiled import compiled
from rlkit.core.train.packing import PackedBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Config keys of models that change their logits after the head (Gemma 2/3, Cohere, Granite): the fused head,
# which replaces the head and everything after it, would leave that out.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def compute_dtype(setting: str, device: torch.device) -> str:
    """model.dtype resolved: 'auto' is bfloat16 on GPU (tensor cores) and float32 on CPU."""
    if setting != "auto":
        return setting
    return "bfloat16" if device.type == "cuda" else "float32"


def load_model(path: str, *, value_head: bool = False, gradient_checkpointing: bool = False) -> torch.nn.Module:
    """The transformers model at `path` in fp32 (the master weights), on the CPU, not sharded yet.

    A value head (`value_head=True`, for a critic) is the same trunk with a 1-output head on
    every token; no dropout (transformers' default is 0.1).
    """
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForTokenClassification,
    )

    attention = packed_attention.register()
    if value_head:
        config = AutoConfig.from_pretrained(path, num_labels=1, classifier_dropout=0.0)
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch.float32, attn_implementation=attention
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attention)
    packed_layout.convert(model)  # before LoRA and sharding: q/k/v stay [tokens, heads, dim] on a packed row
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def shard_model(
    model: torch.nn.Module, *, device: torch.device, compute_dtype: str, compile: bool = False
) -> torch.nn.Module:
    """Shard each decoder layer and the root over all ranks (fully_shard, in place); returns `model`.

    With one rank nothing is sharded, so layers keep their compute-dtype copy from forward
    to backward instead of casting it again (reshard_after_forward=False).
    """
    model.to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[compute_dtype], reduce_dtype=torch.float32)
    reshard = dist.get_world_size() > 1
    if compile:  # one code object serves every layer of actor and reference, in several modes
        torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
        packed_attention.prepare(model.config, device, DTYPES[compute_dtype])  # the kernel's checks before a trace
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        if compile:  # the layer's forward only: FSDP's hooks stay eager, parameter names unchanged
            layer.forward = compiled(layer.forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    if compile:
        logprobs.use_compiled_kernels()
    return model


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    if hasattr(model, "get_base_model"):  # a peft model (LoRA): the layers of the model it wraps
        model = model.get_base_model()
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: expected a decoder stack at model.layers")
    return list(layers)


def full_state_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) per parameter; gathers one at a time (a collective on every rank)."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def shard_numels(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """name -> (elements held on this rank, elements of the full parameter)."""
    out = {}
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        out[name] = (local.numel(), param.numel())
    return out


def packed_outputs(model: torch.nn.Module, packed: PackedBatch) -> torch.Tensor:
    """The model's outputs at the positions that predict response tokens: [K, V] logits ([K, 1] for a value head).

    The model must use the packed attention (`attn_implementation=packed_attention.NAME`).
    A causal LM computes its head only at those positions (`logits_to_keep`), which skips
    the vocabulary projection of every prompt token.
    """
    boundaries = dict(
        cu_seq_lens_q=packed.cu_seq_lens,
        cu_seq_lens_k=packed.cu_seq_lens,
        max_length_q=packed.max_len,
        max_length_k=packed.max_len,
    )
    if hasattr(model, "lm_head"):
        out = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=packed.predict_index,
            **boundaries,
        )
        # squeeze, not [0]: a view's backward is a view, where select's fills a [1, K, V] gradient with zeros and
        # copies into it (0.08 s of an H100's 3.7 s update, 2026-12-07's profile)
        return out.logits.squeeze(0)
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, **boundaries)
    return out.logits[0, packed.predict_index]


def packed_log_probs(
    model: torch.nn.Module,
    packed: PackedBatch,
    *,
    temperature: float,
    with_entropy: bool,
    fused_head: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(response token) and entropy (zeros unless `with_entropy`), [K] each in fp32, under a causal LM.
    The entropy comes back detached unless `entropy_grad` (a loss with an entropy term): backward then adds no
    entropy term.

    `fused_head` (actor.fused_lm_head): the head's projection and the log-softmax in one chunked pass
    (logprobs.linear_selected_log_probs) instead of the head's [K, V] logits. It runs in the head's place,
    inside the model's forward, where FSDP2 has gathered the head's weight (a root parameter); FSDP2's
    backward hook on the model's output then gathers it again before this pass's backward needs it, as it
    does for the plain head.
    """
    if not fused_head:
        logits = packed_outputs(model, packed)
        log_probs, entropy = logprobs.selected_log_probs(logits, packed.targets, temperature, with_entropy=with_entropy)
        return log_probs, entropy if entropy_grad else entropy.detach()
    head = model.lm_head

    def stats_in_place_of_logits(hidden: torch.Tensor) -> torch.Tensor:
        log_probs, entropy = logprobs.linear_selected_log_probs(
            hidden.squeeze(0), head.weight, packed.targets, temperature, with_entropy
        )
        # [1, K, 2] where the logits were [1, K, V]. An entropy the loss does not differentiate is detached
        # first: the stack's backward would hand it a gradient of zeros, and backward would compute its term.
        return torch.stack([log_probs, entropy if entropy_grad else entropy.detach()], dim=-1)[None]

    head.forward = stats_in_place_of_logits
    try:
        stats = packed_outputs(model, packed)
    finally:
        del head.forward
    return stats[:, 0], stats[:, 1] if entropy_grad else stats[:, 1].detach()


def fused_head_problem(model: torch.nn.Module) -> str | None:
    """Why `packed_log_probs(..., fused_head=True)` would not compute what `model` computes, or None."""
    head = getattr(model, "lm_head", None)
    if type(head) is not torch.nn.Linear:
        kind = f"{type(head).__module__}.{type(head).__qualname__}"
        return f"its output head is a {kind}, not a plain torch.nn.Linear (LoRA on lm_head?)"
    if head.bias is not None:
        return "its output head has a bias"
    text = model.config.get_text_config()
    changed = [f"{key}={getattr(text, key)}" for key in LOGIT_TRANSFORMS if getattr(text, key, None) not in (None, 1)]
    return f"it changes its logits after the head ({', '.join(changed)})" if changed else None


def lr_lambda(warmup: int, total: int, schedule: str):
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor
