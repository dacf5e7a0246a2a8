"""Every algorithm recipe trains 2 steps end to end on CPU: the tiny Qwen2, the echo task.

The workers are objects in this process (trainer.workers=in_process: no Ray, no worker processes),
except ppo's: two policy and two critic ranks, on the tests' shared Ray head. Each run goes through
`train_run` (the path `rlkit train` takes) with the recipe plus tiny-world overrides, then checks
something only that recipe's algorithm produces, so a recipe wired to the
wrong estimator, normalisation or loss fails here: the advantages the controller computed
(recorded from the estimator registry, in this process) against the algorithm's own formula, and
the metrics only its parts log. The reward is a fractional function of the response text, so
groups have spread and the formulas are not checked on zeros.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import pytest
import torch

from rlkit.core.algos.advantages import ADV_ESTIMATORS, AdvantageInputs
from rlkit.core.controller.loop import train_run
from rlkit.recipes.loader import load_config

TINY_WORLD = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "data.train_batch_size=4",
              "actor.mini_batch_size=2", "data.max_prompt_length=16", "data.max_response_length=3",
              "actor.micro_batch_tokens=4096", "trainer.total_steps=2", "rollout.name=hf",
              "trainer.logger=[jsonl]", "reward.num_workers=1"]

REWARD = "def spread(data_source, response, ground_truth, extra_info):\n    return sum(map(ord, response)) % 10 / 10 + 0.05\n"
GRPO_EPS = 1e-6

Check = Callable[[AdvantageInputs, torch.Tensor], torch.Tensor]  # (inputs, advantages) -> expected advantages


def scores(inputs: AdvantageInputs) -> torch.Tensor:
    return (inputs.token_rewards * inputs.response_mask).sum(-1).double()


def group_stats(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sequence: its group's mean, unbiased std and size, computed group by group."""
    s, ids = scores(inputs), inputs.group_ids
    mean, std, size = torch.zeros_like(s), torch.zeros_like(s), torch.zeros_like(s)
    for g in ids.unique():
        rows = ids == g
        mean[rows], std[rows], size[rows] = s[rows].mean(), s[rows].std(), rows.sum()
    return mean, std, size


def per_token(seq_values: torch.Tensor, inputs: AdvantageInputs) -> torch.Tensor:
    return seq_values.unsqueeze(-1) * inputs.response_mask


def grpo_expected(inputs: AdvantageInputs, _: torch.Tensor) -> torch.Tensor:
    mean, std, _ = group_stats(inputs)
    return per_token((scores(inputs) - mean) / (std + GRPO_EPS), inputs)


def drgrpo_expected(inputs: AdvantageInputs, _: torch.Tensor) -> torch.Tensor:
    mean, _, _ = group_stats(inputs)  # no std division
    return per_token(scores(inputs) - mean, inputs)


def rloo_expected(inputs: AdvantageInputs, _: torch.Tensor) -> torch.Tensor:
    mean, _, n = group_stats(inputs)
    others_mean = (mean * n - scores(inputs)) / (n - 1)
    return per_token(scores(inputs) - others_mean, inputs)


def remax_expected(inputs: AdvantageInputs, _: torch.Tensor) -> torch.Tensor:
    # The recipe puts KL in the reward: each token's reward-to-go (its own and later penalties, the score) minus
    # the greedy baseline.
    rewards = (inputs.token_rewards * inputs.response_mask).double()
    return_to_go = rewards.flip(-1).cumsum(-1).flip(-1)
    return (return_to_go - inputs.baseline_scores.double().unsqueeze(-1)) * inputs.response_mask


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = values[mask.bool()]
    return (values - valid.mean()) / valid.std() * mask


def reinforce_pp_expected(inputs: AdvantageInputs, _: torch.Tensor) -> torch.Tensor:
    rewards = (inputs.token_rewards * inputs.response_mask).double()
    return_to_go = rewards.flip(-1).cumsum(-1).flip(-1)  # gamma = 1
    return whiten(return_to_go * inputs.response_mask, inputs.response_mask)


def gae_whitened(inputs: AdvantageInputs, advantages: torch.Tensor) -> torch.Tensor:
    # GAE needs the critic's values; its advantages are whitened over the batch's tokens.
    assert inputs.values is not None
    return whiten(advantages.double(), inputs.response_mask)


IN_PROCESS = ["trainer.workers=in_process", "trainer.device=cpu"]
RAY_RECIPES = {"ppo"}  # several ranks: Ray workers

