"""The trainer's torch.compile (rlkit.core.train.compiled): inductor's options it passes, accepted by torch."""

from __future__ import annotations

import pytest
import torch

from rlkit.core.train.compiled import compiled, inductor_options


def test_the_mix_order_reduction_runs_without_its_size_guards():
    """Inductor's mix-order reduction chose its kernel by the tensor's size and guarded the graph on it, so the
    warm-up's short batch left step 1 to compile every layer again on a GPU; non-strict mode has no such guard. The
    switch is one of this torch's own options (a misspelt one would be ignored by hasattr, not by torch)."""
    from torch._inductor import config

    assert inductor_options() == {"triton.mix_order_reduction_non_strict_mode": True}
    assert config.triton.mix_order_reduction_non_strict_mode is False  # the default it changes, per compile only


@pytest.mark.slow
def test_a_compiled_function_takes_the_options_and_computes_the_same():
    """torch.compile checks an option's name when it compiles: inductor builds the function on a CPU with them and
    the result equals eager's (an RMSNorm and its backward: the two reductions the option is about). (~6 s.)"""

    def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    torch._dynamo.reset()
    x = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(16, requires_grad=True)
    expected = rms_norm(x, weight)
    expected.sum().backward()
    grads = (x.grad.clone(), weight.grad.clone())
    x.grad, weight.grad = None, None
    got = compiled(rms_norm)(x, weight)
    got.sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close((x.grad, weight.grad), grads)
    torch._dynamo.reset()
