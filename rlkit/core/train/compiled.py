"""torch.compile as the trainer calls it (model.compile): each decoder layer's forward and the log-prob kernels.

Dynamic shapes (`dynamic=True`) let one compiled graph serve every batch's lengths, so the compile warm-up
(rlkit.core.train.warmup) on a batch of 53 tokens leaves nothing to compile for a real micro-batch of 22k. One
inductor heuristic broke that on a GPU: whether to fuse two reductions over the same tensor in different orders
(the mix-order reduction, e.g. an RMSNorm backward's sums over tokens and over features) depends on the tensor's
size, 5 Mi elements by default, and inductor guards the compiled code on that side of it. The warm-up's graphs
were guarded on `896 * tokens < 5242880`, and step 1's update compiled every layer's forward and backward again
(an H100, 2026-12-07: the update 11.6 s in step 1 against 4.0 s after; docs/startup.md). Its non-strict mode
skips the size checks (which only choose the faster of two correct kernels for small tensors), so the graphs carry
no such guard and one compile serves every size.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def inductor_options() -> dict[str, Any]:
    """Inductor's options for the trainer's compiles: the mix-order reduction without its size guards, where this
    torch has the switch (2.11, the GPU image's, and 2.13 have it; one without it keeps the guard and compiles
    again at step 1)."""
    from torch._inductor import config

    if hasattr(config.triton, "mix_order_reduction_non_strict_mode"):
        return {"triton.mix_order_reduction_non_strict_mode": True}
    return {}


def compiled(function: F) -> F:
    """`function` compiled for any input lengths, with the trainer's inductor options."""
    return torch.compile(function, dynamic=True, options=inductor_options())  # type: ignore[return-value]
