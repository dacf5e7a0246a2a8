"""RewardModel on a tiny Qwen2ForSequenceClassification built offline and loaded from disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from rlkit.core.rewards.reward_model import RewardModel
from rlkit.core.tiny import build_tokenizer
from rlkit.errors import UserError


def save_tiny_classifier(out: Path, num_labels: int = 1) -> Qwen2ForSequenceClassification:
    tokenizer = build_tokenizer(out)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=128,
                         num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config).eval()
    model.save_pretrained(out)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Qwen2ForSequenceClassification]:
    out = tmp_path_factory.mktemp("rm")
    return out, save_tiny_classifier(out)


def reference(model: Qwen2ForSequenceClassification, seq: list[int]) -> float:
    """The model's own score of one unpadded sequence (its last token)."""
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, 0].item()


def test_scores_equal_the_unpadded_last_token_score(tiny) -> None:
    path, model = tiny
    seqs = [[5, 6, 7, 8, 9, 10], [5, 6], [11, 12, 13]]
    scores = RewardModel(str(path), micro_batch_size=2).score(seqs)
    assert scores.shape == (3,) and scores.dtype == torch.float32
    assert scores.tolist() == pytest.approx([reference(model, s) for s in seqs], abs=1e-5)


def test_a_sequence_ending_in_the_pad_id_is_scored_at_its_real_last_token(tiny) -> None:
    path, model = tiny
    pad = model.config.pad_token_id
    seq = [5, 6, 7, pad]  # pad id == EOS in many models: still the sequence's last token
    score = RewardModel(str(path)).score([seq, [5, 6, 7, 8, 9, 10, 11]])[0].item()
    hidden = model.model(torch.tensor([seq])).last_hidden_state[0, -1]
    assert score == pytest.approx(model.score(hidden).item(), abs=1e-5)


def test_max_length_keeps_the_last_tokens(tiny) -> None:
    path, model = tiny
    seq = [5, 6, 7, 8, 9, 10]
    score = RewardModel(str(path), max_length=3).score([seq]).item()
    assert score == pytest.approx(reference(model, seq[-3:]), abs=1e-5)


def test_empty_batch_and_foreign_token_ids(tiny) -> None:
    path, model = tiny
    reward_model = RewardModel(str(path))
    assert reward_model.score([]).shape == (0,)
    with pytest.raises(UserError, match="must share the policy's tokenizer"):
        reward_model.score([[5, model.config.vocab_size + 3]])


def test_a_model_with_two_labels_or_no_model_is_a_user_error(tmp_path: Path) -> None:
    save_tiny_classifier(tmp_path / "two", num_labels=2)
    with pytest.raises(UserError, match="num_labels=2"):
        RewardModel(str(tmp_path / "two"))
    with pytest.raises(UserError, match="does not load"):
        RewardModel(str(tmp_path / "nothing-here"))