# recipe -> (extra overrides, advantage formula, metrics only its algorithm logs)
RECIPES: dict[str, tuple[list[str], Check, list[str]]] = {
    # Two policy ranks and two colocated critic ranks; step 1 trains only the critic.
    "ppo": (["trainer.n_gpus_per_node=2", "critic.warmup_steps=1"], gae_whitened,
            ["critic/vf_loss", "critic/values_mean"]),
    "grpo": ([], grpo_expected, ["actor/kl_loss", "actor/kl_ref"]),
    "dapo": (["rollout.n=4", "reward.overlong_buffer.length=2", "algorithm.dynamic_sampling.max_gen_rounds=2"],
             grpo_expected, ["dapo/gen_rounds", "dapo/groups_dropped", "dapo/groups_filled", "reward/overlong_penalty"]),
    "rloo": ([], rloo_expected, ["actor/kl_coef"]),
    # vLLM here, so its greedy path is covered too.
    "remax": (["rollout.name=vllm"], remax_expected, ["remax/baseline_score_mean", "actor/kl_coef"]),
    "reinforce_pp": ([], reinforce_pp_expected, ["actor/kl_coef"]),
    "drgrpo": ([], drgrpo_expected, []),
    "gspo": (["rollout.n=4"], grpo_expected, ["actor/seq_ratio_mean"]),
    "cispo": ([], grpo_expected, ["actor/is_weight_mean"]),
    "gmpo": ([], grpo_expected, ["actor/seq_ratio_mean"]),
    "sapo": ([], grpo_expected, ["actor/sapo_weight_mean"]),
}


@pytest.fixture
def recorded_advantages(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, AdvantageInputs, torch.Tensor]]:
    """Every (estimator, inputs, advantages) the controller computes during the test."""
    calls: list[tuple[str, AdvantageInputs, torch.Tensor]] = []

    def recording(name: str, estimator: Callable) -> Callable:
        def record(inputs: AdvantageInputs, **options: object) -> tuple[torch.Tensor, torch.Tensor]:
            advantages, returns = estimator(inputs, **options)
            calls.append((name, inputs, advantages))
            return advantages, returns
        return record

    for name in ADV_ESTIMATORS.names():
        monkeypatch.setitem(ADV_ESTIMATORS._items, name, recording(name, ADV_ESTIMATORS.get(name)))
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [pytest.param(name, marks=[pytest.mark.shared_ray] if name in RAY_RECIPES else [])
                                    for name in RECIPES])
def test_recipe_trains_two_steps(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 recorded_advantages: list) -> None:
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "spread.py").write_text(REWARD)
    extra, expected_advantages, expected_metrics = RECIPES[recipe]
    workers = [] if recipe in RAY_RECIPES else IN_PROCESS
    config = load_config(recipe, [*TINY_WORLD, f"trainer.runs_dir={tmp_path / 'runs'}",
                                  f"reward.function={tmp_path / 'spread.py'}:spread", *workers, *extra])
    run_dir = train_run(config, run_id=recipe)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert row["rollout/samples"] >= 4 * config.rollout.n
    for key in expected_metrics:
        assert key in rows[-1], f"{recipe}: {key} missing from {sorted(rows[-1])}"
    # The step's advantages follow this algorithm's formula (and are not all 0).
    assert [name for name, _, _ in recorded_advantages] == [config.algorithm.adv_estimator] * 2
    for _, inputs, advantages in recorded_advantages:
        assert advantages.abs().max() > 0.01
        expected = expected_advantages(inputs, advantages).float()
        assert torch.allclose(advantages, expected, atol=1e-4), (recipe, advantages, expected)
    # Step 1 carries the start-up's parts, which add up to the launch-to-first-step (docs/startup.md); step 2 none.
    startup = {k.removeprefix("startup/").removesuffix("_s"): v for k, v in rows[0].items() if k.startswith("startup/")}
    parts = ["imports_and_checks", "ray_init", "workers_setup", "critic_setup", "run_setup", "first_step"]
    assert {"imports_and_checks", "ray_init", "workers_setup", "run_setup", "first_step", "process_group",
            "model_load", "rollout_engine_start", "launch_to_first_step"} <= set(startup), sorted(startup)
    assert sum(startup.get(p, 0.0) for p in parts) == pytest.approx(startup["launch_to_first_step"], abs=0.01)
    assert ("critic_setup" in startup) == (recipe == "ppo")
    if config.rollout.name == "vllm":  # what the engine logged of its start: the weights' load at least
        assert startup["rollout_engine_weights_load"] <= startup["rollout_engine_start"]
        # and the times before its weights' load and after its init line: with the logged parts, within the whole
        logged = ["before_weights_load", "weights_load", "init", "after_init"]
        assert sum(startup[f"rollout_engine_{p}"] for p in logged) <= startup["rollout_engine_start"] + 0.01, startup
    assert not any(k.startswith("startup/") for k in rows[1])
    if recipe == "ppo":
        assert "actor/pg_loss" not in rows[0] and "actor/pg_loss" in rows[1]  # critic warm-up, then both
    if recipe == "dapo":
        assert 1 <= rows[-1]["dapo/gen_rounds"] <= 2
    if recipe == "remax":
        assert rows[-1]["rollout/greedy_samples"] == 4
    if recipe == "cispo":  # the second mini-batch's weights moved off 1, within the clip
        assert 0.5 < rows[-1]["actor/is_weight_mean"] <= 1.28 and rows[-1]["actor/is_weight_mean"] != 1.0
    if recipe == "gspo":  # the sequence ratio of the update's second mini-batch moved, within reason
        assert 0.9 < rows[-1]["actor/seq_ratio_mean"] < 1.1
