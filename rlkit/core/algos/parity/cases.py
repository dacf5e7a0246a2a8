"""Hand-computed cases: one small batch per registered advantage estimator, with the expected output worked
out by hand in the comment above it. Policy losses, KL estimators and aggregation modes: loss_cases.py.

A case's inputs and expected outputs are plain numbers (nested lists), so a case reads as its arithmetic;
`rlkit algos check` (rlkit.core.algos.parity.check) builds the tensors, calls the registered function and
compares. Most batches are those of tests/test_algos_*.py (cited), which pin the same functions. Padding slots
hold garbage (G) wherever the function must not read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

LN = math.log
G = 9.0  # garbage in a padding slot: a function that reads it gets a visibly wrong answer
EPS = 1e-6  # compute_advantages' default std epsilon (grpo, grpo_passk)

ADVANTAGE = "advantage estimator"
POLICY_LOSS = "policy loss"
KL = "kl estimator"
AGGREGATION = "loss aggregation"


@dataclass(frozen=True)
class Case:
    """One batch for one registered name: `inputs` are the function's tensors as nested lists, `options` its
    keyword arguments, `expected` each output's hand-worked numbers (for a loss or a KL estimator, "grad" is the
    gradient of the summed output with respect to log_probs)."""

    kind: str
    name: str
    inputs: dict[str, Any]
    expected: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the test whose batch and numbers these are


def sequence_batch(scores: list[float], lengths: list[int], r: int = 3) -> dict[str, list]:
    """Token rewards with each score on its sequence's last valid token and G on padding, and the mask."""
    rewards = [[0.0] * n + [G] * (r - n) for n in lengths]
    for row, score, n in zip(rewards, scores, lengths, strict=True):
        row[n - 1] = score
    return {"token_rewards": rewards, "response_mask": [[1] * n + [0] * (r - n) for n in lengths]}


def on_tokens(values: list[float], lengths: list[int], r: int = 3) -> list[list[float]]:
    """A sequence-level value on each of its valid tokens, 0 on padding."""
    return [[v] * n + [0.0] * (r - n) for v, n in zip(values, lengths, strict=True)]


def whitened(values: list[float]) -> list[float]:
    """(x - mean) / std with the unbiased std, as the estimators whiten over a batch's valid tokens."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / std for v in values]


def _sequence_case(name: str, scores, lengths, group_ids, advantages, source: str, **options: Any) -> Case:
    """A sequence-level estimator's case: the advantage on every valid token, returns equal to it."""
    expected = on_tokens(advantages, lengths)
    inputs = {**sequence_batch(scores, lengths), "group_ids": group_ids}
    return Case(ADVANTAGE, name, inputs, {"advantages": expected, "returns": expected}, options, source)


# gamma .9, lam .8 (gamma lam = .72); V and A are 0 after the last valid token.
#   Seq 0: r [0, 0, 1], V [.5, .4, .6]: t2 delta = 1 - .6 = .4, A2 = .4; t1 delta = .9 x .6 - .4 = .14,
#     A1 = .14 + .72 x .4 = .428; t0 delta = .9 x .4 - .5 = -.14, A0 = -.14 + .72 x .428 = .16816.
#     returns = A + V = [.66816, .828, 1].
#   Seq 1: r [0, 2 | pad], V [1, .5 | garbage]: t1 delta = 2 - .5 = 1.5, A1 = 1.5; t0 delta = .9 x .5 - 1 = -.55,
#     A0 = -.55 + .72 x 1.5 = .53. returns = [1.53, 2, 0].
#   Advantages: the five raw A whitened over the batch's valid tokens.
_GAE_WHITE = whitened([0.16816, 0.428, 0.4, 0.53, 1.5])
GAE = Case(
    ADVANTAGE,
    "gae",
    {
        "token_rewards": [[0.0, 0.0, 1.0], [0.0, 2.0, G]],
        "response_mask": [[1, 1, 1], [1, 1, 0]],
        "group_ids": [0, 1],
        "values": [[0.5, 0.4, 0.6], [1.0, 0.5, 7.0]],
    },
    {"advantages": [_GAE_WHITE[:3], [*_GAE_WHITE[3:], 0.0]], "returns": [[0.66816, 0.828, 1.0], [1.53, 2.0, 0.0]]},
    {"gamma": 0.9, "lam": 0.8},
    "tests/test_algos_advantages.py::test_gae_recursion_and_whitening",
)

