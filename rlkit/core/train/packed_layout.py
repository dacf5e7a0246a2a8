"""Llama-family attention kept in the packed layout, [tokens, heads, head_dim], from the projections to the kernel.

transformers' Llama, Qwen2 and Qwen3 attention views each projection as [batch, tokens, heads, head_dim], transposes
it to [batch, heads, tokens, head_dim] for the rotary embedding and SDPA, and rlkit's packed attention
(rlkit.core.train.packed_attention) transposes it back for the variable-length kernel. The rotary embedding then runs
on a transposed view: in an H100's profile of the 0.5B update its compiled kernels took 0.23 ms forward and 0.21 ms
backward a layer and micro-batch (~0.4 TB/s, 0.19 s of the update), and one layer compiled with the rotation in the
projection's own layout spent ~0.19 ms less on the device (docs/benchmarks.md, 2026-12-07 07:09).

`convert` makes each such attention module (`SUPPORTED`: Llama, Mistral, Qwen2, Qwen3) a subclass whose forward
does the same operations in that layout: the projections viewed as [tokens, heads, head_dim], Qwen3's per-head norms,
`q * cos + rotate_half(q) * sin`
with cos/sin as [tokens, 1, head_dim], the packed attention, the output projection. Each value is computed by the same
operation on the same operands as transformers' forward, so eager results are identical; a call that is not one packed
row (no sequence boundaries, a batch, a KV cache) runs the module's own forward. Applied where the model loads, before
LoRA (whose adapters replace the projections in place, so this forward calls them) and FSDP.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.core.train import packed_attention

# transformers' attention classes whose forward is the projections, (per-head norms,) the standard rotary embedding,
# the attention interface and the output projection: checked by module and name, so a subclass with its own forward
# (a model that changes the rotation) keeps it
SUPPORTED = {
    "transformers.models.llama.modeling_llama": "LlamaAttention",
    "transformers.models.mistral.modeling_mistral": "MistralAttention",  # Llama's, with its config's sliding window
    "transformers.models.qwen2.modeling_qwen2": "Qwen2Attention",
    "transformers.models.qwen3.modeling_qwen3": "Qwen3Attention",
}


def supported(module: torch.nn.Module) -> bool:
    return SUPPORTED.get(type(module).__module__) == type(module).__name__


def convert(model: torch.nn.Module) -> int:
    """Make every supported attention module of `model` its class's packed-layout subclass; returns how many.
    A subclass, not a patched instance: copies and `repr` keep it, parameters and their names are unchanged."""
    count = 0
    for module in model.modules():
        if supported(module):
            module.__class__ = packed_class(type(module), module.head_dim)
            count += 1
    return count


_packed_classes: dict[tuple[type, int], type] = {}
# packed class -> the head_dim of its modules. Read from here, not from the module: dynamo makes an int attribute of a
# module under FSDP2 a symbolic input of the compiled layer (with dynamic shapes), and a symbolic head_dim made each
# index of the rotary embedding's kernels a 64-bit division by it at run time: 0.10 ms a layer and micro-batch forward
# (and as long backward) where moving the bytes takes 0.03 (an H100, 2026-12-07). A global's ints are specialized.
_head_dims: dict[type, int] = {}


def packed_class(base: type, head_dim: int) -> type:
    """`base` with `packed_forward` as its forward, for modules of `head_dim` (one subclass per class and head_dim)."""
    if (base, head_dim) not in _packed_classes:
        packed = type(f"Packed{base.__name__}", (base,), {"forward": packed_forward, "__module__": __name__})
        _packed_classes[base, head_dim] = packed
        _head_dims[packed] = head_dim
    return _packed_classes[base, head_dim]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The last dimension's halves (a, b) as (-b, a), as transformers' Llama family rotates them."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def packed_forward(
    module: torch.nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """hidden [1, T, hidden] of one packed row -> (attention output [1, T, hidden], None), as the module's own
    forward computes it with rlkit's packed attention."""
    if kwargs.get("cu_seq_lens_q") is None or hidden_states.shape[0] != 1 or past_key_values is not None:
        own_forward = super(type(module), module).forward
        return own_forward(hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    tokens = hidden_states.shape[1]
    shape = (tokens, -1, _head_dims[type(module)])
    query = module.q_proj(hidden_states).view(shape)
    key = module.k_proj(hidden_states).view(shape)
    value = module.v_proj(hidden_states).view(shape)
    if hasattr(module, "q_norm"):  # Qwen3: RMSNorm over each head's dimension, before the rotation
        query, key = module.q_norm(query), module.k_norm(key)
    cos, sin = (t.squeeze(0).unsqueeze(1) for t in position_embeddings)  # [1, T, D] -> [T, 1, D]
    query = query * cos + rotate_half(query) * sin
    key = key * cos + rotate_half(key) * sin
    out = packed_attention.attend(
        query, key, value, kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"]), module.scaling, _window(module)
    )
    return module.o_proj(out.reshape(1, tokens, -1)), None


def _window(module: torch.nn.Module) -> int | None:
    """The layer's sliding window, refused where a sequence is longer (packed_attention.check_window): Qwen2/3's
    sliding layers carry `sliding_window` (None on the others), Mistral passes its config's on every layer, Llama has
    none."""
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    return getattr(module.config, "sliding_window", None)
