"""The Optimal Token Baseline for multi-turn (tool-integrated) episodes: the samples of a group are compared at
the policy's k-th own token, not at the k-th position of the response.

Registered as ``tir_optimal_token_baseline`` (verl's name) in ``ADV_ESTIMATORS``; docs/algorithms.md gives the
formula. Its inputs are optimal_token_baseline's (rlkit.core.algos.needs: ``token_stats``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs
from rlkit.core.algos.optimal_token_baseline import group_baseline, returns_and_path_energy


def tir_optimal_token_baseline(inputs: AdvantageInputs, **_: object) -> tuple[Tensor, Tensor]:
    """Optimal Token Baseline aligned on the policy's own tokens (Li et al. 2026, *The Optimal Token Baseline:
    Variance Reduction for Long-Horizon LLM-RL*, arXiv 2602.07078; TIR: tool-integrated reasoning).

    G and W as optimal_token_baseline's: G_t = sum_{k >= t} r_k over the policy's tokens, W_t = sum_{j <= t} w_j
    with w_j = (1 - 2 pi_j + sum_v pi_v^2) (times rho_j^2 with rollout importance weights on). Number each
    sample's valid tokens k = 0, 1, ... (a multi-turn episode's tool and environment tokens, mask 0, are
    skipped). Per group G and index k, over the samples that have a k-th token:
        B_k = sum_i G_i,(k) W_i,(k) / sum_i W_i,(k) ;   A_i,(k) = G_i,(k) - B_k ;   returns = G.
    No hyper-parameters. Where the mask has no holes this is optimal_token_baseline exactly.

    As verl's ``compute_multi_turn_optimal_token_baseline_advantage``: a group of one sample (samples without a
    valid token left out) gets B = 0, and so does the unique longest sample's tail beyond the group's second
    longest (``handle_zero_tail``). Differences from verl are optimal_token_baseline's (no 1e-8 in the
    denominator, exact zeros for equal returns).
    """
    returns, path_energy, valid = returns_and_path_energy(inputs)
    # Each row's valid tokens moved to its front, in order: column k of `order` is where its k-th token sits.
    order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
    compact = group_baseline(
        returns.gather(-1, order), path_energy.gather(-1, order), valid.gather(-1, order), inputs.group_ids
    )
    baseline = torch.zeros_like(compact).scatter_(-1, order, compact)  # back to each token's own position
    dtype = inputs.token_rewards.dtype
    return ((returns - baseline) * valid).to(dtype), returns.to(dtype)