# Ids 7 and 3, interleaved. Group 7 = seqs 0, 2, 4, scores 1, 0, 2: mean 1, var (0 + 1 + 1) / 2 = 1, std 1
# -> 0, -1, 1. Group 3 = seqs 1, 3, scores 3, 1: mean 2, var (1 + 1) / 1 = 2 -> +-1 / sqrt 2 (each over std + eps).
_S2 = math.sqrt(2.0)
GRPO = _sequence_case(
    "grpo",
    [1.0, 3.0, 0.0, 1.0, 2.0],
    [3, 1, 2, 3, 1],
    [7, 3, 7, 3, 7],
    [0.0, 1 / (_S2 + EPS), -1 / (1 + EPS), -1 / (_S2 + EPS), 1 / (1 + EPS)],
    "tests/test_algos_advantages.py::test_grpo_groups_by_id_with_unbiased_std",
)

# Group 1 = scores 1, 0, 2: leave-one-out baselines (0 + 2)/2 = 1, (1 + 2)/2 = 1.5, (1 + 0)/2 = .5 -> 0, -1.5, 1.5.
# Group 2 = scores 3, 1 -> 3 - 1 = 2, 1 - 3 = -2. Group 8 alone -> its raw score 5.
RLOO = _sequence_case(
    "rloo",
    [1.0, 3.0, 0.0, 2.0, 1.0, 5.0],
    [1, 2, 3, 1, 2, 3],
    [1, 2, 1, 1, 2, 8],
    [0.0, 2.0, -1.5, 1.5, -2.0, 5.0],
    "tests/test_algos_advantages.py::test_rloo_leave_one_out_baseline",
)

# Seq 0: KL penalties -.1, -.2, then 1 - .3 on its last token; seq 1: -.1, then .5 - .2, one padding slot.
# Reward-to-go [.4, .5, .7] and [.2, .3, 0]; greedy scores .25, .5 -> [.15, .25, .45] and [-.3, -.2, 0].
REMAX = Case(
    ADVANTAGE,
    "remax",
    {
        "token_rewards": [[-0.1, -0.2, 0.7], [-0.1, 0.3, G]],
        "response_mask": [[1, 1, 1], [1, 1, 0]],
        "group_ids": [0, 1],
        "baseline_scores": [0.25, 0.5],
    },
    {"advantages": [[0.15, 0.25, 0.45], [-0.3, -0.2, 0.0]], "returns": [[0.4, 0.5, 0.7], [0.2, 0.3, 0.0]]},
    source="tests/test_algos_advantages.py::test_remax_with_kl_in_the_reward_uses_each_tokens_reward_to_go",
)

# gamma .5. Seq 0 rewards [1, 0, 2]: G = [1 + .5 x 1, 0 + .5 x 2, 2] = [1.5, 1, 2]. Seq 1 [0, 4 | pad]: [2, 4].
# Valid G 1.5, 1, 2, 2, 4: mean 2.1; deviations -.6, -1.1, -.1, -.1, 1.9; squares sum 5.2; unbiased var 1.3.
_SD_RPP = math.sqrt(1.3)
REINFORCE_PLUS_PLUS = Case(
    ADVANTAGE,
    "reinforce_plus_plus",
    {"token_rewards": [[1.0, 0.0, 2.0], [0.0, 4.0, G]], "response_mask": [[1, 1, 1], [1, 1, 0]], "group_ids": [0, 0]},
    {
        "advantages": [[-0.6 / _SD_RPP, -1.1 / _SD_RPP, -0.1 / _SD_RPP], [-0.1 / _SD_RPP, 1.9 / _SD_RPP, 0.0]],
        "returns": [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]],
    },
    {"gamma": 0.5},
    "tests/test_algos_advantages.py::test_reinforce_plus_plus_discounts_then_whitens_batch",
)

# Group 1 = scores 2 (2 tokens), 0 (1 token): mean 1 -> 1, -1. Group 2 alone: mean 0 -> 5 (2 tokens).
# Tokens 1, 1, -1, 5, 5: mean 2.2; deviations -1.2, -1.2, -3.2, 2.8, 2.8; squares sum 28.8; unbiased var 7.2.
_SD_RPPB = math.sqrt(7.2)
_RPPB = [[-1.2 / _SD_RPPB, -1.2 / _SD_RPPB, 0.0], [-3.2 / _SD_RPPB, 0.0, 0.0], [2.8 / _SD_RPPB, 2.8 / _SD_RPPB, 0.0]]
REINFORCE_PLUS_PLUS_BASELINE = Case(
    ADVANTAGE,
    "reinforce_plus_plus_baseline",
    {**sequence_batch([2.0, 0.0, 5.0], [2, 1, 2]), "group_ids": [1, 1, 2]},
    {"advantages": _RPPB, "returns": _RPPB},
    source="tests/test_algos_advantages.py::test_reinforce_plus_plus_baseline_group_mean_then_batch_whiten",
)

