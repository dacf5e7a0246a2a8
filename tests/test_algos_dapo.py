"""DAPO overlong penalty and dynamic-sampling filter against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from rlkit.core.algos.dapo import groups_with_signal, overlong_penalty


def test_overlong_penalty_is_linear_in_the_buffer() -> None:
    # max 20, buffer 4: free up to 16, then -(len - 16)/4 * factor, capped at -factor.
    #   10 -> 0, 16 -> 0, 17 -> -.25, 18 -> -.5, 20 -> -1, 25 -> -1 (beyond max: the cap)
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    out = overlong_penalty(lengths, max_response_length=20, buffer_length=4)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    half = overlong_penalty(lengths, max_response_length=20, buffer_length=4, penalty_factor=0.5)
    assert torch.allclose(half, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]))


@pytest.mark.parametrize("buffer", [0, 21])
def test_overlong_penalty_rejects_bad_buffer(buffer: int) -> None:
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(torch.tensor([5]), max_response_length=20, buffer_length=buffer)


def test_groups_with_signal() -> None:
    # group 4: [1, 1] all equal -> drop; group 9: [0, 1] -> keep; group 2: [.5, .5] -> drop;
    # group 7: a single sample -> keep (its grpo/rloo advantage is its raw score, as in verl).
    scores = torch.tensor([1.0, 1.0, 0.0, 0.5, 1.0, 0.5, 3.0])
    ids = torch.tensor([4, 4, 9, 2, 9, 2, 7])
    expected = torch.tensor([False, False, True, False, True, False, True])
    assert torch.equal(groups_with_signal(scores, ids), expected)
    # Integer scores work too.
    assert torch.equal(
        groups_with_signal(torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 1, 1])),
        torch.tensor([True, True, False, False]),
    )
