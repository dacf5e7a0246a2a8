"""Algorithm recipes resolve, verl's spellings map to ours, and impossible combinations fail clearly."""

from __future__ import annotations

import pytest

from rlkit.core.algos.algorithm import Algorithm
from rlkit.errors import ConfigError
from rlkit.recipes.checks import batch_arithmetic
from rlkit.recipes.loader import load_config

ALGORITHM_RECIPES = ["ppo", "grpo", "dapo", "rloo", "remax", "reinforce_pp", "drgrpo", "gspo"]
BASE = ["model.path=some/model", "data.synthetic_task=echo"]


def load(recipe: str, *overrides: str):
    return load_config(recipe, [*BASE, *overrides])


def test_each_recipe_sets_its_algorithm() -> None:
    configs = {name: load(name) for name in ALGORITHM_RECIPES}
    assert configs["ppo"].algorithm.adv_estimator == "gae" and Algorithm.from_config(configs["ppo"]).critic
    assert not Algorithm.from_config(configs["ppo"]).reference
    assert Algorithm.from_config(configs["grpo"]).reference and configs["grpo"].actor.kl_loss_type == "low_var_kl"
    dapo = configs["dapo"]
    assert (dapo.actor.clip_ratio_low, dapo.actor.clip_ratio_high) == (0.2, 0.28)
    assert dapo.actor.loss_agg_mode == "token-mean" and dapo.algorithm.dynamic_sampling.enable
    assert dapo.reward.overlong_buffer.enable and not Algorithm.from_config(dapo).reference
    assert configs["rloo"].algorithm.adv_estimator == "rloo" and configs["rloo"].algorithm.use_kl_in_reward
    assert configs["remax"].algorithm.adv_estimator == "remax"
    assert configs["reinforce_pp"].algorithm.adv_estimator == "reinforce_plus_plus"
    drgrpo = configs["drgrpo"]
    assert not drgrpo.algorithm.norm_adv_by_std and drgrpo.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    gspo = configs["gspo"]
    assert gspo.actor.policy_loss == "gspo" and gspo.actor.loss_agg_mode == "seq-mean-token-mean"
    for name in ALGORITHM_RECIPES:
        assert not Algorithm.from_config(configs[name]).critic or name == "ppo"
    # Dual clip: verl's 3.0 unless the recipe says otherwise (DAPO's script 10; GSPO has none).
    dual_clip = {name: configs[name].actor.clip_ratio_c for name in ALGORITHM_RECIPES}
    assert dual_clip == {**dict.fromkeys(ALGORITHM_RECIPES, 3.0), "dapo": 10.0, "gspo": None}


def test_verl_spellings_of_the_algorithm_keys() -> None:
    config = load("dapo", "reward_model.overlong_buffer.len=512", "reward_model.overlong_buffer.penalty_factor=0.5",
                  "algorithm.filter_groups.max_num_gen_batches=3", "data.max_response_length=1024")
    assert config.reward.overlong_buffer.length == 512 and config.reward.overlong_buffer.penalty_factor == 0.5
    assert config.algorithm.dynamic_sampling.max_gen_rounds == 3
    assert load("ppo", "trainer.critic_warmup=2").critic.warmup_steps == 2
    assert not load("grpo", "algorithm.norm_adv_by_std_in_grpo=false").algorithm.norm_adv_by_std
    with pytest.raises(ConfigError, match="critic.model.path .* starts from model.path"):
        load("ppo", "critic.model.path=other")


@pytest.mark.parametrize("recipe, overrides, key, message", [
    ("ppo", ["critic.enable=false"], "critic.enable", "gae needs a critic"),
    ("grpo", ["rollout.n=1"], "rollout.n", "needs rollout.n >= 2"),
    ("rloo", ["rollout.n=1"], "rollout.n", "needs rollout.n >= 2"),
    ("grpo", ["critic.enable=true"], "critic.enable", "only used by adv_estimator=gae"),
    ("grpo", ["actor.kl_loss_coef=0"], "actor.kl_loss_coef", "reference model would load"),
    ("rloo", ["algorithm.kl_ctrl.kl_coef=0"], "algorithm.kl_ctrl.kl_coef", "reference model would load"),
    ("ppo", ["critic.warmup_steps=5", "trainer.total_steps=5"], "critic.warmup_steps", "leave none"),
    ("grpo", ["critic.warmup_steps=1"], "critic.warmup_steps", "uses none"),
    ("dapo", ["algorithm.adv_estimator=remax", "rollout.n=1"], "algorithm.dynamic_sampling.enable",
     "needs rollout.n >= 2"),
    ("dapo", ["data.max_response_length=1024"], "reward.overlong_buffer.length", "must fit inside"),
    # Keys for parts that are off would silently do nothing.
    ("grpo", ["critic.lr=1e-5"], "critic.lr", "there is no critic"),
    ("dapo", ["actor.kl_loss_coef=0.01"], "actor.kl_loss_coef", "use_kl_loss is false"),
    ("grpo", ["algorithm.kl_ctrl.type=adaptive"], "algorithm.kl_ctrl.type", "use_kl_in_reward is false"),
    ("grpo", ["algorithm.dynamic_sampling.max_gen_rounds=3"], "algorithm.dynamic_sampling.max_gen_rounds",
     "enable is false"),
    ("grpo", ["reward.overlong_buffer.length=8"], "reward.overlong_buffer.length", "enable is false"),
    ("rloo", ["algorithm.norm_adv_by_std=false"], "algorithm.norm_adv_by_std", "only adv_estimator=grpo"),
    ("grpo", ["algorithm.lam=0.95"], "algorithm.lam", "only adv_estimator=gae"),
])
def test_impossible_combinations_name_the_key_and_the_fix(recipe: str, overrides: list[str], key: str,
                                                          message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(recipe, *overrides)
    assert str(info.value).startswith(key)
    assert message in str(info.value)


def test_keys_of_a_part_that_is_off_are_fine_in_recipes() -> None:
    # dapo inherits grpo's KL-loss settings but turns the loss off: no error, the recipe says so itself.
    assert load("dapo").actor.kl_loss_coef == 0.001


def test_dry_run_arithmetic_mentions_the_algorithm_extras() -> None:
    dapo = "\n".join(batch_arithmetic(load("dapo")))
    assert "up to 10 rounds of 512 prompts" in dapo
    assert "128 more greedy samples" not in dapo
    assert "4 more greedy samples" in "\n".join(batch_arithmetic(load("remax", "data.train_batch_size=4",
                                                                      "actor.mini_batch_size=4")))
    ppo = "\n".join(batch_arithmetic(load("ppo", "critic.warmup_steps=3")))
    assert "the first 3 step(s) train only the critic" in ppo
