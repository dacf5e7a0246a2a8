"""Advantage estimators: turn per-token rewards into per-token advantages and returns.

Every estimator is named in ``ADV_ESTIMATORS`` (rlkit.core.registrations) and called through
:func:`compute_advantages`, so a recipe picks one with a string. Layout is response-only:
``[B, R]`` tensors, right padded, ``response_mask`` 1 on real response tokens. Semantics follow
verl (``verl/trainer/ppo/core_algos.py``); docs/algorithms.md lists formulas and differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlkit.core.registrations import ADV_ESTIMATORS

# Variance epsilon used when whitening (verl's masked_whiten uses rsqrt(var + 1e-8)).
WHITEN_EPS = 1e-8


@dataclass
class AdvantageInputs:
    """What the trainer knows about a batch when it computes advantages."""

    token_rewards: Tensor  # [B,R]; score on the last valid token, minus per-token KL when in-reward KL is on
    response_mask: Tensor  # [B,R]
    group_ids: Tensor  # [B]; samples of one prompt share an id
    values: Tensor | None = None  # [B,R] critic values, for gae
    baseline_scores: Tensor | None = None  # [B] greedy-rollout score of each sequence's prompt, for remax
    # The old-log-prob pass's per-token statistics, for optimal_token_baseline: log-probs of the sampled tokens,
    # sum over the vocabulary of the squared probabilities, and the rollout importance weights when they are on.
    old_log_probs: Tensor | None = None  # [B,R]
    sum_pi_squared: Tensor | None = None  # [B,R]
    rollout_is_weights: Tensor | None = None  # [B,R]
    # The reward components gdpo normalises one by one (algorithm.gdpo_reward_keys, in order), [B,K].
    reward_components: Tensor | None = None


def compute_advantages(
    name: str,
    inputs: AdvantageInputs,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    gdpo_reward_weights: Sequence[float] | None = None,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Run the estimator ``name``; returns ``(advantages, returns)``, both ``[B,R]`` and 0 on padding.

    Every option is forwarded to every estimator; each one uses only those it documents, so the
    config layer can pass its values through without knowing which estimator is active.
    """
    estimator = ADV_ESTIMATORS.get(name)
    return estimator(
        inputs, gamma=gamma, lam=lam, norm_adv_by_std=norm_adv_by_std, gdpo_reward_weights=gdpo_reward_weights, eps=eps
    )


# --------------------------------------------------------------------------- helpers


