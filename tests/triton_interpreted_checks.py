"""The Triton log-prob kernels (rlkit.core.train.logprob_triton) run by Triton's interpreter on CPU tensors.

Not collected by `make test` (the name): tests/test_logprob_triton.py runs this file in a child pytest with
TRITON_INTERPRET=1, which must be set before triton is imported (it decides at import whether triton.language's own
functions are compiled or interpreted), so it cannot share a process with the rest of the suite.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run by tests/test_logprob_triton.py"

from rlkit.core.train import logprob_triton, logprobs  # noqa: E402


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 16 columns: a row of 50 takes four, the last one partly outside the row."""
    monkeypatch.setattr(logprob_triton, "STATS_BLOCK", 16)
    monkeypatch.setattr(logprob_triton, "GRAD_BLOCK", 16)


@pytest.fixture
def triton_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """logprobs takes logprob_triton's kernels for CPU tensors too (as for CUDA ones); each call, (kernel, rows)."""
    calls: list[tuple[str, int]] = []

    def counted(name: str, kernel):
        return lambda logits, *rest: calls.append((name, logits.shape[0])) or kernel(logits, *rest)

    counted_kernels = {name: counted(name, kernel) for name, kernel in logprob_triton.KERNELS.items()}
    monkeypatch.setattr(logprobs, "_kernels_on", lambda device: (counted_kernels, False))
    return calls


def reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    log_softmax = (logits.double() / temperature).log_softmax(-1)
    return log_softmax.gather(-1, targets[:, None]).squeeze(-1), -(log_softmax.exp() * log_softmax).sum(-1)


def test_hand_computed_log_probs_entropy_and_gradient() -> None:
    # softmax([0, ln 3]) = [1/4, 3/4]; H = ln 4 - (3/4) ln 3
    logits = torch.tensor([[0.0, math.log(3)], [math.log(3), 0.0]])
    targets = torch.tensor([1, 1])
    picked, lse, entropy = logprob_triton.stats(logits, targets, 1.0, True)
    assert picked.tolist() == pytest.approx([math.log(0.75), math.log(0.25)], abs=1e-6)
    assert lse.tolist() == pytest.approx([math.log(4)] * 2, abs=1e-6)
    assert entropy.tolist() == pytest.approx([math.log(4) - 0.75 * math.log(3)] * 2, abs=1e-6)
    out = torch.empty_like(logits)
    ones, zeros = torch.ones(2), torch.zeros(2)
    logprob_triton.grad_logits(logits, targets, lse, entropy, ones, zeros, 1.0, True, out)
    # d log p(1) / dx = onehot(1) - p
    assert out.tolist() == [pytest.approx([-0.25, 0.25]), pytest.approx([-0.75, 0.75])]


def test_without_the_entropy_the_kernel_stores_zeros() -> None:
    logits = torch.tensor([[0.0, math.log(3)]])
    picked, _, entropy = logprob_triton.stats(logits, torch.tensor([0]), 1.0, False)
    assert picked.tolist() == pytest.approx([math.log(0.25)], abs=1e-6)
    assert entropy.tolist() == [0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selected_log_probs_take_the_triton_path_and_match_log_softmax(triton_on_cpu, dtype) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(7, 50) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, 50, (7,))
    weights_lp, weights_ent = torch.randn(7), torch.randn(7)
    log_probs, entropy = logprobs.selected_log_probs(logits, targets, temperature=0.7, with_entropy=True)
    ((log_probs * weights_lp).sum() + (entropy * weights_ent).sum()).backward()
    assert triton_on_cpu == [("stats", 7), ("grad", 7)]  # the whole logits, one call each way

    leaf = logits.detach().double().requires_grad_()
    want_lp, want_ent = reference(leaf, targets, 0.7)
    want_grad, = torch.autograd.grad((want_lp * weights_lp).sum() + (want_ent * weights_ent).sum(), leaf)
    # fp32 sums over the row in another order than float64's (values of 3-10)
    torch.testing.assert_close(log_probs.double(), want_lp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_ent.detach(), rtol=0, atol=1e-5)
    assert logits.grad.dtype == dtype
    # fp32 math; the gradient is stored in the logits' dtype (bf16: 8 bits of mantissa)
    tolerance = 2e-6 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(logits.grad.double(), want_grad, rtol=tolerance, atol=tolerance)