# Group 4 = seqs 0, 2, 3, 5, scores 1, 0, 3, 2: best 3 (seq 3), runner-up 2 -> margin 1; mean 1.5, squared
# deviations .25 + 2.25 + 2.25 + .25 = 5, var 5/3. Group 1 = seqs 1, 4, scores .5, 2.5: best seq 4, margin 2,
# std |2.5 - .5| / sqrt 2 = sqrt 2. Every other sample 0.
GRPO_PASSK = _sequence_case(
    "grpo_passk",
    [1.0, 0.5, 0.0, 3.0, 2.5, 2.0],
    [2, 3, 1, 3, 2, 1],
    [4, 1, 4, 4, 1, 4],
    [0.0, 0.0, 0.0, 1 / (math.sqrt(5 / 3) + EPS), 2 / (_S2 + EPS), 0.0],
    "tests/test_algos_grpo_passk.py::test_only_the_best_sample_of_each_group_gets_its_margin_over_the_runner_up",
)

# Group 0 = seqs 0, 2, 4: scores 1, 0, 1 with 2, 3, 1 tokens: b = (2 x 1 + 3 x 0 + 1 x 1) / 6 = .5 -> .5, -.5, .5.
# Group 5 = seqs 1, 3: scores 2, 4 with 3, 1 tokens: b = (3 x 2 + 1 x 4) / 4 = 2.5 -> -.5, 1.5. Group 9 alone: 3.
OPO = _sequence_case(
    "opo",
    [1.0, 2.0, 0.0, 4.0, 1.0, 3.0],
    [2, 3, 3, 1, 1, 2],
    [0, 5, 0, 5, 0, 9],
    [0.5, -0.5, -0.5, 1.5, 0.5, 3.0],
    "tests/test_algos_opo.py::test_the_baseline_is_the_length_weighted_mean_score_of_the_group",
)

# w_t = 1 - 2 pi_t + sum pi^2, W_t its running sum. Seq 0: pi .5 x 3, sum .5 -> w .5 -> W .5, 1, 1.5.
# Seq 1: pi .25, sum .25 -> w .75 -> W .75, 1.5. Seq 3: w .5, .5 -> W .5, 1. Seq 4: pi .5, .25 with sums .5, .25
# -> w .5, .75 -> W .5, 1.25. Returns: seq 0 [1, 1, 1], seq 1 [0, 0], seq 2 [.4, .5], seq 3 [2, 2], seq 4 [1, 1].
# Group 0: B_0 = (1 x .5 + 0 x .75) / 1.25 = .4, B_1 = (1 x 1 + 0 x 1.5) / 2.5 = .4; at t 2 only seq 0 is valid:
#   B_2 = 0 -> seq 0 [.6, .6, 1], seq 1 [-.4, -.4]. Group 3 (seq 2) alone: B = 0 -> [.4, .5].
# Group 8: B_0 = (2 x .5 + 1 x .5) / 1 = 1.5, B_1 = (2 x 1 + 1 x 1.25) / 2.25 = 13/9 -> [.5, 5/9], [-.5, -4/9].
_PI = [[0.5, 0.5, 0.5], [0.25, 0.25, G], [0.5, 0.5, G], [0.5, 0.5, G], [0.5, 0.25, G]]
OPTIMAL_TOKEN_BASELINE = Case(
    ADVANTAGE,
    "optimal_token_baseline",
    {
        "token_rewards": [[0.0, 0.0, 1.0], [0.0, 0.0, G], [-0.1, 0.5, G], [0.0, 2.0, G], [0.0, 1.0, G]],
        "response_mask": [[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]],
        "group_ids": [0, 0, 3, 8, 8],
        "old_log_probs": [[LN(p) for p in row] for row in _PI],
        "sum_pi_squared": _PI,  # this batch's sums of squared probabilities equal its pi_t, row by row
    },
    {
        "advantages": [[0.6, 0.6, 1.0], [-0.4, -0.4, 0.0], [0.4, 0.5, 0.0], [0.5, 5 / 9, 0.0], [-0.5, -4 / 9, 0.0]],
        "returns": [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.4, 0.5, 0.0], [2.0, 2.0, 0.0], [1.0, 1.0, 0.0]],
    },
    source="tests/test_algos_optimal_token_baseline.py::test_the_baseline_is_the_energy_weighted_mean_return_at_each_"
    "position",
)

