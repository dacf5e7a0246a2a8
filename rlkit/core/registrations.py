"""Every registry and every built-in name in it, in one place: the name a recipe, a data row or a command
line uses, and where its function lives ('module:attribute').

A built-in's module is imported when its name is first looked up (Registry.get), so knowing the names
imports nothing (the config checks test names without torch), and a lookup never depends on which modules
happened to be imported before. This module imports only the Registry. A new estimator, loss, reward,
builder, engine or tool is its function in its module and one line here; tests/test_registrations.py
checks that every line resolves to a function defined where it says.
"""

from __future__ import annotations

from rlkit.core.registry import Registry

_ADV = "rlkit.core.algos.advantages"
_LOSSES = "rlkit.core.algos.losses"
_KL = "rlkit.core.algos.kl"
_SYNTHETIC = "rlkit.core.data.synthetic"
_MATH_REWARD = "rlkit.core.rewards.math"
_GSM8K_REWARD = "rlkit.core.rewards.gsm8k"
_REASONING_GYM_REWARD = "rlkit.core.rewards.reasoning_gym"
# The data_source names MATH rows carry (the hub's own names and the short one).
_MATH_SOURCES = ("math", "DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "hendrycks/competition_math")

# The RL math (rlkit/core/algos/; docs/algorithms.md gives each one's formula and paper).
ADV_ESTIMATORS = Registry(
    "advantage estimator",
    {
        "gae": f"{_ADV}:gae",
        "grpo": f"{_ADV}:grpo",
        "rloo": f"{_ADV}:rloo",
        "remax": f"{_ADV}:remax",
        "reinforce_plus_plus": f"{_ADV}:reinforce_plus_plus",
        "reinforce_plus_plus_baseline": f"{_ADV}:reinforce_plus_plus_baseline",
        "grpo_passk": "rlkit.core.algos.grpo_passk:grpo_passk",
        "opo": "rlkit.core.algos.opo:opo",
        "optimal_token_baseline": "rlkit.core.algos.optimal_token_baseline:optimal_token_baseline",
        "tir_optimal_token_baseline": "rlkit.core.algos.tir_optimal_token_baseline:tir_optimal_token_baseline",
        "gdpo": "rlkit.core.algos.gdpo:gdpo",
    },
)
POLICY_LOSSES = Registry(
    "policy loss",
    {
        "vanilla": f"{_LOSSES}:vanilla",
        "gspo": f"{_LOSSES}:gspo",
        "cispo": "rlkit.core.algos.cispo:cispo",
        "clip_cov": "rlkit.core.algos.cov:clip_cov",
        "kl_cov": "rlkit.core.algos.cov:kl_cov",
        "dppo_tv": "rlkit.core.algos.dppo:dppo_tv",
        "dppo_kl": "rlkit.core.algos.dppo:dppo_kl",
        "gmpo": "rlkit.core.algos.gmpo:gmpo",
        "geo_mean": "rlkit.core.algos.gmpo:gmpo",  # verl's name for GMPO
        "gpg": "rlkit.core.algos.gpg:gpg",
        "sapo": "rlkit.core.algos.sapo:sapo",
    },
)
KL_ESTIMATORS = Registry(
    "kl estimator",
    {
        "k1": f"{_KL}:k1",
        "kl": f"{_KL}:k1",
        "k2": f"{_KL}:k2",
        "mse": f"{_KL}:k2",
        "k3": f"{_KL}:k3",
        "low_var_kl": f"{_KL}:k3",
        "abs": f"{_KL}:abs_kl",
        # Straight-through: the estimator's value, k2's gradient (verl's names).
        "k1+": f"{_KL}:k1_plus",
        "k3+": f"{_KL}:k3_plus",
        "low_var_kl+": f"{_KL}:k3_plus",
    },
)

# Rule-based rewards and answer extractors, by a row's data_source ('synthetic/echo' falls back to
# 'synthetic': rlkit.core.rewards.registry).
REWARD_FNS = Registry(
    "reward function for data_source",
    {
        **dict.fromkeys(_MATH_SOURCES, f"{_MATH_REWARD}:math_reward"),
        "openai/gsm8k": f"{_GSM8K_REWARD}:gsm8k_reward",
        "gsm8k": f"{_GSM8K_REWARD}:gsm8k_reward",
        "openai/humaneval": "rlkit.core.rewards.code:humaneval_reward",
        "synthetic": f"{_SYNTHETIC}:exact_match_reward",
        "synthetic/lookup": f"{_SYNTHETIC}:lookup_reward",
        "reasoning_gym": f"{_REASONING_GYM_REWARD}:reasoning_gym_reward",  # 'reasoning_gym/<task>' rows
    },
)
ANSWER_FNS = Registry(
    "answer extractor for data_source",
    {
        **dict.fromkeys(_MATH_SOURCES, f"{_MATH_REWARD}:math_answer"),
        "openai/gsm8k": f"{_GSM8K_REWARD}:gsm8k_answer",
        "gsm8k": f"{_GSM8K_REWARD}:gsm8k_answer",
        "synthetic": f"{_SYNTHETIC}:synthetic_answer",
        "synthetic/lookup": f"{_SYNTHETIC}:lookup_answer",
        "reasoning_gym": f"{_REASONING_GYM_REWARD}:reasoning_gym_answer",
    },
)

# `rlkit prep-data NAME`.
DATASET_BUILDERS = Registry(
    "dataset builder",
    {
        "arithmetic": "rlkit.core.data.arithmetic:build_arithmetic",
        "gsm8k": "rlkit.core.data.gsm8k:build_gsm8k",
        "gsm8k-pairs": "rlkit.core.data.gsm8k_pairs:build_gsm8k_pairs",
        "humaneval": "rlkit.core.data.humaneval:build_humaneval",
        "math": "rlkit.core.data.math:build_math",
        "reasoning-gym": "rlkit.core.data.reasoning_gym:build_reasoning_gym",
        "synthetic": f"{_SYNTHETIC}:build_synthetic",
        "tool-arithmetic": "rlkit.core.agents.tool_arithmetic:build_tool_arithmetic",
        "verifiers": "rlkit.core.agents.verifiers_env:build_verifiers",
    },
)

# rollout.name: each factory imports its engine's module only when called.
ENGINES = Registry(
    "rollout engine",
    {
        "vllm": "rlkit.core.rollout.engines:vllm_engine",
        "sglang": "rlkit.core.rollout.engines:sglang_engine",
        "hf": "rlkit.core.rollout.engines:hf_engine",
    },
)

# rollout.agent.tools: name -> factory(agent config) -> the tool function.
BUILTIN_TOOLS = Registry(
    "built-in tool",
    {
        "calculator": "rlkit.core.agents.builtin_tools:calculator_tool",
        "python": "rlkit.core.agents.builtin_tools:python_tool",
        "lookup": f"{_SYNTHETIC}:lookup_tool",  # the tiny tool-calling demo's (grpo-agent-demo)
    },
)

# rollout.agent.env: no built-in environment yet (a 'path/file.py:ClassName' names the user's).
ENVIRONMENTS = Registry("environment", {})
