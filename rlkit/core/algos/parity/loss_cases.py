"""Hand-computed cases for every registered policy loss and KL estimator and every aggregation mode (the
advantage estimators' are in cases.py). A loss's "loss" is its per-token loss [B,R], "grad" the gradient of
its sum with respect to log_probs: dloss/dlogp for each token, since a token's loss reads only its own
log-prob, except the sequence-level gmpo. Ratios are written as old_log_probs = log_probs - ln r.
"""

from __future__ import annotations

import math

from rlkit.core.algos.parity.cases import AGGREGATION, KL, LN, POLICY_LOSS, Case


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _loss(name: str, log_probs, ratios, advantages, mask, expected, source: str = "", **options) -> Case:
    """A policy loss's case from its log-probs and ratios r (old = logp - ln r; padding: old = logp)."""
    old = [[lp - LN(r) for lp, r in zip(lps, rs, strict=True)] for lps, rs in zip(log_probs, ratios, strict=True)]
    inputs = {"log_probs": log_probs, "old_log_probs": old, "advantages": advantages, "response_mask": mask}
    return Case(POLICY_LOSS, name, inputs, expected, options, source)


# Clip .2/.2, dual clip 3 (the function's default). loss = max(-A r, -A clip(r, .8, 1.2)):
#   r 1.25, A 1: max(-1.25, -1.2) = -1.2, clipped: no gradient.  r .7, A -1: max(.7, .8) = .8, clipped: none.
#   r .7, A 1: max(-.7, -.8) = -.7, gradient -A r = -.7.          r 1.1, A -2: 2.2 (inside the clip, below the
#   cap -A c = 6), gradient -A r = 2.2. Padding: 0 whatever its log-prob (50).
VANILLA = _loss(
    "vanilla",
    [[-1.0, -2.0, 50.0], [-1.0, -2.0, 50.0]],
    [[1.25, 0.7, 1.0], [0.7, 1.1, 1.0]],
    [[1.0, -1.0, 0.0], [1.0, -2.0, 0.0]],
    [[1, 1, 0], [1, 1, 0]],
    {"loss": [[-1.2, 0.8, 0.0], [-0.7, 2.2, 0.0]], "grad": [[0.0, 0.0, 0.0], [-0.7, 2.2, 0.0]]},
    "tests/test_algos_losses.py::test_vanilla_ppo_clip",
)

# No dual clip. Seq 0: token log-ratios .1, .3 -> s = exp(.2) = 1.2214 > 1.2, A 1: clipped, -1.2 on both tokens,
# no gradient. Seq 1: log-ratio -.5 (one token) -> s = exp(-.5), A 1: -exp(-.5), gradient -A s = -exp(-.5).
GSPO = _loss(
    "gspo",
    [[-1.0, -2.0], [-1.0, 50.0]],
    [[math.exp(0.1), math.exp(0.3)], [math.exp(-0.5), 1.0]],
    [[1.0, 1.0], [1.0, 0.0]],
    [[1, 1], [1, 0]],
    {"loss": [[-1.2, -1.2], [-math.exp(-0.5), 0.0]], "grad": [[0.0, 0.0], [-math.exp(-0.5), 0.0]]},
    "tests/test_algos_losses.py::test_gspo_sequence_ratio_and_clip",
    clip_ratio_c=None,
)

# Bounds .8, 1.2 on the detached weight; loss = -w A logp, gradient -w A.
#   p .6, r 1.5 -> w 1.2, A 1: -1.2 ln .6, gradient -1.2.   p .3, r .6 -> w .8, A -1: .8 ln .3, gradient .8.
#   p .5, r 1 -> w 1, A 2: -2 ln .5, gradient -2.
CISPO = _loss(
    "cispo",
    [[LN(0.6), LN(0.3)], [LN(0.5), 50.0]],
    [[1.5, 0.6], [1.0, 1.0]],
    [[1.0, -1.0], [2.0, 0.0]],
    [[1, 1], [1, 0]],
    {"loss": [[-1.2 * LN(0.6), 0.8 * LN(0.3)], [-2 * LN(0.5), 0.0]], "grad": [[-1.2, 0.8], [-2.0, 0.0]]},
    is_clip_low=0.2,
    is_clip_high=0.2,
)

