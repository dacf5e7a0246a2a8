"""optimal_token_baseline (rlkit/core/algos/optimal_token_baseline.py) against hand-computed numbers, and what
it needs from a step: the old-log-prob pass with each token's sum of squared probabilities."""

from __future__ import annotations

import math

import pytest
import torch
from test_algos_advantages import CONSTANT_SCORES

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages
from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.phase_plan import phase_plan
from rlkit.core.batch import Batch
from rlkit.core.train.logprobs import sum_squared_probs
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config

LN = math.log
G = 1e3  # garbage in every padding slot: never read


def otb_inputs(**extra: torch.Tensor) -> AdvantageInputs:
    """Group 0 = seqs 0, 1; group 3 = seq 2 alone; group 8 = seqs 3, 4. R = 3.

    Per token: pi_t (the sampled token's probability) and sum_v pi_v^2 give w_t = 1 - 2 pi_t + sum pi^2:
      seq 0: pi .5, .5, .5 with sum .5          -> w .5, .5, .5   -> W .5, 1, 1.5
      seq 1: pi .25, .25 with sum .25 (+ pad)   -> w .75, .75     -> W .75, 1.5
      seq 2: anything (alone in its group)
      seq 3: pi .5, .5 with sum .5 (+ pad)      -> w .5, .5       -> W .5, 1
      seq 4: pi .5, .25 with sum .5, .25 (+pad) -> w .5, .75      -> W .5, 1.25
    Rewards: seq 0 scores 1 on its last token, seq 1 0; seq 2 carries in-reward KL: -.1 then .5;
    seq 3 scores 2, seq 4 1.
    """
    pi = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.25, G], [0.5, 0.5, G], [0.5, 0.5, G], [0.5, 0.25, G]])
    sum_sq = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.25, G], [0.5, 0.5, G], [0.5, 0.5, G], [0.5, 0.25, G]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, G], [-0.1, 0.5, G], [0.0, 2.0, G], [0.0, 1.0, G]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]])
    return AdvantageInputs(rewards, mask, torch.tensor([0, 0, 3, 8, 8]), old_log_probs=pi.log(),
                           sum_pi_squared=sum_sq, **extra)


def test_the_baseline_is_the_energy_weighted_mean_return_at_each_position() -> None:
    # Returns (reward-to-go): seq 0 [1, 1, 1], seq 1 [0, 0], seq 2 [.4, .5], seq 3 [2, 2], seq 4 [1, 1].
    # Group 0: B_0 = (1 x .5 + 0 x .75) / 1.25 = .4; B_1 = (1 x 1 + 0 x 1.5) / 2.5 = .4; at t 2 only seq 0 is
    #   valid (the group's single longest response): B_2 = 0 -> seq 0 [.6, .6, 1], seq 1 [-.4, -.4].
    # Group 3, alone: B = 0 -> its returns [.4, .5].
    # Group 8: B_0 = (2 x .5 + 1 x .5) / 1 = 1.5; B_1 = (2 x 1 + 1 x 1.25) / 2.25 = 13/9
    #   -> seq 3 [.5, 5/9], seq 4 [-.5, -4/9]; the two are equally long, so no tail.
    adv, ret = compute_advantages("optimal_token_baseline", otb_inputs())
    assert torch.allclose(ret, torch.tensor([[1.0, 1, 1], [0, 0, 0], [0.4, 0.5, 0], [2, 2, 0], [1, 1, 0]]))
    expected = [[0.6, 0.6, 1.0], [-0.4, -0.4, 0.0], [0.4, 0.5, 0.0], [0.5, 5 / 9, 0.0], [-0.5, -4 / 9, 0.0]]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-6)


def test_rollout_importance_weights_scale_each_tokens_energy_by_their_square() -> None:
    # Weights 2 on seq 1's tokens, 1 elsewhere: seq 1's w = .75 x 4 = 3 -> W 3, 6. Group 0:
    # B_0 = .5 / (.5 + 3) = 1/7, B_1 = 1 / (1 + 6) = 1/7 -> seq 0 [6/7, 6/7, 1], seq 1 [-1/7, -1/7].
    weights = torch.ones(5, 3)
    weights[1] = 2.0
    adv, _ = compute_advantages("optimal_token_baseline", otb_inputs(rollout_is_weights=weights))
    assert torch.allclose(adv[:2], torch.tensor([[6 / 7, 6 / 7, 1.0], [-1 / 7, -1 / 7, 0.0]]), atol=1e-6)


def test_where_no_path_has_energy_the_baseline_is_zero() -> None:
    # A deterministic policy (pi 1, sum pi^2 1): w = 0, W = 0 for both samples; B = 0 as verl's 0 / eps,
    # so the advantage is the return: 1 and 0 (every gradient there is 0 anyway).
    ones = torch.ones(2, 1)
    inp = AdvantageInputs(torch.tensor([[1.0], [0.0]]), ones, torch.tensor([0, 0]), old_log_probs=torch.zeros(2, 1),
                          sum_pi_squared=ones)
    adv, _ = compute_advantages("optimal_token_baseline", inp)
    assert adv.tolist() == [[1.0], [0.0]]