def group_index(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Map arbitrary group ids to ``0..G-1``; returns (index [B], group sizes [G])."""
    _, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return index, counts


def shift_by_group_first(x: Tensor, index: Tensor, counts: Tensor) -> Tensor:
    """``x`` minus the first element of its group (``index``: group of each element, ``counts``: group sizes).

    A group statistic of the shifted values is exactly 0 for a group whose values are all equal: no rounding
    residue of a sum of equal floats survives into an advantage.
    """
    positions = torch.arange(x.numel(), device=x.device)
    first = torch.full_like(counts, x.numel()).scatter_reduce_(0, index, positions, "amin")
    return x - x[first][index]


def group_centred(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence (score - group mean, unbiased group std, group size), each ``[B]``, in float64.

    Exact for a group whose scores are all equal: centred 0 and std 0, not a rounding residue.
    Summing 16 copies of 0.1 in float32 does not give 1.6, so the textbook
    ``(s - mean) / (std + eps)`` turns a constant group into advantages of +-0.1 (verl has that
    flaw). Subtracting each group's first score before anything is summed makes every term of
    a constant group exactly 0, and float64 keeps the other groups' rounding far below float32's.

    Like verl, a group of one sample gets mean 0 and std 1: it has no peers to compare with,
    so its score passes through unchanged instead of becoming 0 (or NaN from an n-1 = 0 std).
    """
    index, counts = group_index(group_ids)
    x = scores.to(torch.float64)
    shifted = shift_by_group_first(x, index, counts)
    counts_f = counts.to(torch.float64)
    shift_mean = torch.zeros_like(counts_f).index_add_(0, index, shifted) / counts_f
    centred = shifted - shift_mean[index]
    sq_dev = torch.zeros_like(counts_f).index_add_(0, index, centred**2)
    std = (sq_dev / (counts_f - 1).clamp(min=1)).sqrt()[index]  # Bessel's correction, as torch.std
    single = counts[index] == 1
    centred = torch.where(single, x, centred)
    std = torch.where(single, torch.ones_like(std), std)
    return centred, std, counts[index]


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """Shift to mean 0 and scale to unit (unbiased) variance over the valid tokens only.

    Padding is excluded from the statistics and set to 0. With a single valid token the
    variance is 0 and the (already 0) centred value stays 0.
    """
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1)
    var = (((values - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def _scores(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """(mask as float, per-sequence score = sum of valid token rewards)."""
    mask = inputs.response_mask.to(inputs.token_rewards.dtype)
    return mask, (inputs.token_rewards * mask).sum(-1)


def _broadcast(seq_adv: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sequence-level estimators: the same scalar on every valid token; returns = advantages."""
    adv = seq_adv.unsqueeze(-1) * mask
    return adv, adv


# --------------------------------------------------------------------------- estimators


def gae(inputs: AdvantageInputs, *, gamma: float, lam: float, **_: object) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016) with a critic.

    delta_t = r_t + gamma * V_{t+1} - V_t ;  A_t = delta_t + gamma * lam * A_{t+1}, with V and A
    after the last valid token taken as 0. returns = A + V (the critic's target, before
    whitening); the advantages handed to the policy loss are then whitened over valid tokens.
    """
    if inputs.values is None:
        raise ValueError("advantage estimator 'gae' needs critic values (AdvantageInputs.values)")
    mask = inputs.response_mask.to(inputs.token_rewards.dtype)
    rewards = inputs.token_rewards * mask
    values = inputs.values * mask
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        # Padding must not move the recursion: keep the running value/advantage unchanged there.
        m = mask[:, t]
        next_adv = a_t * m + next_adv * (1 - m)
        next_value = values[:, t] * m + next_value * (1 - m)
        adv[:, t] = next_adv
    returns = (adv + values) * mask
    return masked_whiten(adv, mask), returns


def grpo(inputs: AdvantageInputs, *, norm_adv_by_std: bool, eps: float, **_: object) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024): (score - group mean) / (group std + eps).

    ``norm_adv_by_std=False`` drops the std division: Dr.GRPO (Liu et al. 2025), which argues
    the division over-weights groups whose scores barely differ.
    """
    mask, scores = _scores(inputs)
    adv, std, _ = group_centred(scores, inputs.group_ids)
    if norm_adv_by_std:
        adv = adv / (std + eps)
    return _broadcast(adv.to(scores.dtype), mask)


def rloo(inputs: AdvantageInputs, **_: object) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): score minus the mean score of the *other* samples of the group.

    s_i - (S - s_i)/(n-1) equals n/(n-1) * (s_i - mean), which is how verl writes it and how it is
    computed here, from the exact group centring (a group of equal scores gets exactly 0). A
    group of one has no others, so its advantage is its raw score (verl does the same).
    """
    mask, scores = _scores(inputs)
    centred, _, counts = group_centred(scores, inputs.group_ids)
    n = counts.to(torch.float64)
    adv = torch.where(counts > 1, centred * n / (n - 1).clamp(min=1), centred)
    return _broadcast(adv.to(scores.dtype), mask)


def remax(inputs: AdvantageInputs, **_: object) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505): each token's reward-to-go minus the score of a greedy rollout
    of the same prompt, A_t = sum_{k>=t} r_k - b; returns are the reward-to-go.

    With all reward on the last token that is s - b on every token; with KL in the reward (the `remax`
    recipe) a token's advantage carries only the penalties from it on, as verl's ReMax does.
    """
    if inputs.baseline_scores is None:
        raise ValueError("advantage estimator 'remax' needs greedy-rollout scores (AdvantageInputs.baseline_scores)")
    mask = inputs.response_mask.to(inputs.token_rewards.dtype)
    returns = (inputs.token_rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    baseline = inputs.baseline_scores.to(returns.dtype).unsqueeze(-1)
    return (returns - baseline) * mask, returns


def reinforce_plus_plus(inputs: AdvantageInputs, *, gamma: float, **_: object) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go per token, whitened over the whole batch.

    G_t = sum_{k>=t} gamma^(k-t) r_k. Whitening over all valid tokens of the batch (not per
    group) is the paper's global normalisation; returns are the raw G_t.
    """
    mask = inputs.response_mask.to(inputs.token_rewards.dtype)
    rewards = inputs.token_rewards * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running  # padding is on the right with reward 0
        returns[:, t] = running
    returns = returns * mask
    return masked_whiten(returns, mask), returns


def reinforce_plus_plus_baseline(inputs: AdvantageInputs, **_: object) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline: score minus group mean (size-1 groups: mean 0), whitened over the batch.

    The whitening is over valid *tokens*, as in verl, so long sequences weigh more in the
    batch mean/std than short ones.
    """
    mask, scores = _scores(inputs)
    centred, _, _ = group_centred(scores, inputs.group_ids)
    adv = masked_whiten(centred.to(scores.dtype).unsqueeze(-1) * mask, mask)
    return adv, adv
