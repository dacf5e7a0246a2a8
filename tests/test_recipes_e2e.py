"""Every algorithm recipe trains 2 steps end to end on CPU: Ray workers, the tiny Qwen2, the echo task.

Each run goes through `train_run` (the path `rlkit train` takes) with the recipe plus tiny-world
overrides, then reads the run's metrics.jsonl.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlkit.core.controller.loop import train_run
from rlkit.recipes.loader import load_config

TINY_WORLD = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "data.train_batch_size=4",
              "actor.mini_batch_size=2", "data.max_prompt_length=16", "data.max_response_length=3",
              "actor.micro_batch_tokens=4096", "trainer.total_steps=2", "rollout.name=hf",
              "trainer.logger=[jsonl]", "reward.num_workers=1"]

# recipe -> its extra overrides, and metrics that show its algorithm ran
RECIPES = {
    # Two policy ranks and two colocated critic ranks; step 1 trains only the critic.
    "ppo": (["trainer.n_gpus_per_node=2", "critic.warmup_steps=1"], ["critic/vf_loss", "critic/values_mean"]),
    "grpo": ([], ["actor/kl_loss", "actor/kl_ref"]),
    "dapo": (["rollout.n=4", "reward.overlong_buffer.length=2", "algorithm.dynamic_sampling.max_gen_rounds=2"],
             ["dapo/gen_rounds", "dapo/groups_dropped", "dapo/groups_filled", "reward/overlong_penalty"]),
    "rloo": ([], ["actor/kl_coef"]),
    # vLLM here, so its greedy path is covered too.
    "remax": (["rollout.name=vllm"], ["remax/baseline_score_mean", "actor/kl_coef"]),
    "reinforce_pp": ([], ["actor/kl_coef"]),
    "drgrpo": ([], ["actor/pg_loss"]),
    "gspo": (["rollout.n=4"], ["actor/pg_clipfrac"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_trains_two_steps(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    extra, expected = RECIPES[recipe]
    config = load_config(recipe, [*TINY_WORLD, f"trainer.runs_dir={tmp_path / 'runs'}", *extra])
    run_dir = train_run(config, run_id=recipe)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert row["rollout/samples"] >= 4 * config.rollout.n
    for key in expected:
        assert key in rows[-1], f"{recipe}: {key} missing from {sorted(rows[-1])}"
    if recipe == "ppo":
        assert "actor/pg_loss" not in rows[0] and "actor/pg_loss" in rows[1]  # critic warm-up, then both
    if recipe == "dapo":
        assert 1 <= rows[-1]["dapo/gen_rounds"] <= 2
    if recipe == "remax":
        assert rows[-1]["rollout/greedy_samples"] == 4