def test_a_group_of_equal_returns_gets_exactly_zero() -> None:
    # 16 one-token samples of one fractional score with energies w = .1 .. 1.6 (sum_pi_squared set to give
    # them; it need not be a distribution's here): sum(G W) / sum(W) is not G in float, but the weighted mean
    # is taken of G - max G = 0.
    scores = torch.tensor([s for s in CONSTANT_SCORES for _ in range(16)]).unsqueeze(-1)
    groups = torch.tensor([g for g in range(len(CONSTANT_SCORES)) for _ in range(16)])
    pi = torch.full_like(scores, 0.3)
    sum_sq = 2 * pi - 1 + torch.arange(1, 17).repeat(len(CONSTANT_SCORES)).unsqueeze(-1) / 10  # w = i / 10
    inp = AdvantageInputs(scores, torch.ones_like(scores), groups, old_log_probs=pi.log(), sum_pi_squared=sum_sq)
    adv, _ = compute_advantages("optimal_token_baseline", inp)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_it_needs_the_old_log_prob_pass_statistics() -> None:
    inp = otb_inputs()
    inp.sum_pi_squared = None
    with pytest.raises(ValueError, match="sum_pi_squared"):
        compute_advantages("optimal_token_baseline", inp)


def test_sum_squared_probs_of_logits() -> None:
    # logits [0, 0]: .5^2 + .5^2 = .5; [ln 3, 0]: .75^2 + .25^2 = .625; at T = 2, [2 ln 3, 0] is [ln 3, 0].
    logits = torch.tensor([[0.0, 0.0], [LN(3), 0.0]])
    assert sum_squared_probs(logits).tolist() == pytest.approx([0.5, 0.625])
    assert sum_squared_probs(torch.tensor([[2 * LN(3), 0.0]]), temperature=2.0).tolist() == pytest.approx([0.625])


def test_the_log_prob_pass_returns_each_tokens_sum_of_squared_probabilities(tiny_model_dir, monkeypatch) -> None:
    # Against softmax(logits / T) of an ordinary padded forward, squared and summed; 2 tokens a chunk.
    from test_packing import padded_batch
    from transformers import AutoModelForCausalLM

    from rlkit.core.train import logprobs, packed_attention
    from rlkit.core.train.actor import response_log_probs

    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 2 * 64)
    padded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                  attn_implementation=packed_attention.register())
    batch = padded_batch([[5, 6, 7, 8], [9, 10]], [[14, 15, 16], [17]], prompt_width=4, response_width=3)
    with torch.no_grad():
        logits = padded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        position_ids=batch["position_ids"]).logits[:, 3:6]
        out = response_log_probs(packed, batch, device=torch.device("cpu"), micro_batch_tokens=64, temperature=0.7,
                                 with_entropy=False, fused_head=False, with_sum_pi_squared=True)
    want = (logits / 0.7).softmax(-1).pow(2).sum(-1) * batch["response_mask"]
    assert torch.allclose(out["sum_pi_squared"], want, atol=1e-5) and out["sum_pi_squared"][1, 1:].eq(0).all()
    without = response_log_probs(packed, batch, device=torch.device("cpu"), micro_batch_tokens=64, temperature=0.7,
                                 with_entropy=False, fused_head=False)
    assert "sum_pi_squared" not in without


BASE = ["model.path=some/model", "data.synthetic_task=echo", "algorithm.adv_estimator=optimal_token_baseline"]


def test_the_algorithm_runs_the_old_log_prob_pass_before_the_advantages() -> None:
    # grpo-demo makes one optimizer step per RL step, so with grpo the update's own log-probs are the old ones;
    # this estimator reads them (and sum_pi_squared) before the update: the pass runs.
    otb = Algorithm.from_config(load_config("grpo-demo", BASE))
    assert (otb.token_stats, otb.old_log_probs, otb.groups) == (True, "trainer", True)
    assert "old_log_prob" in phase_plan(otb)
    assert not Algorithm.from_config(load_config("grpo-demo", BASE[:2])).token_stats
    with pytest.raises(ConfigError, match="actor.old_log_probs"):
        load_config("grpo-demo", [*BASE, "actor.old_log_probs=rollout"])


def test_the_advantage_inputs_carry_the_pass_statistics_and_the_importance_weights() -> None:
    # TIS at cap 2: the engine's log-probs are the trainer's less ln 4 on the first token (weight 4, capped at 2)
    # and ln 1.5 on the second (weight 1.5).
    otb = Algorithm.from_config(load_config("grpo-demo", [*BASE, "actor.rollout_is_cap=2"]))
    old, sum_sq = torch.tensor([[-1.0, -2.0]]), torch.tensor([[0.4, 0.6]])
    batch = Batch({"response_mask": torch.ones(1, 2), "scores": torch.tensor([1.0]), "group_ids": torch.tensor([0]),
                   "old_log_probs": old, "sum_pi_squared": sum_sq,
                   "rollout_log_probs": old - torch.tensor([[LN(4), LN(1.5)]])})
    inputs = otb.advantage_inputs(batch, otb.kl_controller())
    assert inputs.old_log_probs is old and inputs.sum_pi_squared is sum_sq
    assert torch.allclose(inputs.rollout_is_weights, torch.tensor([[2.0, 1.5]]))
