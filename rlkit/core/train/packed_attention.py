"""Causal attention over packed sequences, registered with transformers as 'rlkit_varlen'.

transformers builds no mask for an attention implementation it does not know, and passes
the model's extra forward keywords down to it; rlkit passes the packed batch's boundaries
(`cu_seq_lens_q`, `max_length_q`). On CUDA the boundaries go to PyTorch's variable-length
flash-attention kernel (`torch.nn.attention.varlen.varlen_attn`), with grouped-query K/V of fewer heads
unrepeated where the kernel's own self-check shows it takes them; elsewhere, or where
that kernel is missing or fails its first self-check, the sequences are laid out as a padded
batch for one causal `scaled_dot_product_attention` call (one call per sequence when that
batch would be too large). All attend only within a sequence.

In a compiled decoder layer the kernel is one more node of the layer's graph (a registered op; the batch's longest
sequence a symbolic size), so a layer's forward and backward are one graph each. The self-checks and the fallbacks
(data-dependent shapes, a loop over the boundaries) stay out of graphs; `prepare` runs the checks before the compile,
so that the first trace finds their verdicts.
"""

from __future__ import annotations

import inspect
import logging
from typing import Callable

import torch
import torch.nn.functional as F

NAME = "rlkit_varlen"
logger = logging.getLogger(__name__)
_kernel_ok: dict[torch.device, bool] = {}
_gqa_ok: dict[tuple[torch.device, int, int], bool] = {}  # (device, query heads, kv heads) -> the kernel takes them
KERNEL_DEVICES = {"cuda"}  # device types the varlen kernel is checked on (flash attention is CUDA's)
MAX_KERNEL_ERROR = 2e-2  # relative, bf16
# The padded batch's attention scores (sequences x heads x longest^2, fp32) above this take one call per sequence:
# padding a few long sequences' batch to their length would cost more than the loop.
PADDED_SCORES_MAX_BYTES = 256 << 20


def register() -> str:
    """Make `attn_implementation='rlkit_varlen'` available to transformers models; returns the name.

    Here, not at import, the fallbacks (data-dependent shapes) and the one-time self-checks are kept out of
    compiled graphs: torch.compiler.disable imports torch._dynamo (~0.5 s), which the controller, importing this
    module through the worker classes, never uses.
    """
    global _fallback, _check_kernel
    from transformers import AttentionInterface

    if not getattr(_fallback, "_torchdynamo_disable", False):
        _fallback = torch.compiler.disable(_fallback)
        _check_kernel = torch.compiler.disable(_check_kernel)
    AttentionInterface.register(NAME, packed_attention_forward)
    return NAME


def prepare(config: object, device: torch.device, dtype: torch.dtype) -> None:
    """Run the varlen kernel's self-checks for a model of `config` (transformers') on `device` now, before its
    layers are compiled: a trace that met a check would leave the graph there and compile again once it ran."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    if device.type not in KERNEL_DEVICES or not heads:  # a config without it: the first call checks, as uncompiled
        return
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    _check_kernel(device, dtype, heads, kv_heads, head_dim)


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
    if kwargs.get("softcap") is not None:
        raise ValueError(
            f"{NAME} does not cap attention logits (softcap={kwargs['softcap']}, the model's attn_logit_softcapping): "
            "it would compute another model's attention"
        )
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        check_window(query.shape[2], kwargs.get("sliding_window"))
        groups = query.shape[1] // key.shape[1]
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
    # squeeze, not [0]: backward through a view stays a view (select's backward allocates and copies)
    q = query.squeeze(0).transpose(0, 1).contiguous()  # [T, H, D]
    k = key.squeeze(0).transpose(0, 1).contiguous()  # [T, Hkv, D]: repeated to H heads only where a path needs it
    v = value.squeeze(0).transpose(0, 1).contiguous()
    out = attend(q, k, v, cu_seq_lens, max_len, scaling, kwargs.get("sliding_window"))
    return out.unsqueeze(0), None


def check_window(longest: int, sliding_window: int | None) -> None:
    """A layer's sliding window (transformers' `sliding_window`: a token sees that many, itself included) changes
    nothing for sequences no longer than it; a longer one this attention would let see the whole sequence. rlkit's
    preflight refuses such runs first (rlkit.core.controller.model_checks.check_attention)."""
    if sliding_window is not None and longest > sliding_window:
        raise ValueError(
            f"{NAME}: a sequence of {longest} tokens is longer than the layer's sliding window of {sliding_window} "
            "tokens, which this attention does not implement"
        )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_len: int,
    scale: float | None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention within each packed sequence: q [T, H, D], k/v [T, Hkv, D] (H a multiple of Hkv) ->
    [T, H, D] (rlkit.core.train.packed_layout calls it with q/k/v already in this layout)."""
    check_window(max_len, sliding_window)
    if q.device.type in KERNEL_DEVICES:
        key = (q.device, q.shape[1], k.shape[1])
        if q.device not in _kernel_ok or key not in _gqa_ok:
            _check_kernel(q.device, q.dtype, q.shape[1], k.shape[1], q.shape[2])
        if _kernel_ok[q.device]:
            if k.shape[1] != q.shape[1] and not _gqa_ok[key]:
                k, v = _repeat_kv(k, v, q.shape[1])
            return _varlen_kernel(q, k, v, cu_seq_lens, max_len, scale)
    return _fallback(q, k, v, cu_seq_lens, max_len, scale)


