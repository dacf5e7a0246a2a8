"""Causal attention over packed sequences, registered with transformers as 'rlkit_varlen'.

transformers builds no mask for an attention implementation it does not know, and passes
the model's extra forward keywords down to it; rlkit passes the packed batch's boundaries
(`cu_seq_lens_q`, `max_length_q`). On CUDA the boundaries go to PyTorch's variable-length
flash-attention kernel (`torch.nn.attention.varlen.varlen_attn`); elsewhere, or where
that kernel is missing or fails its first self-check, the sequences are laid out as a padded
batch for one causal `scaled_dot_product_attention` call (one call per sequence when that
batch would be too large). All attend only within a sequence.
"""

from __future__ import annotations

import inspect
import logging

import torch
import torch.nn.functional as F

NAME = "rlkit_varlen"
logger = logging.getLogger(__name__)
_kernel_ok: dict[torch.device, bool] = {}
# The padded batch's attention scores (sequences x heads x longest^2, fp32) above this take one call per sequence:
# padding a few long sequences' batch to their length would cost more than the loop.
PADDED_SCORES_MAX_BYTES = 256 << 20


def register() -> str:
    """Make `attn_implementation='rlkit_varlen'` available to transformers models; returns the name.

    Here, not at import, `_attend` is kept out of compiled graphs (data-dependent boundaries and a
    one-time check): torch.compiler.disable imports torch._dynamo (~0.5 s), which the controller,
    importing this module through the worker classes, never uses.
    """
    global _attend
    from transformers import AttentionInterface

    if not getattr(_attend, "_torchdynamo_disable", False):
        _attend = torch.compiler.disable(_attend)
    AttentionInterface.register(NAME, packed_attention_forward)
    return NAME


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> [1, T, H, D] (transformers' layout).

    Without boundaries (an unpacked call, e.g. a debugging forward over unpadded rows) each
    row is one causal sequence; padded rows must be packed instead, as no mask is applied.
    """
    groups = query.shape[1] // key.shape[1]
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        out = F.scaled_dot_product_attention(
            query,
            key.repeat_interleave(groups, dim=1),
            value.repeat_interleave(groups, dim=1),
            is_causal=True,
            scale=scaling,
        )
        return out.transpose(1, 2), None
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} expects one packed row, got a batch of {query.shape[0]}")
    max_len = int(kwargs["max_length_q"])
    q = query[0].transpose(0, 1).contiguous()  # [T, H, D]
    k = key[0].transpose(0, 1).repeat_interleave(groups, dim=1)
    v = value[0].transpose(0, 1).repeat_interleave(groups, dim=1)
    out = _attend(q, k, v, cu_seq_lens, max_len, scaling)
    return out.unsqueeze(0), None


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_lens: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    if q.is_cuda and _kernel_usable(q):
        return _varlen_kernel(q, k, v, cu_seq_lens, max_len, scale)
    if (len(cu_seq_lens) - 1) * q.shape[1] * max_len * max_len * 4 <= PADDED_SCORES_MAX_BYTES:
        return padded_attention(q, k, v, cu_seq_lens, max_len, scale)
    return per_sequence_attention(q, k, v, cu_seq_lens, scale)


def padded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_lens: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    """One causal SDPA call over the sequences laid out as a batch [sequences, H, max_len, D], each padded at
    its end. q/k/v [T, H, D] -> [T, H, D]. Causality keeps every real query from seeing the padding after it,
    so each sequence's rows are its own attention; the padding's rows are dropped. On a CPU a packed step of
    128 short sequences ran ~25x faster than one call per sequence (the loop's autograd nodes dominate)."""
    lengths = cu_seq_lens[1:] - cu_seq_lens[:-1]
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), lengths.to(q.device))
    position = torch.arange(q.shape[0], device=q.device) - cu_seq_lens.to(q.device)[:-1][sequence]

    def padded(t: torch.Tensor) -> torch.Tensor:
        batch = t.new_zeros(len(lengths), max_len, *t.shape[1:])
        batch[sequence, position] = t
        return batch.transpose(1, 2)  # [sequences, H, max_len, D]

    out = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), is_causal=True, scale=scale)
    return out.transpose(1, 2)[sequence, position]


def per_sequence_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_lens: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Reference path: one causal SDPA call per sequence. q/k/v [T, H, D] -> [T, H, D]."""
    bounds = cu_seq_lens.tolist()
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        pieces.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)[0].transpose(0, 1))
    return torch.cat(pieces)


def _varlen_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_lens: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    cu = cu_seq_lens.to(device=q.device, dtype=torch.int32)
    # PyTorch 2.11 takes is_causal=; later versions spell causality as window_size=(-1, 0).
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **causal)


def _kernel_usable(q: torch.Tensor) -> bool:
    """Check the varlen kernel once per device against the reference path; remember the verdict."""
    if q.device in _kernel_ok:
        return _kernel_ok[q.device]
    try:
        gen = torch.Generator(device=q.device).manual_seed(0)
        shape = (96, q.shape[1], q.shape[2])
        inputs = [torch.randn(shape, device=q.device, dtype=q.dtype, generator=gen) for _ in range(3)]
        cu = torch.tensor([0, 40, 96], dtype=torch.int32, device=q.device)
        with torch.enable_grad():  # training needs the kernel's backward too
            leaves = [t.clone().requires_grad_() for t in inputs]
            got = _varlen_kernel(*leaves, cu, 56, None)
            got.float().square().sum().backward()
            grads = [t.grad for t in leaves]
            leaves = [t.clone().requires_grad_() for t in inputs]
            want = per_sequence_attention(*leaves, cu, None)
            want.float().square().sum().backward()
        error = max(
            float((a.float() - b.float()).norm() / b.float().norm())
            for a, b in zip([got, *grads], [want, *(t.grad for t in leaves)])
        )
        ok = error < 2e-2
        if not ok:
            logger.warning(
                "varlen attention kernel disagrees with SDPA (rel. error %.3g); using per-sequence SDPA", error
            )
    except Exception as exc:  # missing op, unsupported dtype/arch: the reference path still works
        logger.warning("varlen attention kernel unavailable (%s); using per-sequence SDPA", exc)
        ok = False
    _kernel_ok[q.device] = ok
    return ok
