"""The step's phase plan (rlkit/core/algos/phase_plan.py): one description that the controller runs, the
planner prices (time and memory) and the dry run prints."""

from __future__ import annotations

import pytest

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.phase_plan import PhasePlan, describe, phase_plan
from rlkit.core.planning import memory
from rlkit.core.planning.shape import ModelShape
from rlkit.core.planning.timing import step_time
from rlkit.recipes.loader import load_config

TINY = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"]


def plan_of(config):
    return phase_plan(Algorithm.from_config(config))


@pytest.mark.parametrize(("recipe", "overrides", "phases"), [
    # grpo: one optimizer step per RL step, so the update's own log-probs are the old ones; KL loss -> ref
    ("grpo", ["data.train_batch_size=16"], "gen ref adv update_actor sync"),
    ("grpo", [], "gen old_log_prob ref adv update_actor sync"),  # 64 prompts in mini-batches of 16: a pass
    ("drgrpo", ["data.train_batch_size=16"], "gen adv update_actor sync"),  # no KL at all
    ("rloo", ["data.train_batch_size=16"], "gen old_log_prob ref adv update_actor sync"),  # KL in the reward
    ("remax", ["data.train_batch_size=16"], "gen gen_baseline old_log_prob ref adv update_actor sync"),
    ("ppo", [], "gen old_log_prob values adv update_critic update_actor sync"),
    # Its estimator reads the pass's log-probs and squared probabilities: the pass runs even with one update.
    ("grpo", ["data.train_batch_size=16", "actor.use_kl_loss=false", "algorithm.adv_estimator=optimal_token_baseline"],
     "gen old_log_prob adv update_actor sync"),
])
def test_each_recipe_plans_the_phases_its_algorithm_needs(recipe, overrides, phases):
    assert " ".join(plan_of(load_config(recipe, [*TINY, *overrides])).phases) == phases


def test_critic_warm_up_steps_run_neither_the_actors_update_nor_a_sync():
    plan = plan_of(load_config("ppo", [*TINY, "critic.warmup_steps=2"]))
    assert [plan.runs("update_actor", step) for step in (1, 2, 3)] == [False, False, True]
    assert [plan.runs("sync", step) for step in (1, 2, 3)] == [False, False, True]
    assert plan.runs("update_critic", 1) and not plan.runs("gen_baseline", 1)


def test_the_planner_prices_exactly_the_planned_phases():
    shape = ModelShape(params=500e6, layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64,
                       vocab=151936, layer_params=20e6, root_params=20e6)
    for recipe in ("grpo", "remax", "ppo"):
        config = load_config(recipe, [*TINY, "data.train_batch_size=16", "actor.mini_batch_size=16"])
        critic = shape if Algorithm.from_config(config).critic else None
        priced = set(step_time(config, shape, critic, micro_batch_tokens=8192).phases)
        assert priced == {"reward+adv" if p == "adv" else p for p in plan_of(config).phases}, recipe


RL_RECIPES = ("grpo", "drgrpo", "dapo", "remax", "rloo", "reinforce_pp", "cispo", "gmpo", "gspo", "sapo", "ppo",
              "clip_cov", "kl_cov", "grpo-demo", "grpo-agent-demo")
SPLIT = ["rollout.placement=split", "rollout.devices=1", "trainer.n_gpus_per_node=2"]
SMALL = ModelShape(params=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=32,
                   layer_params=400, root_params=200)


@pytest.mark.parametrize("placement", [[], SPLIT])
@pytest.mark.parametrize("recipe", RL_RECIPES)
def test_the_memory_model_prices_the_planned_phases_that_use_memory(recipe, placement):
    config = load_config(recipe, [*TINY, *placement])
    plan, algorithm = plan_of(config), Algorithm.from_config(config)
    mem = memory.training_device(config, SMALL, 2**33, on_gpu=False, critic=SMALL if algorithm.critic else None)
    reached = {memory.PEAK_OF_PHASE[phase] for phase in plan.phases}
    assert list(mem.phases) == [p for p in memory.PEAKS if p in reached and (not placement or p == "update")]
    # Every RL step generates, updates and syncs; on a split placement the engine is on its own devices.
    assert list(mem.phases) == (["update"] if placement else ["update", "generate", "sync"])
    assert ("reference weights (fp32)" in mem.parts) is ("ref" in plan.phases)
    assert ("critic weights, gradients, AdamW" in mem.parts) is ("update_critic" in plan.phases)


def test_the_memory_model_walks_the_plan(monkeypatch):
    config = load_config("grpo", [*TINY, "rollout.name=hf", "model.dtype=float32"])  # a reference, a KL loss
    whole = memory.training_device(config, SMALL, 2**33, on_gpu=False)
    assert whole.parts["reference weights (fp32)"] == 4 * 1000  # with the plan's ref phase
    # A plan of gen, adv and the update: no reference, no sync. State: fp32 weights, gradients, AdamW = 16 bytes a
    # parameter; the hf engine holds its fp32 weights: generate = 16,000 + 4,000.
    monkeypatch.setattr(memory, "phase_plan", lambda algorithm: PhasePlan(("gen", "adv", "update_actor")))
    mem = memory.training_device(config, SMALL, 2**33, on_gpu=False)
    assert list(mem.phases) == ["update", "generate"] and mem.phases["generate"] == 20_000
    assert not any(part.startswith("reference") for part in mem.parts)
    # A phase the memory model has no price for fails the plan, as the time model's does.
    monkeypatch.setattr(memory, "phase_plan", lambda algorithm: PhasePlan(("gen", "judge", "update_actor")))
    with pytest.raises(KeyError, match="judge"):
        memory.training_device(config, SMALL, 2**33, on_gpu=False)


def test_the_dry_run_says_each_phase_once():
    config = load_config("dapo", TINY)
    lines = describe(plan_of(config), Algorithm.from_config(config), config.rollout,
                     train_batch_size=config.data.train_batch_size)
    assert lines[0] == "each step runs: gen -> old_log_prob -> adv -> update_actor -> sync"
    assert lines[1].startswith("  gen: up to 10 rounds of 512 prompts per step")


@pytest.mark.parametrize(("recipe", "overrides", "line"), [
    ("grpo", [], "update_actor: vanilla loss + KL to the reference (low_var_kl) x0.001, token-mean"),
    ("grpo-agent-demo", [], "update_actor: vanilla loss + entropy bonus x0.05, token-mean"),
    ("cispo", [], "update_actor: cispo loss, token-mean"),
    ("grpo", ["algorithm.adv_estimator=optimal_token_baseline"], "old_log_prob: the policy's log-probs before the "
     "update, with each token's sum of squared probabilities (optimal_token_baseline reads both)"),
    ("kl_cov", [], "update_actor: kl_cov loss, token-mean"),
    ("ppo", ["critic.warmup_steps=2"],
     "update_actor: vanilla loss, token-mean; the first 2 step(s) train only the critic"),
])
def test_the_dry_run_names_the_loss_and_its_terms(recipe, overrides, line):
    config = load_config(recipe, [*TINY, *overrides])
    algorithm = Algorithm.from_config(config)
    assert f"  {line}" in describe(phase_plan(algorithm), algorithm, config.rollout,
                                   train_batch_size=config.data.train_batch_size)
