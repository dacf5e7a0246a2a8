"""The worker's DPO micro-step, through the shared optimize loop, on a bigram model with hand-set log-probs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from rlkit.core.batch import Batch, build_batch
from rlkit.core.cluster.device_worker import free_port
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.train.learner import micro_batches, optimize
from rlkit.core.train.model import TrainableModel
from rlkit.core.train.preference_step import PAIR_ROWS, preference_micro_step

LN2 = math.log(2)


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits depend on the current token only. Every row starts as
    log(1/8, 1/2, 1/4, 1/8): token 1 has log-prob -ln 2, token 2 -2 ln 2, token 3 -3 ln 2."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Embedding(4, 4)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.tensor([1 / 8, 1 / 2, 1 / 4, 1 / 8]).log().expand(4, 4))

    def forward(self, input_ids, position_ids, use_cache, logits_to_keep, **boundaries):
        return SimpleNamespace(logits=self.lm_head(input_ids)[:, logits_to_keep])


def pair_rows(pairs: list[tuple[list[int], list[int]]], ref: list[list[float]]) -> Batch:
    """Prompt [1] and the given (chosen, rejected) responses, interleaved, with reference log-probs."""
    row = PromptRow(index=0, prompt_token_ids=[1], data_source="", ground_truth="")
    responses = [ids for pair in pairs for ids in pair]
    batch = build_batch([Trajectory(row, i // 2, ids, [1] * len(ids)) for i, ids in enumerate(responses)], pad_id=0)
    ref_log_probs = torch.zeros(batch["responses"].shape)
    for i, values in enumerate(ref):
        ref_log_probs[i, :len(values)] = torch.tensor(values)
    keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
    return Batch({**{k: batch[k] for k in keys}, "ref_log_probs": ref_log_probs})


def test_dpo_step_matches_hand_computed_loss(world_of_one) -> None:
    # Pair 0: chosen [1, 1]: policy -2 ln2, reference -1.5 ln2 - 1.5 ln2 = -3 ln2 -> log-ratio +ln2
    #         rejected [3, 2]: policy -5 ln2, reference -2 ln2 - 2 ln2 = -4 ln2 -> log-ratio -ln2
    #         h = 2 ln2, beta = 0.5: beta h = ln2, loss = -log sigmoid(ln 2) = -log(2/3) = ln 1.5
    #         rewards: chosen 0.5 ln2, rejected -0.5 ln2, accurate
    # Pair 1: chosen [2]: policy = reference = -2 ln2; rejected [3]: policy = reference = -3 ln2
    #         h = 0: loss ln 2, rewards 0, a tie (not accurate)
    # The mini-batch: loss (ln 1.5 + ln 2) / 2 = ln(3) / 2, rewards/chosen 0.25 ln2, rejected -0.25 ln2,
    # margins 0.5 ln2, accuracies 0.5.
    batch = pair_rows([([1, 1], [3, 2]), ([2], [3])],
                      [[-1.5 * LN2, -1.5 * LN2], [-2 * LN2, -2 * LN2], [-2 * LN2], [-3 * LN2]])
    bigram = Bigram()
    model = TrainableModel(bigram, torch.optim.SGD(bigram.parameters(), lr=0.0), scheduler=None)
    norm = {"num_tokens": 6.0, "num_seqs": 4.0}

    def step(mb, norm_):
        return preference_micro_step(bigram, mb, norm_, device=torch.device("cpu"), loss_type="sigmoid", beta=0.5,
                                     label_smoothing=0.0, fused_head=False)

    keys = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
    expected = {"loss": math.log(3) / 2, "rewards/chosen": 0.25 * LN2, "rewards/rejected": -0.25 * LN2,
                "rewards/margins": 0.5 * LN2, "rewards/accuracies": 0.5}
    # A budget of 3 tokens: each pair is its own micro-batch (pair 0 is 2 + 3 + 2 + 3 = 10 tokens, alone
    # over the budget), so the mini-batch's numbers add up across micro-batches.
    assert micro_batches(batch, 3, group=PAIR_ROWS) == [[0, 1], [2, 3]]
    metrics = optimize(model, [batch], [norm], step, grad_clip=1e9, micro_batch_tokens=3, per_update=keys,
                       group=PAIR_ROWS)
    assert {k: metrics[k] for k in keys} == pytest.approx(expected, abs=1e-6)
    # One micro-batch of everything gives the same loss and the same gradient.
    micro_batched = bigram.lm_head.weight.grad.clone()
    bigram.zero_grad()
    loss, _ = step(batch, norm)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(3) / 2, abs=1e-6)
    assert torch.allclose(bigram.lm_head.weight.grad, micro_batched, atol=1e-7)
    assert micro_batched.abs().sum() > 0


def test_pairs_stay_together_in_micro_batches(world_of_one) -> None:
    # Row lengths (prompt 1 + response): pair 0 = 4 + 2 tokens, pair 1 = 2 + 5, pair 2 = 3 + 3, budget 7:
    # each micro-batch holds whole pairs, its rows in order.
    batch = pair_rows([([1, 1, 1], [1]), ([1], [1, 1, 1, 1]), ([1, 1], [1, 1])], [])
    assert sorted(micro_batches(batch, 7, group=PAIR_ROWS)) == [[0, 1], [2, 3], [4, 5]]
    # Budget 13 (pairs of 6, 7 and 6 tokens): two micro-batches, pair 1 alone, pairs 0 and 2 together.
    assert sorted(micro_batches(batch, 13, group=PAIR_ROWS)) == [[0, 1, 4, 5], [2, 3]]


def test_filler_pairs_count_nothing(world_of_one) -> None:
    # Validation pads its pairs to whole ranks with copies whose loss mask is 0 (OfflineController.validate):
    # pair 0 of the first test (loss ln 1.5) plus a masked copy, in a mini-batch of one real pair.
    batch = pair_rows([([1, 1], [3, 2]), ([1, 1], [3, 2])], [[-1.5 * LN2, -1.5 * LN2], [-2 * LN2, -2 * LN2]] * 2)
    batch["response_mask"][2:] = 0
    loss, sums = preference_micro_step(Bigram(), batch, {"num_tokens": 4.0, "num_seqs": 2.0},
                                       device=torch.device("cpu"), loss_type="sigmoid", beta=0.5, label_smoothing=0.0,
                                       fused_head=False)
    assert loss.item() == pytest.approx(math.log(1.5), abs=1e-6)
    assert sums["rewards/accuracies"].item() == 1.0 and sums["tokens"].item() == 4.0