# R = 4; a 0 before a 1 in the mask is a tool token: the samples are compared at their k-th own token. W: the running
# sum of w = 1 - 2 pi + sum pi^2 over each sample's own tokens (this batch's sums equal its pi, token by token).
# Group 0: seq 0 (positions 0, 3; pi .5, .5 -> W .5, 1; scores 1), seq 1 (positions 0, 1; pi .25 -> W .75, 1.5;
#   scores 0): B_0 = .5 / 1.25 = .4, B_1 = 1 / 2.5 = .4 -> seq 0 [.6, 0, 0, .6], seq 1 [-.4, -.4, 0, 0].
# Group 5: seq 2 (positions 0-2, pi .5 -> W .5, 1, 1.5; scores 2), seq 3 (positions 0, 2; pi .5, .25 -> W .5, 1.25;
#   scores 1): B_0 = (1 + .5) / 1 = 1.5, B_1 = (2 + 1.25) / 2.25 = 13/9, k = 2 only seq 2: B = 0
#   -> seq 2 [.5, 5/9, 2, 0], seq 3 [-.5, 0, -4/9, 0]. Group 9: seq 5 has no token, seq 4 alone: its returns.
_TIR_PI = [[0.5, G, G, 0.5], [0.25, 0.25, G, G], [0.5, 0.5, 0.5, G], [0.5, G, 0.25, G], [G, 0.5, 0.5, G], [G] * 4]
TIR_OPTIMAL_TOKEN_BASELINE = Case(
    ADVANTAGE,
    "tir_optimal_token_baseline",
    {
        "token_rewards": [
            [0.0, G, G, 1.0],
            [0.0, 0.0, G, G],
            [0.0, 0.0, 2.0, G],
            [0.0, G, 1.0, G],
            [G, -0.1, 0.5, G],
            [G] * 4,
        ],
        "response_mask": [[1, 0, 0, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]],
        "group_ids": [0, 0, 5, 5, 9, 9],
        "old_log_probs": [[LN(p) for p in row] for row in _TIR_PI],
        "sum_pi_squared": _TIR_PI,
    },
    {
        "advantages": [
            [0.6, 0, 0, 0.6],
            [-0.4, -0.4, 0, 0],
            [0.5, 5 / 9, 2, 0],
            [-0.5, 0, -4 / 9, 0],
            [0, 0.4, 0.5, 0],
            [0, 0, 0, 0],
        ],
        "returns": [[1.0, 0, 0, 1], [0, 0, 0, 0], [2, 2, 2, 0], [1, 0, 1, 0], [0, 0.4, 0.5, 0], [0, 0, 0, 0]],
    },
    source="tests/test_algos_tir_optimal_token_baseline.py::test_the_samples_are_compared_at_their_kth_own_token",
)

# Components (accuracy, format): group 0 (1, 1), (0, 0); group 1 (1, 0), (0, 0); one token each. Weights (2, 1),
# centred only (norm_adv_by_std off): group 0 2 x .5 + .5 = 1.5 -> +-1.5; group 1 2 x .5 + 0 -> +-1. Whitened over
# the 4 tokens: mean 0, unbiased var (2.25 + 2.25 + 1 + 1) / 3 = 13/6 -> each times sqrt(6/13).
_GDPO = [[v * math.sqrt(6 / 13), 0.0] for v in (1.5, -1.5, 1.0, -1.0)]
GDPO = Case(
    ADVANTAGE,
    "gdpo",
    {
        "token_rewards": [[2.0, G], [0.0, G], [1.0, G], [0.0, G]],
        "response_mask": [[1, 0]] * 4,
        "group_ids": [0, 0, 1, 1],
        "reward_components": [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]],
    },
    {"advantages": _GDPO, "returns": _GDPO},
    {"norm_adv_by_std": False, "gdpo_reward_weights": [2.0, 1.0]},
    "tests/test_algos_gdpo.py::test_weights_and_no_std_division",
)

ADVANTAGE_CASES = (
    GAE,
    GRPO,
    RLOO,
    REMAX,
    REINFORCE_PLUS_PLUS,
    REINFORCE_PLUS_PLUS_BASELINE,
    GRPO_PASSK,
    OPO,
    OPTIMAL_TOKEN_BASELINE,
    TIR_OPTIMAL_TOKEN_BASELINE,
    GDPO,
)
