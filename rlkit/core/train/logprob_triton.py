"""Log-probs and entropy of chosen tokens over whole [K, V] logits in two Triton kernels (CUDA tensors).

The chunked kernels (rlkit.core.train.logprobs, compiled by inductor) read each chunk of bf16 logits twice in
forward (the max, then the sums) and work a chunk of 441 tokens at a time from the host: 14.7-16.8 ms forward and
backward over one micro-batch's 4.5 GB of logits on an H100 (2026-12-07), 1.0-1.4 TB/s of its 3.35. These two take
5.2 ms (the reference pass's forward 5.4 -> 1.6 ms; docs/benchmarks.md, 2026-12-07 09:01).

- `stats`: one program a row reads it once. The max and the two sums (exp(x - max), exp(x - max) * x) run online:
  when a block raises the max, the sums so far are scaled by exp(old max - new max), so the sums need no second
  pass (the online softmax).
- `grad_logits`: one program a (row, block of the vocabulary), elementwise: it reads the logits once and writes
  the gradient once, in the logits' dtype, into the tensor backward returns.
- `sum_squared`: each row's sum of squared probabilities (the optimal token baseline's), online as `stats`.

No fp32 copy of the logits exists and the host launches two kernels a micro-batch instead of a loop over chunks.
The formulas are the chunked kernels' (logprobs._stats, logprobs._grad_logits); only the order of the sums differs.
With TRITON_INTERPRET=1 in the environment before triton is imported, Triton's interpreter runs them on CPU tensors
(tests/test_logprob_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements of the vocabulary a program takes at a time, and its warps: the stats kernel loops a row in blocks of
# STATS_BLOCK, the gradient kernel's grid has a program per row and GRAD_BLOCK columns. The fastest of a sweep on an
# H100 (2026-12-07, 4.5 GB of bf16 logits): stats 1.73 ms (2.6 TB/s; 1.47 ms without the entropy), the gradient
# 3.20 ms (2.8 TB/s; a plain copy of the logits 3.0 TB/s); docs/benchmarks.md.
STATS_BLOCK, STATS_WARPS = 8192, 8
GRAD_BLOCK, GRAD_WARPS = 2048, 4


@triton.jit
def _stats_rows(
    logits, row_stride, targets, picked_out, lse_out, entropy_out, vocab, temperature,
    WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # row * row_stride passes 2^31 on a micro-batch's logits
    start = logits + row * row_stride
    top = float("-inf")
    total = 0.0  # sum of exp(x - top)
    weighted = 0.0  # sum of exp(x - top) * x, the entropy's
    for offset in range(0, vocab, BLOCK):
        columns = offset + tl.arange(0, BLOCK)
        inside = columns < vocab
        x = tl.load(start + columns, mask=inside, other=float("-inf")).to(tl.float32) / temperature
        new_top = tl.maximum(top, tl.max(x, axis=0))
        rescale = tl.exp(top - new_top)
        weights = tl.exp(x - new_top)  # 0 outside the row: x is -inf there
        total = total * rescale + tl.sum(weights, axis=0)
        if WITH_ENTROPY:
            weighted = weighted * rescale + tl.sum(weights * tl.where(inside, x, 0.0), axis=0)  # not 0 * -inf
        top = new_top
    lse = top + tl.log(total)
    picked = tl.load(start + tl.load(targets + row)).to(tl.float32) / temperature - lse
    tl.store(picked_out + row, picked)
    tl.store(lse_out + row, lse)
    if WITH_ENTROPY:
        tl.store(entropy_out + row, lse - weighted / total)
    else:
        tl.store(entropy_out + row, 0.0)


@triton.jit
def _grad_rows(
    logits, row_stride, targets, lse, entropy, grad_log_probs, grad_entropy, out, out_row_stride, vocab, temperature,
    WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = columns < vocab
    x = tl.load(logits + row * row_stride + columns, mask=inside, other=0.0).to(tl.float32) / temperature
    row_lse = tl.load(lse + row)
    weight = tl.load(grad_log_probs + row)
    probs = tl.exp(x - row_lse)
    # d log p(t) / dx = onehot(t) - p
    grad = tl.where(columns == tl.load(targets + row), weight, 0.0) - weight * probs
    if WITH_ENTROPY:
        # H = lse - sum p x, so dH/dx = -p (x - sum p x) = -p (x - (lse - H))
        grad -= tl.load(grad_entropy + row) * probs * (x - (row_lse - tl.load(entropy + row)))
    tl.store(out + row * out_row_stride + columns, (grad / temperature).to(out.dtype.element_ty), mask=inside)


@triton.jit
def _squared_rows(logits, row_stride, squared_out, vocab, temperature, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = logits + row * row_stride
    top = float("-inf")
    total = 0.0  # sum of exp(x - top)
    squares = 0.0  # sum of exp(x - top)^2 = exp(2 (x - top)): rescaled by the square of the max's factor
    for offset in range(0, vocab, BLOCK):
        columns = offset + tl.arange(0, BLOCK)
        x = tl.load(start + columns, mask=columns < vocab, other=float("-inf")).to(tl.float32) / temperature
        new_top = tl.maximum(top, tl.max(x, axis=0))
        rescale = tl.exp(top - new_top)
        weights = tl.exp(x - new_top)
        total = total * rescale + tl.sum(weights, axis=0)
        squares = squares * rescale * rescale + tl.sum(weights * weights, axis=0)
        top = new_top
    # sum p^2 = sum exp(2 (x - top)) / (sum exp(x - top))^2; the largest weight is 1, so neither sum underflows
    tl.store(squared_out + row, squares / (total * total))


def _rows_contiguous(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p(target), log-sum-exp, entropy or zeros) of logits [K, V] / T, [K] each in fp32."""
    logits = _rows_contiguous(logits)
    rows, vocab = logits.shape
    picked, lse, entropy = (logits.new_empty(rows, dtype=torch.float32) for _ in range(3))
    if rows:
        _stats_rows[(rows,)](
            logits, logits.stride(0), targets.contiguous(), picked, lse, entropy, vocab, float(temperature),
            WITH_ENTROPY=with_entropy, BLOCK=min(STATS_BLOCK, triton.next_power_of_2(vocab)), num_warps=STATS_WARPS,
        )  # fmt: skip
    return picked, lse, entropy


def grad_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_log_probs: torch.Tensor,
    grad_entropy: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    out: torch.Tensor,
) -> None:
    """d(loss)/d(logits) [K, V], written into `out` (rows of unit stride, the logits' dtype)."""
    logits = _rows_contiguous(logits)
    rows, vocab = logits.shape
    block = min(GRAD_BLOCK, triton.next_power_of_2(vocab))
    if rows:
        # Row-wise vectors from autograd may be strided views (a sum's backward expands one value): contiguous.
        _grad_rows[(rows, triton.cdiv(vocab, block))](
            logits, logits.stride(0), targets.contiguous(), lse.contiguous(), entropy.contiguous(),
            grad_log_probs.contiguous(), grad_entropy.contiguous(), out, out.stride(0), vocab, float(temperature),
            WITH_ENTROPY=with_entropy, BLOCK=block, num_warps=GRAD_WARPS,
        )  # fmt: skip


def sum_squared(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """sum_v softmax(logits / T)_v^2 per row [K], in fp32 (logprobs.sum_squared_probs on CUDA)."""
    logits = _rows_contiguous(logits)
    rows, vocab = logits.shape
    out = logits.new_empty(rows, dtype=torch.float32)
    if rows:
        _squared_rows[(rows,)](
            logits, logits.stride(0), out, vocab, float(temperature),
            BLOCK=min(STATS_BLOCK, triton.next_power_of_2(vocab)), num_warps=STATS_WARPS,
        )  # fmt: skip
    return out


# As logprobs' chunk kernels are named (logprobs._kernels_on hands these out on CUDA).
KERNELS = {"stats": stats, "grad": grad_logits, "squared": sum_squared}
