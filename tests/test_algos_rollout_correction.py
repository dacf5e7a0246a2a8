"""Rollout correction (actor.rollout_correction.*): weights, IcePop, batch normalisation, rejection and the
diagnostics, against numbers worked out by hand; the keys, their earlier spellings and verl's, and the refusals.

The batch (rollout log-probs 0, so pi_old / pi_rollout = r = exp(old log-prob)); padding holds r = 100, which
nothing may read:

    sequence 0: r = 2, 0.5, 1     (3 tokens; product 1)
    sequence 1: r = 4, 1, pad     (2 tokens; product 4)
    sequence 2: r = 0.25, pad,pad (1 token;  product 0.25)
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.losses import aggregate_loss, rollout_importance_weights
from rlkit.core.algos.rollout_correction import (
    CorrectionOptions,
    RejectionRule,
    correction_metrics,
    correction_weights,
)
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config

LN = math.log
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
OLD = torch.tensor([[LN(2), LN(0.5), 0.0], [LN(4), 0.0, LN(100)], [LN(0.25), LN(100), LN(100)]])
ROLLOUT = torch.zeros(3, 3)
RC = "actor.rollout_correction"


def metrics_of(weights: tuple[str, float] | None, options: CorrectionOptions, rows_per_micro_batch: int = 3):
    """The weights [B,R] on valid tokens and the step's metrics, the batch split into micro-batches as the
    learner does (sums added up, then every sum divided by the loss tokens: 6)."""
    sums: dict[str, float] = {}
    parts = []
    for start in range(0, 3, rows_per_micro_batch):
        rows = slice(start, start + rows_per_micro_batch)
        w, s = correction_weights(OLD[rows], ROLLOUT[rows], MASK[rows], weights, options)
        parts.append(w * MASK[rows])
        for key, value in s.items():
            sums[key] = sums.get(key, 0.0) + float(value)
    return torch.cat(parts), correction_metrics({k: v / 6 for k, v in sums.items()})


def test_token_tis_weights_ess_and_chi_squared():
    # min(r, 2): 2, 0.5, 1 | 2, 1 | 0.25. sum w = 6.75, sum w^2 = 4 + .25 + 1 + 4 + 1 + .0625 = 10.3125, n = 6:
    # ESS = 6.75^2 / (6 * 10.3125) = 45.5625 / 61.875 = 81/110.
    # chi2_token = mean r^2 - 1 = (4 + .25 + 1 + 16 + 1 + .0625) / 6 - 1 = 22.3125 / 6 - 1 = 2.71875.
    # chi2_seq = mean (prod r)^2 - 1 = (1 + 16 + .0625) / 3 - 1 = 4.6875 (padding's r = 100 in none of them).
    for rows in (3, 2, 1):  # micro-batching does not move the metrics
        w, m = metrics_of(("token", 2.0), CorrectionOptions(), rows)
        assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [2.0, 1.0, 0.0], [0.25, 0.0, 0.0]]))
        assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(81 / 110)
        assert m["rollout_corr/chi2_token"] == pytest.approx(2.71875)
        assert m["rollout_corr/chi2_seq"] == pytest.approx(4.6875)
        assert not any("masked" in k or "oob" in k for k in m)  # nothing masked: no share reported


def test_sequence_tis_weights_and_ess():
    # min(prod r, 2) per sequence: 1, 2, 0.25 on each of its tokens: sum w = 3 + 4 + .25 = 7.25,
    # sum w^2 = 3 + 8 + .0625 = 11.0625: ESS = 7.25^2 / (6 * 11.0625) = 52.5625 / 66.375 = 841/1062.
    w, m = metrics_of(("sequence", 2.0), CorrectionOptions())
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0], [0.25, 0.0, 0.0]]))
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(841 / 1062)


def test_icepop_masks_weights_outside_the_band_instead_of_truncating():
    # Band [0.5, 2], bounds included: r = 2, 0.5, 1 kept | 4 -> 0, 1 kept | 0.25 -> 0. Two of six tokens out.
    # sum w = 4.5, sum w^2 = 4 + .25 + 1 + 1 = 6.25: ESS = 20.25 / (6 * 6.25) = 0.54.
    icepop = CorrectionOptions(is_threshold_lower=0.5)
    w, m = metrics_of(("token", 2.0), icepop)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 6)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(0.54)
    # Sequence level: products 1 (kept), 4 and 0.25 (out): the three tokens of sequences 1 and 2 are 0.
    w, m = metrics_of(("sequence", 2.0), icepop)
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(3 / 6)


def test_batch_normalised_weights_average_one():
    batch = Batch({"old_log_probs": OLD, "rollout_log_probs": ROLLOUT, "response_mask": MASK})
    options = CorrectionOptions(batch_normalize=True)
    # Token level: the mean of min(r, 2) over the 6 valid tokens is 6.75 / 6 = 1.125; each weight / 1.125.
    inputs = UpdateInputs(False, True, ("token", 2.0), False, rollout_correction_options=options).for_batch(batch)
    assert inputs.rollout_is_weight_mean == pytest.approx(1.125)
    w, _ = correction_weights(OLD, ROLLOUT, MASK, ("token", 2.0), options, weight_mean=1.125)
    expected = torch.tensor([[16 / 9, 4 / 9, 8 / 9], [16 / 9, 8 / 9, 0.0], [2 / 9, 0.0, 0.0]])
    assert torch.allclose(w * MASK, expected)
    assert float((w * MASK).sum() / MASK.sum()) == pytest.approx(1.0)
    # Sequence level (verl's): the mean over sequences of 1, 2, 0.25 is 3.25 / 3, not the token mean 7.25 / 6.
    inputs = UpdateInputs(False, True, ("sequence", 2.0), False, rollout_correction_options=options).for_batch(batch)
    assert inputs.rollout_is_weight_mean == pytest.approx(3.25 / 3)
    # Without batch normalisation the inputs stay as they are.
    plain = UpdateInputs(False, True, ("token", 2.0), False)
    assert plain.for_batch(batch) is plain


@pytest.mark.parametrize("option, upper, lower, kept", [
    # token_k1 keeps pi_rollout / pi_old = 1/r in [1/U, U]: 1/r = .5, 2, 1 | .25 out, 1 | 4 out.
    ("token_k1", 2.0, None, [[1, 1, 1], [0, 1, 0], [0, 0, 0]]),
    # ... or in [L, U]: with L = 0.6, 1/r = 0.5 (r = 2) is out too: the band is on 1/r, as verl's.
    ("token_k1", 2.0, 0.6, [[0, 1, 1], [0, 1, 0], [0, 0, 0]]),
    # token_k3 = r - 1 - ln r: .307, .193, 0 | 1.614 out, 0 | .636 out (threshold 0.5).
    ("token_k3", 0.5, None, [[1, 1, 1], [0, 1, 0], [0, 0, 0]]),
    # seq_mean_k1 (geometric mean of 1/r) in [2/3, 1.5]: seq 0: 1; seq 1: sqrt(1/4) = .5 out; seq 2: 4 out.
    ("seq_mean_k1", 1.5, None, [[1, 1, 1], [0, 0, 0], [0, 0, 0]]),
    # ... in [1/3, 3]: sequence 1's 0.5 is kept; by the sum (1/prod r = .25) it is out.
    ("seq_mean_k1", 3.0, None, [[1, 1, 1], [1, 1, 0], [0, 0, 0]]),
    ("seq_sum_k1", 3.0, None, [[1, 1, 1], [0, 0, 0], [0, 0, 0]]),
    # k2 = (ln r)^2 / 2: seq 0: .240, .240, 0 (sum .480); seq 1: .961, 0 (sum .961); seq 2: .961.
    ("seq_sum_k2", 0.9, None, [[1, 1, 1], [0, 0, 0], [0, 0, 0]]),
    ("seq_max_k2", 0.5, None, [[1, 1, 1], [0, 0, 0], [0, 0, 0]]),
    ("seq_max_k2", 1.0, None, [[1, 1, 1], [1, 1, 0], [1, 0, 0]]),
    # seq_mean_k3: seq 0: (.307 + .193 + 0) / 3 = .167; seq 1: (1.614 + 0) / 2 = .807; seq 2: .636 (threshold .7).
    ("seq_mean_k3", 0.7, None, [[1, 1, 1], [0, 0, 0], [1, 0, 0]]),
])
def test_rejection_sampling_masks_tokens_or_sequences(option, upper, lower, kept):
    options = CorrectionOptions(rs=(RejectionRule(option, upper, lower),))
    w, m = metrics_of(None, options)  # rejection alone: weights 1, 0 where rejected
    kept = torch.tensor(kept, dtype=torch.float32)
    assert torch.equal(w, kept)
    rejected = MASK - kept
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(float(rejected.sum()) / 6)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(float((rejected.sum(-1) > 0).sum()) / 3)
    assert "rollout_corr/rollout_is_eff_sample_size" not in m  # no importance weights, no ESS


def test_rejection_multiplies_the_importance_weights():
    # TIS (cap 2) and token_k1 in [0.5, 2]: 2, .5, 1 | 0 (rejected), 1 | 0 (rejected). Rejected: 2 tokens of 6
    # (sequences 1 and 2: 2 of 3); the ESS is the importance weights' before rejection (81/110, above).
    options = CorrectionOptions(rs=(RejectionRule("token_k1", 2.0),))
    w, m = metrics_of(("token", 2.0), options, rows_per_micro_batch=1)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 6)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(81 / 110)


def test_several_rejection_options_keep_a_token_only_where_each_keeps_it():
    # seq_mean_k3 <= .7 rejects sequence 1 (.807; 2 tokens), seq_mean_k1 in [1/3, 3] rejects sequence 2 (1/r = 4;
    # 1 token), both keep sequence 0. Together: 3 of 6 tokens, 2 of 3 sequences; each option's own shares too.
    options = CorrectionOptions(rs=(RejectionRule("seq_mean_k3", 0.7), RejectionRule("seq_mean_k1", 3.0)))
    w, m = metrics_of(None, options, rows_per_micro_batch=2)
    assert torch.equal(w, torch.tensor([[1.0, 1, 1], [0, 0, 0], [0, 0, 0]]))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 6)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3)
    assert m["rollout_corr/rollout_rs_seq_mean_k3_masked_fraction"] == pytest.approx(2 / 6)
    assert m["rollout_corr/rollout_rs_seq_mean_k3_seq_masked_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_seq_mean_k1_masked_fraction"] == pytest.approx(1 / 6)
    assert m["rollout_corr/rollout_rs_seq_mean_k1_seq_masked_fraction"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("overrides", [
    # verl's comma-separated strings, one threshold per option; a k1 option's band as 'lower_upper'.
    ["algorithm.rollout_correction.rollout_rs=seq_mean_k3,seq_mean_k1",
     "algorithm.rollout_correction.rollout_rs_threshold=0.7,0.4_3.0"],
    # rlkit's lists, the lower bounds by position (null for the k3 option).
    [f"{RC}.rollout_rs=[seq_mean_k3,seq_mean_k1]", f"{RC}.rollout_rs_threshold=[0.7,3.0]",
     f"{RC}.rollout_rs_threshold_lower=[null,0.4]"],
])
def test_several_rejection_options_from_the_keys(overrides):
    options = _algorithm(overrides).rollout_correction_options
    assert options.rs == (RejectionRule("seq_mean_k3", 0.7), RejectionRule("seq_mean_k1", 3.0, 0.4))


def test_one_threshold_is_shared_by_every_option():
    options = _algorithm([f"{RC}.rollout_rs=token_k1,seq_max_k2", f"{RC}.rollout_rs_threshold=2"])
    assert options.rollout_correction_options.rs == (RejectionRule("token_k1", 2.0), RejectionRule("seq_max_k2", 2.0))


def test_verl_bypass_mode_is_rollout_old_log_probs_and_rejects_against_the_policy_being_updated():
    # bypass_mode=true: the engine's log-probs are the old ones on every optimizer step (2 epochs here), no pass;
    # rejection stays on (it compares the updated policy with the engine's: tests/test_old_log_probs.py).
    bypass = _algorithm(["algorithm.rollout_correction.bypass_mode=true", "actor.ppo_epochs=2",
                         f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2"])
    assert bypass.old_log_probs == "rollout" and bypass.rollout_log_probs
    inputs = UpdateInputs.for_step(bypass, log_prob_check=False)
    assert inputs.old_log_probs_from_rollout and inputs.corrects_rollout
    assert "old_log_probs" in inputs.keys() and "rollout_log_probs" in inputs.keys()
    assert _algorithm(["algorithm.rollout_correction.bypass_mode=false"]).old_log_probs == "update"
    # verl's bypass with loss_type=reinforce: the plain policy gradient with weights min(pi / pi_rollout, C).
    reinforce = _algorithm(["actor.old_log_probs=rollout", "actor.policy_loss=gpg", f"{RC}.rollout_is=sequence"])
    assert reinforce.rollout_correction == ("sequence", 2.0) and not reinforce.loss_has_ratio


def test_equal_policies_give_weight_one_an_ess_of_one_and_no_divergence():
    same = correction_weights(ROLLOUT, ROLLOUT, MASK, ("token", 2.0), CorrectionOptions())
    assert torch.equal(same[0], torch.ones(3, 3))
    totals = correction_metrics({k: float(v) / 6 for k, v in same[1].items()})
    assert totals["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)
    assert totals["rollout_corr/chi2_token"] == pytest.approx(0.0, abs=1e-7)
    assert totals["rollout_corr/chi2_seq"] == pytest.approx(0.0, abs=1e-7)
    # A step without correction keeps its metrics as they are.
    assert correction_metrics({"pg_loss": 1.0}) == {"pg_loss": 1.0}


def _algorithm(overrides: list[str]) -> Algorithm:
    return Algorithm.from_config(load_config("grpo-demo", ["rollout.log_prob_check_freq=0", *overrides]))


def test_the_earlier_keys_give_exactly_the_earlier_loss():
    old_keys = _algorithm(["actor.rollout_is=sequence", "actor.rollout_is_cap=5"])
    new_keys = _algorithm(["actor.rollout_correction.rollout_is=sequence",
                           "actor.rollout_correction.rollout_is_threshold=5"])
    verl_keys = _algorithm(["algorithm.rollout_correction.rollout_is=sequence",
                            "algorithm.rollout_correction.rollout_is_threshold=5"])
    assert old_keys == new_keys == verl_keys
    assert (old_keys.rollout_correction, old_keys.rollout_correction_options) == (("sequence", 5.0),
                                                                                 CorrectionOptions())
    inputs = UpdateInputs.for_step(old_keys, log_prob_check=False)
    advantages = torch.tensor([[1.0, -2.0, 0.5], [0.3, 1.0, 9.0], [-1.0, 9.0, 9.0]])
    log_probs = OLD + 0.1
    per_token, _ = old_keys.policy_loss(log_probs, OLD, advantages, MASK)
    # Today's path (TIS, rlkit.core.algos.losses) and the correction's give the same bits.
    before = per_token * rollout_importance_weights(OLD, ROLLOUT, 5.0, level="sequence", response_mask=MASK)
    weights, _ = correction_weights(OLD, ROLLOUT, MASK, inputs.rollout_correction, inputs.rollout_correction_options,
                                    weight_mean=inputs.rollout_is_weight_mean)
    now = per_token * weights
    assert torch.equal(aggregate_loss(now, MASK, "token-mean"), aggregate_loss(before, MASK, "token-mean"))


@pytest.mark.parametrize("overrides, weights, options, old", [
    ([], None, CorrectionOptions(), "update"),                                        # sync: off, as before
    (["actor.rollout_correction.rollout_is_threshold=0.5_4.0"], ("token", 4.0),       # verl's IcePop band
     CorrectionOptions(is_threshold_lower=0.5), "update"),
    (["actor.rollout_correction.rollout_is_batch_normalize=true"], ("token", 2.0),    # the pass runs before the
     CorrectionOptions(batch_normalize=True), "trainer"),                             # update, for the mean
    (["algorithm.rollout_correction.rollout_rs=seq_mean_k1",                          # rejection alone: no weights
      "algorithm.rollout_correction.rollout_rs_threshold=0.8_1.25"], None,
     CorrectionOptions(rs=(RejectionRule("seq_mean_k1", 1.25, 0.8),)), "update"),
])
def test_keys_resolve_into_the_algorithm(overrides, weights, options, old):
    algorithm = _algorithm(overrides)
    assert (algorithm.rollout_correction, algorithm.rollout_correction_options) == (weights, options)
    assert algorithm.old_log_probs == old
    assert algorithm.rollout_log_probs is (weights is not None or bool(options.rs))



@pytest.mark.parametrize("overrides, message", [
    ([f"{RC}.rollout_is=off", f"{RC}.rollout_is_threshold_lower=0.5"],
     f"{RC}.rollout_is_threshold_lower (command line): masks importance weights that {RC}.rollout_is=off turns off"),
    (["actor.rollout_is=off", f"{RC}.rollout_is_batch_normalize=true"],
     f"{RC}.rollout_is_batch_normalize (command line): normalises importance weights that actor.rollout_is=off"),
    ([f"{RC}.rollout_is_threshold_lower=3"],
     f"{RC}.rollout_is_threshold_lower (command line): IcePop's band [3.0, 2.0] is empty: the lower bound must be "
     f"at most {RC}.rollout_is_threshold (2.0, its default)"),
    ([f"{RC}.rollout_rs=token_k1"], f"{RC}.rollout_rs_threshold: {RC}.rollout_rs=token_k1 rejects beyond a bound"),
    ([f"{RC}.rollout_rs_threshold=2"], f"{RC}.rollout_rs_threshold (command line): bounds rejection sampling, "
                                       f"which {RC}.rollout_rs=null leaves off"),
    ([f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=2", f"{RC}.rollout_rs_threshold_lower=0.5"],
     f"{RC}.rollout_rs_threshold_lower (command line): only k1 options have a lower bound"),
    ([f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.5"],
     f"{RC}.rollout_rs_threshold (command line): seq_mean_k1's ratio band [2, 0.5] is empty"),
    ([f"{RC}.rollout_is=token", "actor.old_log_probs=rollout"],
     f"{RC}.rollout_is (command line): with actor.old_log_probs=rollout (bypass) actor.policy_loss=vanilla's ratio "
     "is already pi / pi_rollout"),
    ([f"{RC}.rollout_is_batch_normalize=true", "actor.old_log_probs=rollout", "actor.policy_loss=gpg"],
     f"{RC}.rollout_is_batch_normalize (command line): needs the batch's weights before the update"),
    (["actor.rollout_is_cap=3", f"{RC}.rollout_is_threshold=3"],
     f"actor.rollout_is_cap is the earlier spelling of {RC}.rollout_is_threshold, which is set too: keep one"),
    (["actor.rollout_is=tokn"], "actor.rollout_is='tokn' (command line): Input should be 'auto', 'token' or"),
    (["algorithm.rollout_correction.bypass_mode=true", "actor.old_log_probs=recompute"],
     "rollout_correction.bypass_mode=true (verl's) is actor.old_log_probs=rollout, and actor.old_log_probs is "
     "recompute: keep one"),
    (["algorithm.rollout_correction.bypass_mode=false", "actor.old_log_probs=rollout"],
     "rollout_correction.bypass_mode=false contradicts actor.old_log_probs=rollout"),
    ([f"{RC}.rollout_rs=token_k1,seq_max_k2", f"{RC}.rollout_rs_threshold=[2,1,3]"],
     f"{RC}.rollout_rs_threshold (command line): 3 values for 2 options (token_k1,seq_max_k2): one shared by all"),
    ([f"{RC}.rollout_rs=[token_k1,token_k1]", f"{RC}.rollout_rs_threshold=2"],
     f"{RC}.rollout_rs (command line): names token_k1 more than once"),
    ([f"{RC}.rollout_rs=token_k1,seq_max_k2", f"{RC}.rollout_rs_threshold=0.5_2.0"],
     f"{RC}.rollout_rs_threshold_lower: only k1 options have a lower bound (seq_max_k2 keeps divergences up to 2.0)"),
    ([f"{RC}.rollout_is_threshold=0.5_4.0", f"{RC}.rollout_is_threshold_lower=0.5"],
     "rollout_is_threshold='0.5_4.0' sets a lower bound and so does rollout_is_threshold_lower: keep one"),
])
def test_contradictory_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config("grpo-demo", overrides)
    assert message in str(info.value)