def test_an_entropy_left_out_of_the_loss_and_a_summed_loss(triton_on_cpu) -> None:
    """The entropy's gradient None (no entropy term), the log-probs' an expanded scalar (a sum's backward: stride 0)."""
    torch.manual_seed(1)
    logits = torch.randn(5, 50, requires_grad=True)
    targets = torch.randint(0, 50, (5,))
    log_probs, entropy = logprobs.selected_log_probs(logits, targets, with_entropy=True)
    grad, = torch.autograd.grad(log_probs.sum(), logits)
    assert entropy.abs().sum() > 0
    leaf = logits.detach().double().requires_grad_()
    want_lp, _ = reference(leaf, targets, 1.0)
    want_grad, = torch.autograd.grad(want_lp.sum(), leaf)
    torch.testing.assert_close(grad.double(), want_grad, rtol=0, atol=2e-6)


def test_a_row_whose_max_comes_late_rescales_the_sums_without_overflow() -> None:
    """exp(80) overflows nothing here: the sums so far are scaled down when the last block raises the max."""
    logits = torch.zeros(2, 50)
    logits[0, 49] = 80.0  # in the last block, past everything the first three summed
    logits[1, 0] = 80.0  # in the first
    targets = torch.tensor([0, 0])
    picked, lse, entropy = logprob_triton.stats(logits, targets, 1.0, True)
    want_lp, want_ent = reference(logits, targets, 1.0)
    torch.testing.assert_close(picked.double(), want_lp, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_ent, rtol=1e-4, atol=1e-6)
    assert lse.tolist() == pytest.approx([80.0, 80.0], abs=1e-6)


def test_rows_of_a_wider_tensor_are_read_in_place() -> None:
    """Logits that are columns 0-49 of a [3, 64] tensor: each row starts 64 elements after the last."""
    torch.manual_seed(2)
    wide = torch.randn(3, 64)
    logits = wide[:, :50]
    targets = torch.randint(0, 50, (3,))
    picked, _, entropy = logprob_triton.stats(logits, targets, 1.0, True)
    want_lp, want_ent = reference(logits, targets, 1.0)
    torch.testing.assert_close(picked.double(), want_lp, rtol=0, atol=2e-6)
    torch.testing.assert_close(entropy.double(), want_ent, rtol=0, atol=2e-6)


def test_sum_of_squared_probabilities_by_hand_and_over_blocks(triton_on_cpu) -> None:
    # softmax([0, ln 3]) = [1/4, 3/4]: 1/16 + 9/16; at T = 2 the logits [2 ln 3, 0] give the same
    assert logprobs.sum_squared_probs(torch.tensor([[0.0, math.log(3)]])).tolist() == pytest.approx([0.625])
    assert logprobs.sum_squared_probs(torch.tensor([[2 * math.log(3), 0.0]]), 2.0).tolist() == pytest.approx([0.625])
    torch.manual_seed(3)
    logits = torch.randn(4, 50) * 3
    logits[0, 49] = 40.0  # the max in the last block: the squares so far rescaled by its factor squared
    want = (logits.double() / 0.7).softmax(-1).pow(2).sum(-1)
    torch.testing.assert_close(logprobs.sum_squared_probs(logits, 0.7).double(), want, rtol=1e-5, atol=1e-7)
    assert [name for name, _ in triton_on_cpu] == ["squared"] * 3


def test_the_fused_heads_chunks_take_the_triton_kernels(triton_on_cpu, monkeypatch) -> None:
    """actor.fused_lm_head: each chunk's logits (hidden @ weight^T) exist alone, so the chunks stay (3 tokens here);
    the kernels on them are Triton's, and the gradients of hidden and weight are log_softmax's."""
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 3 * 50)
    torch.manual_seed(4)
    hidden = torch.randn(7, 8, requires_grad=True)
    weight = torch.randn(50, 8, requires_grad=True)
    targets = torch.randint(0, 50, (7,))
    weights_lp, weights_ent = torch.randn(7), torch.randn(7)
    log_probs, entropy = logprobs.linear_selected_log_probs(hidden, weight, targets, 0.7, with_entropy=True)
    loss = (log_probs * weights_lp).sum() + (entropy * weights_ent).sum()
    grad_hidden, grad_weight = torch.autograd.grad(loss, (hidden, weight))
    assert triton_on_cpu == [("stats", 3), ("stats", 3), ("stats", 1), ("grad", 3), ("grad", 3), ("grad", 1)]

    leaves = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    want_lp, want_ent = reference(leaves[0] @ leaves[1].T, targets, 0.7)
    want = torch.autograd.grad((want_lp * weights_lp).sum() + (want_ent * weights_ent).sum(), leaves)
    torch.testing.assert_close(log_probs.double(), want_lp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_ent.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(grad_hidden.double(), want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_weight.double(), want[1], rtol=1e-4, atol=1e-5)
