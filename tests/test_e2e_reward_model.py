"""reward_model.path: the workers score each sequence with a sequence-classification model."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from rlkit.core.batch import build_batch
from rlkit.core.controller.controller import Controller
from rlkit.core.state.run_dir import RunDir
from rlkit.core.rewards.reward_model import RewardModel
from rlkit.core.tiny import build_tokenizer
from rlkit.recipes.loader import load_config

pytestmark = [pytest.mark.slow, pytest.mark.shared_ray]


def test_reward_model_scores_replace_the_rule_reward(tmp_path):
    rm_dir = tmp_path / "reward-model"
    build_tokenizer(rm_dir)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, num_labels=1, pad_token_id=0)
    Qwen2ForSequenceClassification(config).save_pretrained(rm_dir)

    run_config = load_config("grpo-demo", [f"reward_model.path={rm_dir}", "rollout.name=hf",
                                           "trainer.n_gpus_per_node=2", f"trainer.runs_dir={tmp_path}"])
    controller = Controller(run_config, RunDir.create(run_config, "rm"))
    try:
        stages = controller.source.stages
        trajectories = stages.generate([controller.rows[i] for i in range(16)], stages.generate.sampling(step=1), 0)
        batch = build_batch(trajectories, pad_id=0)
        scores = stages.score(batch)[0]["scores"]
    finally:
        controller.close()
    mask = batch["attention_mask"].bool()
    sequences = [ids[m].tolist() for ids, m in zip(batch["input_ids"], mask)]
    expected = RewardModel(str(rm_dir)).score(sequences)
    assert scores.shape == (128,)
    assert torch.allclose(scores, expected, atol=1e-5)
    assert scores.std() > 0   # real model outputs, not a constant rule score