def _fallback(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_lens: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    """Without the kernel: one padded SDPA batch, or one call per sequence where that batch would be too large."""
    k, v = _repeat_kv(k, v, q.shape[1])
    if (len(cu_seq_lens) - 1) * q.shape[1] * max_len * max_len * 4 <= PADDED_SCORES_MAX_BYTES:
        return padded_attention(q, k, v, cu_seq_lens, max_len, scale)
    return per_sequence_attention(q, k, v, cu_seq_lens, scale)


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention's K/V [T, Hkv, D] repeated to the query's heads [T, H, D] (each kv head serves
    H / Hkv query heads in a row, as transformers' repeat_kv)."""
    groups = heads // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


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
    varlen_attn, params = _varlen or _find_varlen()
    cu = cu_seq_lens.to(device=q.device, dtype=torch.int32)
    # PyTorch 2.11 takes is_causal=; later versions spell causality as window_size=(-1, 0), and take K/V with fewer
    # heads than the query only when told (enable_gqa).
    options: dict = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if k.shape[1] != q.shape[1] and "enable_gqa" in params:
        options["enable_gqa"] = True
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **options)


# varlen_attn and the names of its parameters, found once (by the self-check, outside compiled graphs: a trace
# reads them as constants)
_varlen: tuple[Callable[..., torch.Tensor], frozenset[str]] | None = None


def _find_varlen() -> tuple[Callable[..., torch.Tensor], frozenset[str]]:
    global _varlen
    from torch.nn.attention.varlen import varlen_attn

    _varlen = varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)
    return _varlen


def _check_kernel(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> None:
    """The varlen kernel's self-checks against the reference path, each once: whether it works on `device` (equal
    head counts), and whether it takes K/V of `kv_heads` heads for `heads` query heads unrepeated.

    The second: flash attention itself reads each kv head for its group of query heads; where the kernel or its
    PyTorch front end does not, K and V are repeated. On an H100 with torch 2.11 it takes them (relative error 4e-5),
    and a 0.5B model's update spent ~0.15 s less on the device without the repeat and its gradient sums (the
    kernel's own backward 23 ms more; docs/benchmarks.md, 2026-12-07)."""
    if device not in _kernel_ok:
        error = _kernel_error(device, dtype, heads, heads, dim)
        if isinstance(error, str):
            logger.warning("varlen attention kernel unavailable (%s); using per-sequence SDPA", error)
        elif error >= MAX_KERNEL_ERROR:
            logger.warning(
                "varlen attention kernel disagrees with SDPA (rel. error %.3g); using per-sequence SDPA", error
            )
        _kernel_ok[device] = not isinstance(error, str) and error < MAX_KERNEL_ERROR
    key = (device, heads, kv_heads)
    if key in _gqa_ok:
        return
    if kv_heads == heads or not _kernel_ok[device]:  # nothing to check: no fewer kv heads, or no kernel at all
        _gqa_ok[key] = kv_heads == heads
        return
    error = _kernel_error(device, dtype, heads, kv_heads, dim)
    _gqa_ok[key] = not isinstance(error, str) and error < MAX_KERNEL_ERROR
    logger.info(
        "varlen attention kernel %s K/V of %d heads for %d query heads (%s)",
        "takes" if _gqa_ok[key] else "does not take",
        kv_heads,
        heads,
        error if isinstance(error, str) else f"rel. error {error:.3g}",
    )


def _kernel_error(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> float | str:
    """The kernel's largest relative error against per-sequence SDPA (output and the three gradients) on two
    sequences of random q [96, heads, dim] and k/v [96, kv_heads, dim]; why not, where it fails or is missing."""
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        shapes = [(96, heads, dim), (96, kv_heads, dim), (96, kv_heads, dim)]
        inputs = [torch.randn(shape, device=device, dtype=dtype, generator=gen) for shape in shapes]
        cu = torch.tensor([0, 40, 96], dtype=torch.int32, device=device)
        with torch.enable_grad():  # training needs the kernel's backward too
            leaves = [t.clone().requires_grad_() for t in inputs]
            got = _varlen_kernel(*leaves, cu, 56, None)
            got.float().square().sum().backward()
            grads = [t.grad for t in leaves]
            leaves = [t.clone().requires_grad_() for t in inputs]
            want = per_sequence_attention(leaves[0], *_repeat_kv(leaves[1], leaves[2], heads), cu, None)
            want.float().square().sum().backward()
        return max(
            float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())
            for a, b in zip([got, *grads], [want, *(t.grad for t in leaves)])
        )
    except Exception as exc:  # missing op, unsupported dtype/arch or head counts: the reference path still works
        return f"{type(exc).__name__}: {exc}"
