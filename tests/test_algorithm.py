"""The Algorithm (rlkit/core/algos/algorithm.py): what each built-in recipe's step needs, by hand from its
YAML and the schema's defaults, and the operations it supplies (advantage inputs with the in-reward KL,
advantages, policy loss)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from rlkit.core.algos.advantages import AdvantageInputs
from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.batch import Batch
from rlkit.recipes.actor_schema import ActorConfig, AlgorithmConfig, CriticConfig
from rlkit.recipes.loader import load_config

BASE = ["model.path=some/model", "data.synthetic_task=echo"]
SPLIT = ["rollout.placement=split", "rollout.devices=1", "trainer.n_gpus_per_node=2"]
FIELDS = ("estimator", "groups", "critic", "reference", "kl_in_reward", "kl_loss", "old_log_probs",
          "greedy_baseline", "group_filter", "max_gen_rounds", "loss", "loss_agg_mode", "loss_terms")


def algorithm(recipe: str, *overrides: str) -> Algorithm:
    return Algorithm.from_config(load_config(recipe, [*BASE, *overrides]))


# old_log_probs: "update" only with one optimizer step per RL step (mini_batch_size == train_batch_size,
# ppo_epochs 1) and no KL in the reward; every recipe below but the demos has mini < train batch: "trainer".
NEEDS = {
    #               estimator   groups critic  ref    kl-rew kl-loss old        greedy filter rounds loss   agg
    "grpo":        ("grpo",     True,  False, True,  False, True,  "trainer", False, False, 1, "vanilla", "token-mean"),
    "ppo":         ("gae",      False, True,  False, False, False, "trainer", False, False, 1, "vanilla", "token-mean"),
    "dapo":        ("grpo",     True,  False, False, False, False, "trainer", False, True, 10, "vanilla", "token-mean"),
    "remax":       ("remax",    False, False, True,  True,  False, "trainer", True,  False, 1, "vanilla", "token-mean"),
    "rloo":        ("rloo",     True,  False, True,  True,  False, "trainer", False, False, 1, "vanilla", "token-mean"),
    "reinforce_pp": ("reinforce_plus_plus", False, False, True, True, False, "trainer", False, False, 1, "vanilla",
                     "token-mean"),
    "cispo":       ("grpo",     True,  False, False, False, False, "trainer", False, False, 1, "cispo", "token-mean"),
    "gmpo":        ("grpo",     True,  False, False, False, False, "trainer", False, False, 1, "gmpo",
                    "seq-mean-token-mean"),
    "sapo":        ("grpo",     True,  False, False, False, False, "trainer", False, False, 1, "sapo",
                    "seq-mean-token-mean"),
    "clip_cov":    ("grpo",     True,  False, False, False, False, "trainer", False, True, 10, "clip_cov",
                    "token-mean"),
    "kl_cov":      ("grpo",     True,  False, False, False, False, "trainer", False, True, 10, "kl_cov", "token-mean"),
    "gspo":        ("grpo",     True,  False, False, False, False, "trainer", False, False, 1, "gspo",
                    "seq-mean-token-mean"),
    "drgrpo":      ("grpo",     True,  False, False, False, False, "trainer", False, False, 1, "vanilla",
                    "seq-mean-token-sum-norm"),
    "grpo-demo":   ("grpo",     True,  False, False, False, False, "update",  False, False, 1, "vanilla", "token-mean"),
}
TERMS = {"grpo": ("policy", "kl")}  # the others: the policy loss alone


@pytest.mark.parametrize("recipe", sorted(NEEDS))
def test_each_recipe_declares_what_its_step_needs(recipe):
    got = algorithm(recipe)
    assert tuple(getattr(got, name) for name in FIELDS) == (*NEEDS[recipe], TERMS.get(recipe, ("policy",)))
    assert (got.critic_warmup_steps, got.rollout_correction, got.rollout_log_probs) == (0, None, False)


def test_sections_alone_build_the_algorithm():
    """No whole config: the sections a component holds. A gae estimator brings a critic with its warm-up;
    one mini-batch of the whole batch, one epoch, no KL in the reward: the update's own old log-probs,
    and with a different train_batch_size a log-prob pass; asynchronous rollout turns the correction on."""
    sections = {"algorithm": AlgorithmConfig(adv_estimator="gae"), "actor": ActorConfig(mini_batch_size=8),
                "critic": CriticConfig(warmup_steps=3), "objective": "rl"}
    one_update = Algorithm.from_sections(**sections, rollout_mode="sync", train_batch_size=8)
    assert (one_update.critic, one_update.critic_warmup_steps, one_update.old_log_probs) == (True, 3, "update")
    assert one_update.rollout_correction is None
    two_updates = Algorithm.from_sections(**sections, rollout_mode="async", train_batch_size=16)
    assert two_updates.old_log_probs == "trainer" and two_updates.rollout_correction is not None
    sft = Algorithm.from_sections(**{**sections, "objective": "sft"}, rollout_mode="sync", train_batch_size=8)
    assert (sft.critic, sft.critic_warmup_steps, sft.reference) == (False, 0, False)
    config = load_config("ppo", [*BASE, "critic.warmup_steps=3"])
    assert Algorithm.from_config(config) == Algorithm.from_sections(
        algorithm=config.algorithm, actor=config.actor, critic=config.critic, objective=config.objective,
        rollout_mode=config.rollout.mode, train_batch_size=config.data.train_batch_size)


def test_the_offline_objectives_need_only_dpos_reference():
    offline = ["model.path=some/model", "data.train_files=[rows.parquet]"]
    dpo, sft = (Algorithm.from_config(load_config(recipe, offline)) for recipe in ("dpo", "sft"))
    assert (dpo.reference, dpo.critic, dpo.groups, dpo.kl_loss, dpo.group_filter) == (True, False, False, False, False)
    assert (sft.reference, sft.critic, sft.greedy_baseline, sft.max_gen_rounds) == (False, False, False, 1)


def test_the_agent_demo_adds_the_entropy_term():
    demo = algorithm("grpo-agent-demo")
    assert demo.loss_terms == ("policy", "entropy") and demo.entropy_coeff == 0.05


def test_a_critic_warms_up_only_where_there_is_one():
    assert algorithm("ppo", "critic.warmup_steps=2").critic_warmup_steps == 2


@pytest.mark.parametrize("overrides, old, correction, every_step", [
    (["actor.old_log_probs=rollout"], "rollout", None, True),                # the engine's are the old ones
    (["rollout.mode=async", *SPLIT], "update", ("token", 2.0), True),        # stale samples: TIS, cap 2
    (["actor.rollout_is=sequence", "actor.rollout_is_cap=5"], "update", ("sequence", 5.0), True),
    (["algorithm.use_kl_in_reward=true"], "trainer", None, False),            # the reward's KL needs pi_old first
    (["actor.ppo_epochs=2"], "trainer", None, False),
])
def test_where_the_old_log_probs_come_from_and_the_importance_correction(overrides, old, correction, every_step):
    got = algorithm("grpo-demo", *overrides)
    assert (got.old_log_probs, got.rollout_correction, got.rollout_log_probs) == (old, correction, every_step)
    assert got.old_log_probs_from_update is (old == "update")


def test_advantages_use_the_estimator_with_its_options():
    scores = torch.tensor([1.0, 0.0, 3.0, 3.0])  # two groups of two, one token each
    inputs = AdvantageInputs(scores.unsqueeze(-1), torch.ones(4, 1), torch.tensor([0, 0, 1, 1]))
    drgrpo, _ = algorithm("drgrpo").advantages(inputs)  # norm_adv_by_std=false: score - group mean
    assert drgrpo.squeeze(-1).tolist() == [0.5, -0.5, 0.0, 0.0]
    grpo, _ = algorithm("grpo").advantages(inputs)  # / (unbiased std sqrt(0.5) + 1e-6)
    assert grpo.squeeze(-1).tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6),
                                                       0.0, 0.0])


def scored_batch(**extra: torch.Tensor) -> Batch:
    """Two responses of 3 tokens: the first with a hole in its loss mask, the second one token of padding."""
    return Batch({"response_mask": torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]),
                  "scores": torch.tensor([1.0, 0.5]), "group_ids": torch.tensor([0, 0]), **extra})


def test_the_in_reward_kl_penalty_is_the_algorithms():
    rloo = algorithm("rloo", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.2",
                     "algorithm.kl_ctrl.target_kl=0.25", "algorithm.kl_ctrl.horizon=100")
    ctrl = rloo.kl_controller()
    # k1 = old - ref = [[0.5, 0, 1], [0, 0.5, -2]]; masked: [[0.5, 0, 1], [0, 0.5, 0]].
    batch = scored_batch(old_log_probs=torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, -3.0]]),
                         ref_log_probs=torch.tensor([[-1.5, -2.0, -2.0], [-1.0, -1.5, -1.0]]))
    inputs = rloo.advantage_inputs(batch, ctrl)
    # Scores on the last policy token (index 2, index 1), less 0.2 * KL on every policy token.
    assert inputs.token_rewards.flatten().tolist() == pytest.approx([-0.1, 0.0, 0.8, 0.0, 0.4, 0.0])
    assert (inputs.values, inputs.baseline_scores) == (None, None)
    # Batch KL: mean of per-sequence token means (1.5 / 2, 0.5 / 2) = 0.5, twice the target: the error is
    # clipped to 0.2, and the coefficient moves by 1 + 0.2 * 2 samples / 100.
    assert ctrl.value == pytest.approx(0.2 * 1.004)


def test_without_the_in_reward_kl_the_scores_are_the_rewards():
    grpo = algorithm("grpo")  # KL in the loss, not the reward: no reference log-probs are read
    ctrl = grpo.kl_controller()
    inputs = grpo.advantage_inputs(scored_batch(), ctrl)
    assert inputs.token_rewards.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]] and ctrl.value == 0.001
    values = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    assert algorithm("ppo").advantage_inputs(scored_batch(values=values), ctrl).values is values
    remax = algorithm("remax", "algorithm.use_kl_in_reward=false")
    baseline = torch.tensor([0.25, 0.25])
    assert remax.advantage_inputs(scored_batch(baseline_scores=baseline), ctrl).baseline_scores is baseline


def test_the_policy_loss_runs_with_its_options_resolved_once():
    cispo = algorithm("cispo", "actor.policy_loss_options.is_clip_high=0.5")
    assert cispo.loss_options == {"is_clip_low": 1.0, "is_clip_high": 0.5}
    # ratio 0.5 / 0.25 = 2, weight clipped to 1 + 0.5: loss = -1.5 * A * log 0.5 with A = 1
    loss, metrics = cispo.policy_loss(torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]]),
                                      torch.ones(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(1.5 * math.log(2)) and metrics["pg_clipfrac"].item() == 1.0
    vanilla = algorithm("dapo")
    assert vanilla.loss_options == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}
    assert "loss_options" in vars(cispo)  # cached: resolved on first use, not per call


def test_the_algorithm_module_loads_no_torch():
    code = "import sys, rlkit.core.algos.algorithm; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_kl_terms_come_with_their_estimators_and_coefficients():
    grpo = algorithm("grpo")  # KL loss, low_var_kl, 0.001 (grpo.yaml)
    assert (grpo.kl_loss, grpo.kl_loss_type, grpo.kl_loss_coef, grpo.kl_in_reward) == (True, "low_var_kl", 0.001, False)
    rloo = algorithm("rloo")  # KL in the reward: k1, a fixed coefficient of 0.001 (the schema's defaults)
    assert (rloo.kl_in_reward, rloo.kl_penalty) == (True, "k1")
    fixed = rloo.kl_controller()
    assert type(fixed).__name__ == "FixedKLController" and fixed.value == 0.001
    adaptive = algorithm("rloo", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.2",
                         "algorithm.kl_ctrl.target_kl=0.5", "algorithm.kl_ctrl.horizon=100").kl_controller()
    assert type(adaptive).__name__ == "AdaptiveKLController" and (adaptive.value, adaptive.target) == (0.2, 0.5)
    assert rloo.kl_controller() is not fixed  # a new one each time: its value is the run's state
