"""Log-probs and entropy of chosen tokens, computed from logits a chunk of tokens at a time.

The logits arrive in the compute dtype (bf16 on GPU), one row per response token: [K, V].
Softmax statistics need fp32, but an fp32 copy of all K x V logits would be the largest
tensor of the step (K = 10k response tokens x V = 152k is 6 GB). `SelectedLogProbs` makes
fp32 copies one chunk at a time, in forward and again in backward, and saves only the
per-token log-sum-exp for backward: memory O(K + chunk x V) instead of O(K x V) floats.

The bf16 logits themselves, and their gradient, are still K x V (3 GB each at that size).
`LinearSelectedLogProbs` (actor.fused_lm_head) takes the LM head's input and weight instead and
computes each chunk's logits from them, in forward and again in backward, so no K x V tensor
exists at all; both share the chunk math (`_chunked_stats`, `_chunked_grad_logits`).

On CUDA the chunk kernels are rlkit.core.train.logprob_triton's (`_kernels_on`): they copy nothing to fp32 and read
each row once in forward, so `SelectedLogProbs` gives them the whole logits as one chunk; the fused head's chunks
take them too.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from rlkit.core.train.compiled import compiled

logger = logging.getLogger(__name__)

# fp32 elements of one chunk of logits (2^26 floats = 256 MiB): V=152k gives 441 tokens a chunk.
CHUNK_ELEMENTS = 1 << 26
# Tokens a chunk while `chunk_rows` is in force; None: as many as CHUNK_ELEMENTS holds.
_rows_in_force: int | None = None


def _chunk_tokens(vocab: int) -> int:
    return _rows_in_force or max(1, CHUNK_ELEMENTS // vocab)


@contextmanager
def chunk_rows(rows: int) -> Iterator[None]:
    """Chunks of `rows` tokens inside the block, whatever the vocabulary (the compile warm-up, rlkit.core.train.warmup).

    A batch of fewer response tokens than a chunk holds is one chunk, a view as long as the whole logits: dynamo,
    tracing the kernels on it, takes the two lengths for one (duck sizing) and guards on their equality, so the first
    batch of several chunks compiled the kernels again, forward and backward (step 1 of an H100 run, 2026-12-06).
    """
    global _rows_in_force
    before, _rows_in_force = _rows_in_force, rows
    try:
        yield
    finally:
        _rows_in_force = before


def _stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    # Never in place: fp32 logits would come back divided by T (and backward would divide them again).
    x = logits.float() / temperature if temperature != 1.0 else logits.float()
    # max, then sum exp(x - max) (and sum exp(x - max) * x) over the same pass: compiled, the sums share one loop
    # (logsumexp and the entropy's sum each read the logits again: three passes over 4.5 GB of bf16 logits a
    # micro-batch, 10.1 ms on an H100, 2026-12-07)
    top = x.amax(-1, keepdim=True)
    weights = torch.exp(x - top)
    total = weights.sum(-1)
    lse = top.squeeze(-1) + torch.log(total)
    picked = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - (weights * x).sum(-1) / total if with_entropy else torch.zeros_like(lse)
    return picked, lse, entropy


def _grad_logits(
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
    """d(loss)/d(logits) of one chunk, written into `out` (the logits' dtype).

    Elementwise steps only, the target's one-hot included (no scatter), so the compiled kernel reads the logits
    once and stores the gradient straight into `out`, a slice of the whole gradient: a scatter made inductor write an
    fp32 buffer, cast it in a second kernel and copy the chunk into the whole in a third (13.9 ms a micro-batch of
    4.5 GB of logits on an H100, 2026-12-07; 7.5 ms in one kernel)."""
    # In place on one fp32 copy, so eager mode (compile off, or a CPU) holds two chunk-sized fp32 buffers (and a
    # transient third), as the planner counts them (rlkit.core.planning.memory); compiled, the steps are one kernel.
    x = logits.to(torch.float32, copy=True)
    if temperature != 1.0:
        x /= temperature
    probs = torch.exp(x - lse[:, None])
    if with_entropy:
        # H = lse - sum p x, so dH/dx = -p (x - sum p x) = -p (x - (lse - H))
        x -= (lse - entropy)[:, None]
        x *= probs
        x *= -grad_entropy[:, None]
    else:
        x.zero_()
    # d log p(t) / dx = onehot(t) - p
    probs *= grad_log_probs[:, None]
    x -= probs
    del probs
    target = torch.arange(x.shape[-1], device=x.device) == targets[:, None]
    x += torch.where(target, grad_log_probs[:, None], 0.0)
    if temperature != 1.0:
        x /= temperature
    out.copy_(x)


def _sum_squared(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """sum_v softmax(x)_v^2 of one chunk as exp(logsumexp(2x) - 2 logsumexp(x)): no probability is squared, so
    none underflows first."""
    x = logits.float() / temperature
    return torch.exp(torch.logsumexp(2 * x, dim=-1) - 2 * torch.logsumexp(x, dim=-1))


# The chunk kernels in torch; `use_compiled_kernels` swaps in fused (torch.compile) versions of the first two.
_kernels = {"stats": _stats, "grad": _grad_logits, "squared": _sum_squared}


def use_compiled_kernels() -> None:
    """Fuse each chunk's passes over V (upcast, max, exp, sum, gather) into a few kernels."""
    _kernels["stats"] = compiled(_stats)
    _kernels["grad"] = compiled(_grad_logits)


# device -> whether the Triton kernels compiled and ran there (`_triton_works`)
_triton_ok: dict[torch.device, bool] = {}


def _probe_triton(device: torch.device) -> None:
    """The stats kernel on one row of two logits: Triton compiles its launcher with the host's C compiler and the
    kernel for the GPU, either of which may be missing or fail."""
    from rlkit.core.train import logprob_triton

    logprob_triton.stats(torch.zeros(1, 2, device=device), torch.zeros(1, dtype=torch.long, device=device), 1.0, False)


def _triton_works(device: torch.device) -> bool:
    """Whether the Triton kernels run on `device`, probed once per device. model.compile=false needs no compiler
    (no inductor), so where Triton cannot build its kernels the log-prob passes keep torch's, with a warning."""
    if device not in _triton_ok:
        try:
            _probe_triton(device)
            _triton_ok[device] = True
        except Exception as exc:  # no triton, no C compiler, a GPU Triton does not support
            logger.warning("Triton log-prob kernels unavailable on %s (%s); using torch's chunk kernels", device, exc)
            _triton_ok[device] = False
    return _triton_ok[device]


def _kernels_on(device: torch.device) -> tuple[dict[str, Callable[..., Any]], bool]:
    """(the chunk kernels for tensors on `device`, whether they copy a chunk to fp32). On CUDA, where triton comes
    with torch, rlkit.core.train.logprob_triton's: they read the logits in their dtype and copy nothing, so logits
    that exist whole are one chunk; elsewhere (or where they do not build) torch's (`_kernels`), on fp32 copies of a
    chunk at a time."""
    if device.type != "cuda" or not _triton_works(device):
        return _kernels, True
    from rlkit.core.train import logprob_triton

    return logprob_triton.KERNELS, False


def _chunks(tokens: int, step: int) -> Iterator[slice]:
    for start in range(0, tokens, step):
        yield slice(start, start + step)


def _step(tokens: int, vocab: int, copies: bool, whole: bool) -> int:
    """Tokens a chunk: all of them where the logits exist `whole` and the kernels copy nothing, else as many as
    CHUNK_ELEMENTS holds (the fused head's logits exist a chunk at a time: its memory bound)."""
    return max(1, tokens) if whole and not copies else _chunk_tokens(vocab)


LogitsOf = Callable[[slice], torch.Tensor]  # rows -> their logits [k, V] in the compute dtype


def _chunked_stats(
    logits_of: LogitsOf, targets: torch.Tensor, vocab: int, temperature: float, with_entropy: bool, whole: bool
):
    """(log p(target), log-sum-exp, entropy or zeros), [K] each in fp32, one chunk of logits at a time (`whole`:
    the logits exist whole, `_step`)."""
    kernels, copies = _kernels_on(targets.device)
    out = [targets.new_empty(targets.shape[0], dtype=torch.float32) for _ in range(3)]
    for part in _chunks(targets.shape[0], _step(targets.shape[0], vocab, copies, whole)):
        stats = kernels["stats"](logits_of(part), targets[part], temperature, with_entropy)
        for vector, chunk in zip(out, stats):
            vector[part] = chunk
    return out


def _chunked_grad_logits(
    logits_of: LogitsOf,
    targets: torch.Tensor,
    vocab: int,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_log_probs: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    temperature: float,
    with_entropy: bool,
    out_of: LogitsOf,
    whole: bool,
) -> Iterator[tuple[slice, torch.Tensor]]:
    """(rows, d(loss)/d(their logits)) chunk by chunk, each written into `out_of(rows)` (rows of unit stride) and
    yielded. A gradient autograd left as None (an output the loss does not read) counts as zeros; an entropy the
    loss leaves out adds no entropy term."""
    kernels, copies = _kernels_on(targets.device)
    zeros = torch.zeros_like(lse)
    with_entropy = with_entropy and grad_entropy is not None
    grad_log_probs = zeros if grad_log_probs is None else grad_log_probs
    grad_entropy = zeros if grad_entropy is None else grad_entropy
    for part in _chunks(targets.shape[0], _step(targets.shape[0], vocab, copies, whole)):
        out = out_of(part)
        kernels["grad"](
            logits_of(part),
            targets[part],
            lse[part],
            entropy[part],
            grad_log_probs[part],
            grad_entropy[part],
            temperature,
            with_entropy,
            out,
        )
        yield part, out


class SelectedLogProbs(torch.autograd.Function):
    """(logits [K, V], targets [K]) -> (log p(target) [K], entropy [K]) at temperature T."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
        vocab = logits.shape[-1]
        log_probs, lse, entropy = _chunked_stats(
            logits.__getitem__, targets, vocab, temperature, with_entropy, whole=True
        )
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.set_materialize_grads(False)  # an entropy the loss leaves out gets None: no entropy term in backward
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, targets, lse, entropy = ctx.saved_tensors
        grad_logits = logits.new_empty(logits.shape)  # contiguous: the kernels write rows of unit stride
        for _ in _chunked_grad_logits(
            logits.__getitem__,
            targets,
            logits.shape[-1],
            lse,
            entropy,
            grad_log_probs,
            grad_entropy,
            ctx.temperature,
            ctx.with_entropy,
            out_of=grad_logits.__getitem__,  # each chunk's gradient lands in its rows of the whole
            whole=True,
        ):
            pass
        return grad_logits, None, None, None


class LinearSelectedLogProbs(torch.autograd.Function):
    """(hidden [K, H], weight [V, H], targets [K]) -> SelectedLogProbs of the logits hidden @ weight^T (an LM
    head without bias), never holding them whole: each chunk's logits are computed in forward, reduced to the
    per-token statistics, and computed again in backward. One more head GEMM than the unfused path (the
    recomputation), no [K, V] logits and no [K, V] gradient."""

    @staticmethod
    def forward(
        ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
    ):
        logits_of = functools.partial(_head_logits, hidden, weight)
        log_probs, lse, entropy = _chunked_stats(
            logits_of, targets, weight.shape[0], temperature, with_entropy, whole=False
        )
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.set_materialize_grads(False)
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        wants_hidden, wants_weight = ctx.needs_input_grad[:2]  # a frozen head (LoRA, the reference) needs none
        grad_hidden = torch.empty_like(hidden) if wants_hidden else None
        # Summed over chunks in fp32 (each chunk's product is in the compute dtype), the weight's dtype at the end.
        grad_weight = weight.new_zeros(weight.shape, dtype=torch.float32) if wants_weight else None
        # One chunk's gradient at a time, each consumed by the two products before the next overwrites it.
        rows = min(_chunk_tokens(weight.shape[0]), targets.shape[0])
        scratch = hidden.new_empty(rows, weight.shape[0], dtype=torch.promote_types(hidden.dtype, weight.dtype))
        for part, grad in _chunked_grad_logits(
            functools.partial(_head_logits, hidden, weight),
            targets,
            weight.shape[0],
            lse,
            entropy,
            grad_log_probs,
            grad_entropy,
            ctx.temperature,
            ctx.with_entropy,
            out_of=lambda part: scratch[: min(part.stop, targets.shape[0]) - part.start],
            whole=False,
        ):
            if grad_hidden is not None:
                grad_hidden[part] = grad @ weight
            if grad_weight is not None:
                grad_weight += grad.T @ hidden[part]
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None


def _head_logits(hidden: torch.Tensor, weight: torch.Tensor, rows: slice) -> torch.Tensor:
    return hidden[rows] @ weight.T


def selected_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T)[target] and (if asked; zeros otherwise) the entropy, per row, in fp32."""
    if not torch.is_grad_enabled() or not logits.requires_grad:
        with torch.no_grad():
            return SelectedLogProbs.forward(_NoCtx(), logits, targets, temperature, with_entropy)
    return SelectedLogProbs.apply(logits, targets, temperature, with_entropy)


def linear_selected_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`selected_log_probs` of the logits hidden [K, H] @ weight [V, H]^T, a chunk of tokens at a time."""
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        with torch.no_grad():
            return LinearSelectedLogProbs.forward(_NoCtx(), hidden, weight, targets, temperature, with_entropy)
    return LinearSelectedLogProbs.apply(hidden, weight, targets, temperature, with_entropy)


@torch.no_grad()
def sum_squared_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """sum_v softmax(logits / T)_v^2 per row [K], in fp32, a chunk of rows at a time (no gradient; on CUDA one
    Triton pass over the whole, logprob_triton.sum_squared, not yet timed on a GPU).
    The optimal token baseline's gradient-energy proxy reads it (rlkit.core.algos.optimal_token_baseline).
    """
    kernels, copies = _kernels_on(logits.device)
    out = logits.new_empty(logits.shape[0], dtype=torch.float32)
    for part in _chunks(logits.shape[0], _step(logits.shape[0], logits.shape[-1], copies, whole=True)):
        out[part] = kernels["squared"](logits[part], temperature)
    return out


class _NoCtx:
    """Stands in for autograd's context when nothing will be differentiated."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass
