"""Policy/value losses, aggregation and entropy against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    entropy_from_logits,
    policy_loss,
    rollout_importance_weights,
    value_loss,
)
from rlkit.recipes.schema import ActorConfig

LN = math.log


def ratios_batch(ratios: list[float], advs: list[float]) -> tuple[torch.Tensor, ...]:
    """One sequence whose tokens have the given ratios (old logp 0), plus one garbage padding slot."""
    logp = torch.tensor([[LN(r) for r in ratios] + [50.0]], requires_grad=True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([advs + [3.0]])
    mask = torch.tensor([[1.0] * len(ratios) + [0.0]])
    return logp, old, adv, mask


def test_vanilla_ppo_clip() -> None:
    # low = high = 0.2, loss = max(-A r, -A clip(r, .8, 1.2)):
    #   r 1.25, A +1: max(-1.25, -1.2) = -1.2   (clipped)
    #   r 0.7,  A -1: max(0.7, 0.8)    = 0.8    (clipped)
    #   r 0.7,  A +1: max(-0.7, -0.8)  = -0.7
    #   r 1.1,  A -2: max(2.2, 2.2)    = 2.2    (tie: not counted as clipped)
    #   padding: 0 despite logp 50.
    logp, old, adv, mask = ratios_batch([1.25, 0.7, 0.7, 1.1], [1.0, -1.0, 1.0, -2.0])
    loss, m = policy_loss("vanilla", logp, old, adv, mask)
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -0.7, 2.2, 0.0]]), atol=1e-6)
    assert loss[0, -1].item() == 0.0
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 4)
    # ppo_kl = mean(old - logp) = -(ln 1.25 + 2 ln 0.7 + ln 1.1) / 4
    assert m["ppo_kl"].item() == pytest.approx(-(LN(1.25) + 2 * LN(0.7) + LN(1.1)) / 4, abs=1e-6)
    assert m["pg_clipfrac_lower"].item() == 0.0


@pytest.mark.parametrize(
    ("high", "expected_loss", "expected_grad", "clipfrac"), [(0.2, -1.2, 0.0, 1.0), (0.28, -1.25, -1.25, 0.0)]
)
def test_clip_higher_asymmetry(
    high: float, expected_loss: float, expected_grad: float, clipfrac: float
) -> None:
    # r = 1.25, A = +1. high 0.2: clipped at 1.2, so no gradient. high 0.28: 1.25 < 1.28, loss -r,
    # d(-r)/d logp = -r = -1.25.
    logp, old, adv, mask = ratios_batch([1.25], [1.0])
    loss, m = policy_loss("vanilla", logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=high)
    assert loss[0, 0].item() == pytest.approx(expected_loss, abs=1e-6)
    assert m["pg_clipfrac"].item() == clipfrac
    loss.sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(expected_grad, abs=1e-6)


def test_dual_clip_caps_negative_advantages() -> None:
    # c = 3, bounds .8/1.2:
    #   r 5, A -1: max(5, 1.2) = 5, capped at -A c = 3        (lower clip)
    #   r 2, A -1: max(2, 1.2) = 2 < 3                         (no clip)
    #   r 5, A +1: max(-5, -1.2) = -1.2, never capped (A > 0)  (upper clip)
    logp, old, adv, mask = ratios_batch([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    loss, m = policy_loss("vanilla", logp, old, adv, mask, clip_ratio_c=3.0)
    assert torch.allclose(loss, torch.tensor([[3.0, 2.0, -1.2, 0.0]]), atol=1e-5)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    # The function's default is the config's (actor.clip_ratio_c=3.0): dual clip on.
    loss_default, _ = policy_loss("vanilla", logp, old, adv, mask)
    assert torch.allclose(loss_default, loss)
    loss_nc, m_nc = policy_loss("vanilla", logp, old, adv, mask, clip_ratio_c=None)
    assert torch.allclose(loss_nc, torch.tensor([[5.0, 2.0, -1.2, 0.0]]), atol=1e-5)
    assert m_nc["pg_clipfrac_lower"].item() == 0.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss("vanilla", logp, old, adv, mask, clip_ratio_c=1.0)


def test_dual_clip_is_on_by_default_as_in_verl() -> None:
    # verl's compute_policy_loss_vanilla: pg = max(-A r, -A clip(r, .8, 1.2)); where A < 0,
    # min(pg, -A c) with c = clip_ratio_c = 3.0 by default. Ours takes c from the schema.
    #   r 4,   A -.5: max(2, .6)     = 2    > -A c = 1.5 -> 1.5, dual-capped: no gradient
    #   r 2.5, A -.5: max(1.25, .6)  = 1.25 < 1.5        -> 1.25, d/dlogp (-A r) = .5 * 2.5 = 1.25
    #   r 4,   A +.5: max(-2, -.6)   = -.6 (A > 0: never capped), clipped: no gradient
    #   r .5,  A -2:  max(1, 1.6)    = 1.6  < -A c = 6    -> 1.6, clipped: no gradient
    c = ActorConfig().clip_ratio_c
    assert c == 3.0
    logp, old, adv, mask = ratios_batch([4.0, 2.5, 4.0, 0.5], [-0.5, -0.5, 0.5, -2.0])
    loss, m = policy_loss("vanilla", logp, old, adv, mask, clip_ratio_c=c)
    assert torch.allclose(loss, torch.tensor([[1.5, 1.25, -0.6, 1.6, 0.0]]), atol=1e-6)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)  # only the first token
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 4)  # tokens 2, 3: the clipped term is larger
    loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 1.25, 0.0, 0.0, 0.0]]), atol=1e-6)


def gspo_batch() -> tuple[torch.Tensor, ...]:
    # Seq 0: token log-ratios .1, .3 (len 2). Seq 1: log-ratio -.5 (len 1) + garbage padding.
    old = torch.tensor([[-1.0, -2.0], [-0.7, 0.0]])
    logp = (old + torch.tensor([[0.1, 0.3], [-0.5, 1e4]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return logp, old, torch.ones(2, 2), mask


def test_gspo_sequence_ratio_and_clip() -> None:
    # s_0 = exp((.1 + .3)/2) = exp(.2) = 1.221403 > 1.2 -> clipped, loss -1.2 on both tokens.
    # s_1 = exp(-.5) = .606531; A > 0 so the low clip does not bind: loss -.606531.
    logp, old, adv, mask = gspo_batch()
    loss, m = policy_loss("gspo", logp, old, adv, mask)
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.2], [-0.606531, 0.0]]), atol=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 3)
    assert m["ppo_kl"].item() == pytest.approx(-(0.1 + 0.3 - 0.5) / 3, abs=1e-6)
    # Token mean of the sequence ratio: (2 * exp(.2) + exp(-.5)) / 3.
    assert m["seq_ratio_mean"].item() == pytest.approx((2 * math.exp(0.2) + math.exp(-0.5)) / 3, abs=1e-6)
    # high .28: s_0 = 1.221403 < 1.28, not clipped.
    loss, m = policy_loss("gspo", logp, old, adv, mask, clip_ratio_high=0.28)
    assert torch.allclose(loss[0], torch.tensor([-1.221403, -1.221403]), atol=1e-6)
    assert m["pg_clipfrac"].item() == 0.0


def test_gspo_gradient_matches_sequence_objective() -> None:
    # With seq-mean-token-mean, d/dlogp_t of mean_t(-A s_i) = -A s_i / |y_i|: the gradient of
    # GSPO's objective -A exp(mean_t(logp - old)) written directly.
    logp, old, adv, mask = gspo_batch()
    loss, _ = policy_loss("gspo", logp, old, adv, mask, clip_ratio_high=0.28)
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    ours = logp.grad.clone()
    logp.grad = None
    seq_ratio = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    (-seq_ratio).mean().backward()
    assert torch.allclose(ours * mask, logp.grad * mask, atol=1e-6)
    assert ours[0, 0].item() == pytest.approx(-math.exp(0.2) / 2 / 2, abs=1e-6)  # / |y| / num_seqs


def test_gspo_equals_vanilla_with_one_ratio_per_sequence() -> None:
    # R = 1, and R = 3 with every token of a sequence sharing one ratio: sequence ratio = token ratio.
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.1], [-2.0, -2.0, -2.0], [-0.4, -0.9, -1.5]])
    shift = torch.tensor([[0.3], [-0.4], [0.05], [1.0]])
    adv = torch.tensor([[1.0], [-2.0], [0.5], [-1.0]]).expand(4, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    for r in (1, 3):
        args = (old[:, :r] + shift, old[:, :r], adv[:, :r], mask[:, :r])
        v, mv = policy_loss("vanilla", *args, clip_ratio_c=3.0)
        g, mg = policy_loss("gspo", *args, clip_ratio_c=3.0)
        assert torch.allclose(v, g, atol=1e-6)
        assert all(torch.allclose(mv[k], mg[k], atol=1e-6) for k in mv)


def agg_batch() -> tuple[torch.Tensor, torch.Tensor]:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])  # 100 = padding garbage
    return loss, torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 2.5
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # (2 + 4)/2 = 3
        ("seq-mean-token-sum", (6 + 4) / 2),  # 5
        ("seq-mean-token-sum-norm", (6 + 4) / (2 * 3)),  # norm_length defaults to R = 3
    ],
)
def test_aggregate_modes(mode: str, expected: float) -> None:
    loss, mask = agg_batch()
    assert aggregate_loss(loss, mask, mode).item() == pytest.approx(expected)


def test_aggregate_explicit_norm_length_and_globals() -> None:
    loss, mask = agg_batch()
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=5).item() == pytest.approx(
        10 / (2 * 5)
    )
    assert aggregate_loss(loss, mask, "token-mean", global_num_tokens=8).item() == pytest.approx(10 / 8)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean", global_num_seqs=4).item() == pytest.approx(6 / 4)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", ["vanilla", "gspo"])
def test_micro_batch_split_is_invariant(mode: str, name: str) -> None:
    # An unequal 1 + 3 split; summing micro-batch losses and gradients must equal the whole batch.
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=g) * 2
    logp = (old + 0.3 * torch.randn(4, 5, generator=g)).requires_grad_()
    adv = torch.randn(4, 5, generator=g)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool
    )
    kw = {"global_num_tokens": mask.sum().item(), "global_num_seqs": 4.0, "norm_length": 5}

    def run(rows: slice, **globals_: float) -> torch.Tensor:
        per_token, _ = policy_loss(name, logp[rows], old[rows], adv[rows], mask[rows], clip_ratio_c=3.0)
        return aggregate_loss(per_token, mask[rows], mode, **globals_)

    full = run(slice(0, 4), norm_length=5)
    (full_grad,) = torch.autograd.grad(full, logp)
    split = run(slice(0, 1), **kw) + run(slice(1, 4), **kw)
    (split_grad,) = torch.autograd.grad(split, logp)
    assert split.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(split_grad, full_grad, atol=1e-6)
    # Without the globals each part divides by its own counts, and the sum is wrong: token-sum alone reads no count.
    naive = run(slice(0, 1), norm_length=5) + run(slice(1, 4), norm_length=5)
    assert (naive.item() == pytest.approx(full.item(), abs=1e-6)) is (mode == "token-sum")


def test_token_sum_is_the_sum_of_the_valid_token_losses() -> None:
    loss, mask = agg_batch()
    # (1 + 2 + 3) + 4 = 10: no normaliser, the padding's 100s unread; the global counts change nothing.
    assert aggregate_loss(loss, mask, "token-sum").item() == 10.0
    globals_ = {"global_num_tokens": 8, "global_num_seqs": 4, "norm_length": 5}
    assert aggregate_loss(loss, mask, "token-sum", **globals_).item() == 10.0


# Parts of the 4 sequences below: per rank (ranks split the sequences evenly), its micro-batches.
SPLITS = {
    "one rank, one micro-batch": [[[0, 1, 2, 3]]],
    "one rank, micro-batches of 1 + 3": [[[0], [1, 2, 3]]],
    "two ranks, one micro-batch each": [[[0, 1]], [[2, 3]]],
    "two ranks, micro-batches of 1 + 1 and 2": [[[0], [1]], [[2, 3]]],
    "four ranks": [[[0]], [[1]], [[2]], [[3]]],
}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_token_sum_gradient_is_the_same_whatever_the_micro_batches_and_ranks(split: str) -> None:
    # At ratio 1 (logp = old) no clip binds: the vanilla loss is -A_t per token and its gradient -A_t. The
    # token-sum of the whole batch then has gradient -A_t on every valid token and 0 on padding. The trainer
    # (rlkit.core.train.learner) backpropagates each rank's micro-batch loss times the world size and FSDP
    # averages the ranks' gradients: the gradients of all parts add up, and must give exactly that.
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, 9.0], [-2.0, 9.0, 9.0], [-0.7, -0.1, -0.9]])
    logp = old.clone().requires_grad_()
    adv = torch.tensor([[1.0, -2.0, 0.5], [3.0, -1.0, 7.0], [-4.0, 7.0, 7.0], [2.0, 0.25, -0.5]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    ranks = SPLITS[split]
    world = len(ranks)
    counts = {"global_num_tokens": 9.0, "global_num_seqs": 4.0, "norm_length": 3}  # what the trainer passes
    rank_grads = []
    for micro_batches in ranks:
        grad = torch.zeros_like(logp)
        for rows in micro_batches:
            per_token, _ = policy_loss("vanilla", logp[rows], old[rows], adv[rows], mask[rows], clip_ratio_c=3.0)
            (part,) = torch.autograd.grad(aggregate_loss(per_token, mask[rows], "token-sum", **counts) * world, logp)
            grad += part
        rank_grads.append(grad)
    averaged = torch.stack(rank_grads).mean(0)  # FSDP's reduction over the ranks
    assert torch.equal(averaged, torch.where(mask, -adv, torch.zeros_like(adv)))


def test_value_loss_clipping() -> None:
    # c = .2, loss = .5 max((v-R)^2, (old + clip(v-old, +-.2) - R)^2):
    #   v 1,  old 1, R 2: clip v = 1,   (1-2)^2 = 1 both          -> .5   (tie, not clipped)
    #   v 2,  old 1, R 3: clip v = 1.2, max(1, 1.8^2 = 3.24)      -> 1.62 (clipped)
    #   v .5, old 1, R 0: clip v = .8,  max(.25, .64)             -> .32  (clipped)
    v = torch.tensor([[1.0, 2.0, 0.5, 9.0]])
    old = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    ret = torch.tensor([[2.0, 3.0, 0.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, m = value_loss(v, old, ret, mask, cliprange_value=0.2)
    assert torch.allclose(loss, torch.tensor([[0.5, 1.62, 0.32, 0.0]]), atol=1e-6)
    assert m["vf_clipfrac"].item() == pytest.approx(2 / 3)
    # Unclipped: .5 (v-R)^2 = .5, .5, .125.
    loss, m = value_loss(v, old, ret, mask, cliprange_value=None)
    assert torch.allclose(loss, torch.tensor([[0.5, 0.5, 0.125, 0.0]]))
    assert m["vf_clipfrac"].item() == 0.0


def test_entropy_from_logits() -> None:
    # Uniform over 4: ln 4. Logits [0, ln 3]: p = [1/4, 3/4], H = .25 ln 4 + .75 ln(4/3).
    # [1000, 1000, -1000]: two equal tokens, the third ~0 -> ln 2, with no overflow.
    logits = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0], [0.0, LN(3), -1e9, -1e9], [1000.0, 1000.0, -1000.0, -1000.0]]
    )
    expected = torch.tensor([LN(4), 0.25 * LN(4) + 0.75 * LN(4 / 3), LN(2)])
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-5)
    # The detached max-shift must not change the gradient: compare with -sum p log p.
    z = torch.tensor([[0.3, -1.0, 2.0]], requires_grad=True)
    (ours,) = torch.autograd.grad(entropy_from_logits(z).sum(), z)
    (ref,) = torch.autograd.grad(-(z.softmax(-1) * z.log_softmax(-1)).sum(), z)
    assert torch.allclose(ours, ref, atol=1e-6)


def test_unknown_names_suggest_closest() -> None:
    logp, old, adv, mask = ratios_batch([1.0], [1.0])
    assert POLICY_LOSSES.names() == ["cispo", "clip_cov", "dppo_kl", "dppo_tv", "geo_mean", "gmpo",
                                     "gpg", "gspo", "kl_cov", "sapo", "vanilla"]
    with pytest.raises(KeyError, match="did you mean 'vanilla'"):
        policy_loss("vanila", logp, old, adv, mask)
    with pytest.raises(KeyError, match="did you mean 'token-mean'"):
        aggregate_loss(logp, mask, "token_mean")


def test_rollout_importance_weights_are_the_truncated_ratio_and_carry_no_gradient() -> None:
    old = torch.tensor([[math.log(3.0), math.log(0.5), 0.0]], requires_grad=True)
    rollout = torch.zeros(1, 3)
    weights = rollout_importance_weights(old, rollout, cap=2.0)
    # pi_old / pi_rollout = 3, 0.5, 1; the cap of 2 truncates the first.
    assert torch.allclose(weights, torch.tensor([[2.0, 0.5, 1.0]]))
    assert not weights.requires_grad


def test_sequence_level_importance_weights_are_the_truncated_product_over_the_loss_mask() -> None:
    # Sequence 0: ratios 3 and 0.5 (product 1.5 < cap 2), padding with a huge ratio that must not count.
    # Sequence 1: ratios 2 and 4 (product 8, truncated to 2). Sequence 2: ratio 0.25 once.
    old = torch.tensor([[math.log(3.0), math.log(0.5), 30.0],
                        [math.log(2.0), math.log(4.0), 0.0],
                        [math.log(0.25), 0.0, 0.0]], requires_grad=True)
    rollout = torch.zeros(3, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    weights = rollout_importance_weights(old, rollout, 2.0, level="sequence", response_mask=mask)
    assert torch.allclose(weights, torch.tensor([[1.5] * 3, [2.0] * 3, [0.25] * 3]))
    assert not weights.requires_grad
    # A product of many large ratios stays finite: exp(500) would overflow, its truncation is the cap.
    long = rollout_importance_weights(torch.full((1, 100), 5.0), torch.zeros(1, 100), 2.0, level="sequence",
                                      response_mask=torch.ones(1, 100))
    assert torch.equal(long, torch.full((1, 100), 2.0))
    with pytest.raises(ValueError, match="unknown importance-weight level 'geo'"):
        rollout_importance_weights(old, rollout, 2.0, level="geo", response_mask=mask)