# Log-probs -1, -2, -3, -2, -2 (mean -2), advantages 2, 1, -2, -1, 0 (mean 0): cov = (logp + 2) A = 2, 0, 2, 0, 0;
# tokens 0 and 2 lie in (1, 5). Ratios 1.1, 1.5, .9, 1, 1: token 1 is clipped (A > 0, r > 1.2). clip_cov_ratio .4:
# max(1, int(.4 x 5)) = 2 draws, the two candidates. PPO's loss (.2/.2, dual clip 3): -2.2, max(-1.5, -1.2) = -1.2,
# 1.8, 1, 0; gradient -A r: token 0 and 2 detached, token 1 clipped, token 3: 1.
CLIP_COV = _loss(
    "clip_cov",
    [[-1.0, -2.0, -3.0, -2.0, -2.0, 50.0]],
    [[1.1, 1.5, 0.9, 1.0, 1.0, 1.0]],
    [[2.0, 1.0, -2.0, -1.0, 0.0, 0.0]],
    [[1, 1, 1, 1, 1, 0]],
    {"loss": [[-2.2, -1.2, 1.8, 1.0, 0.0, 0.0]], "grad": [[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]},
    "tests/test_algos_cov.py::test_clip_cov_detaches_the_drawn_tokens_and_keeps_their_loss_value",
    clip_cov_ratio=0.4,
)

# Log-probs -1, -3, -2 (mean -2), advantages 3, 1, .5 (mean 1.5): cov = 1 x 1.5, -1 x -.5, 0 = 1.5, .5, 0.
# kl_cov_ratio 2e-4: max(1, int(.0006)) = 1 token, the largest cov: token 0. Log-ratios .5, 0, 0:
#   token 0: -3 e^.5 + |.5|, gradient -3 e^.5 + 1 (d|l|/dl = 1).  tokens 1, 2: -A, gradient -A r = -1, -.5.
KL_COV = _loss(
    "kl_cov",
    [[-1.0, -3.0, -2.0, 50.0]],
    [[math.exp(0.5), 1.0, 1.0, 1.0]],
    [[3.0, 1.0, 0.5, 0.0]],
    [[1, 1, 1, 0]],
    {"loss": [[-3 * math.exp(0.5) + 0.5, -1.0, -0.5, 0.0]], "grad": [[-3 * math.exp(0.5) + 1, -1.0, -0.5, 0.0]]},
)

# p = pi(y_t), q = pi_old(y_t); loss = -A min(r, 20) m logp, gradient -A min(r, 20) m.
#   p .6, q .4, A 1: p - q = .2 > .15: masked, 0.       p .5, q .4, A 1: .1 kept, r 1.25: -1.25 ln .5, grad -1.25.
#   p .2, q .4, A -1: q - p = .2 > .15: masked, 0.      p .3, q .4, A -2: .1 kept, r .75: 1.5 ln .3, grad 1.5.
_DPPO_LOG_PROBS = [[LN(0.6), LN(0.5)], [LN(0.2), LN(0.3)]]
_DPPO_RATIOS = [[1.5, 1.25], [0.5, 0.75]]
_DPPO_ADVANTAGES = [[1.0, 1.0], [-1.0, -2.0]]
_DPPO_EXPECTED = {"loss": [[0.0, -1.25 * LN(0.5)], [0.0, 1.5 * LN(0.3)]], "grad": [[0.0, -1.25], [0.0, 1.5]]}
DPPO_TV = _loss("dppo_tv", _DPPO_LOG_PROBS, _DPPO_RATIOS, _DPPO_ADVANTAGES, [[1, 1], [1, 1]], _DPPO_EXPECTED)

# The same tokens by binary KL D = q ln(q/p) + (1-q) ln((1-q)/(1-p)), thresholds .05:
#   p .6, q .4: D = .4 ln(2/3) + .6 ln 1.5 = .2 ln 1.5 = .0811 > .05 with p > q, A 1: masked.
#   p .5, q .4: D = .4 ln .8 + .6 ln 1.2 = -.0893 + .1094 = .0201: kept.
#   p .2, q .4: D = .4 ln 2 + .6 ln .75 = .2773 - .1726 = .1047 > .05 with p < q, A -1: masked.
#   p .3, q .4: D = .4 ln(4/3) + .6 ln(6/7) = .1151 - .0925 = .0226: kept. Hence the TV case's numbers.
DPPO_KL = _loss("dppo_kl", _DPPO_LOG_PROBS, _DPPO_RATIOS, _DPPO_ADVANTAGES, [[1, 1], [1, 1]], _DPPO_EXPECTED)


# Log bounds .4/.4. Seq 0: log-ratios .1, .6, A 1: the pessimistic (smaller) of l and clip(l) is .1, .4 -> r = e^.25,
# -e^.25 on both tokens; the summed loss -2 e^.25 has gradient -2 e^.25 / 2 = -e^.25 through token 0 only (token 1
# takes its clipped side). Seq 1: log-ratio -.5, A -1: the larger of -.5 and -.4 is -.4 (clipped) -> e^-.4, no gradient.
def _gmpo(name: str) -> Case:
    return _loss(
        name,
        [[-1.0, -2.0], [-1.0, 50.0]],
        [[math.exp(0.1), math.exp(0.6)], [math.exp(-0.5), 1.0]],
        [[1.0, 1.0], [-1.0, 0.0]],
        [[1, 1], [1, 0]],
        {"loss": [[-math.exp(0.25), -math.exp(0.25)], [math.exp(-0.4), 0.0]], "grad": [[-math.exp(0.25), 0.0], [0, 0]]},
    )


# loss = -A logp, gradient -A: p .5, A 1: ln 2; p .25, A -2: 2 ln .25.
GPG = _loss(
    "gpg",
    [[LN(0.5), LN(0.25), 50.0]],
    [[1.0, 3.0, 1.0]],
    [[1.0, -2.0, 0.0]],
    [[1, 1, 0]],
    {"loss": [[LN(2.0), 2 * LN(0.25), 0.0]], "grad": [[-1.0, 2.0, 0.0]]},
)

# loss = -(4/tau) sigmoid(tau (r - 1)) A; gradient -A 4 s (1 - s) r with s = sigmoid(tau (r - 1)).
#   r 1, A 1 (tau_pos 1): s = .5 -> -2, gradient -1.
#   r 2, A -1 (tau_neg 1.05): s = sigmoid(1.05) -> (4 / 1.05) s, gradient 4 s (1 - s) x 2.
_S = _sigmoid(1.05)
SAPO = _loss(
    "sapo",
    [[-1.0, -2.0, 50.0]],
    [[1.0, 2.0, 1.0]],
    [[1.0, -1.0, 0.0]],
    [[1, 1, 0]],
    {"loss": [[-2.0, 4 / 1.05 * _S, 0.0]], "grad": [[-1.0, 8 * _S * (1 - _S), 0.0]]},
)

GMPO, GEO_MEAN = _gmpo("gmpo"), _gmpo("geo_mean")  # geo_mean: verl's name for the same function
POLICY_LOSS_CASES = (VANILLA, GSPO, CISPO, CLIP_COV, KL_COV, DPPO_TV, DPPO_KL, GMPO, GEO_MEAN, GPG, SAPO)

# logp - ref = d = [.5, -1]. k1 = d (gradient 1); k2 = .5 d^2 = .125, .5 (gradient d); k3 = exp(-d) + d - 1 =
# e^-.5 - .5, e - 2 (gradient 1 - exp(-d) = 1 - e^-.5, 1 - e); abs = |d| (gradient sign d). The straight-through
# k1+, k3+ keep k1's and k3's value and take k2's gradient d.
_KL_INPUTS = {"log_probs": [[-1.0, -2.0]], "ref_log_probs": [[-1.5, -1.0]]}
_K1 = {"value": [[0.5, -1.0]], "grad": [[1.0, 1.0]]}
_K2 = {"value": [[0.125, 0.5]], "grad": [[0.5, -1.0]]}
_K3 = {"value": [[math.exp(-0.5) - 0.5, math.e - 2]], "grad": [[1 - math.exp(-0.5), 1 - math.e]]}
_ABS = {"value": [[0.5, 1.0]], "grad": [[1.0, -1.0]]}
_KL_EXPECTED = {
    "k1": _K1,
    "kl": _K1,
    "k2": _K2,
    "mse": _K2,
    "k3": _K3,
    "low_var_kl": _K3,
    "abs": _ABS,
    "k1+": {**_K1, "grad": _K2["grad"]},
    "k3+": {**_K3, "grad": _K2["grad"]},
    "low_var_kl+": {**_K3, "grad": _K2["grad"]},
}
KL_CASES = tuple(
    Case(KL, name, _KL_INPUTS, expected, source="tests/test_algos_kl.py") for name, expected in _KL_EXPECTED.items()
)

# Per-token loss [[1, 2, 3], [4, pad, pad]] (100 on padding): 4 valid tokens, 2 sequences, R = 3.
#   token-mean (1 + 2 + 3 + 4) / 4 = 2.5; token-sum 10; seq-mean-token-mean ((1 + 2 + 3) / 3 + 4 / 1) / 2 = 3;
#   seq-mean-token-sum (6 + 4) / 2 = 5; seq-mean-token-sum-norm (6 + 4) / (2 x 3) = 5/3.
_AGG_INPUTS = {"per_token_loss": [[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]], "response_mask": [[1, 1, 1], [1, 0, 0]]}
_AGG_EXPECTED = {
    "token-mean": 2.5,
    "token-sum": 10.0,
    "seq-mean-token-mean": 3.0,
    "seq-mean-token-sum": 5.0,
    "seq-mean-token-sum-norm": 10 / 6,
}
AGGREGATION_CASES = tuple(
    Case(AGGREGATION, mode, _AGG_INPUTS, {"value": value}, source="tests/test_algos_losses.py::test_aggregate_modes")
    for mode, value in _AGG_EXPECTED.items()
)
