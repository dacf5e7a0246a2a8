"""A sequence-classification reward model: one score per (prompt + response) token sequence.

Tokens in, tokens out: sequences are the policy's token ids, so the reward model must
share the policy's tokenizer. The score is the head's output at each sequence's last
real token, found from the sequence lengths (not from pad ids, which may equal EOS).
"""

from __future__ import annotations

import torch

from rlkit.errors import UserError


class RewardModel:
    """Loads `path` with AutoModelForSequenceClassification (num_labels=1), in eval mode."""

    def __init__(
        self,
        path: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_length: int | None = None,
        micro_batch_size: int = 8,
    ) -> None:
        from transformers import AutoModelForSequenceClassification

        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise UserError(
                f"reward_model.path={path!r} does not load as a sequence-classification model: {exc}"
            ) from None
        if model.config.num_labels != 1:
            raise UserError(
                f"reward_model.path={path!r} has num_labels={model.config.num_labels}; a reward "
                "model needs exactly one output (num_labels=1)"
            )
        self.head = getattr(model, "score", None) or getattr(model, "classifier", None)
        if not isinstance(self.head, torch.nn.Module):
            raise UserError(
                f"reward_model.path={path!r}: {type(model).__name__} has no 'score' or "
                "'classifier' head to read the reward from"
            )
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.max_length, self.micro_batch_size = max_length, micro_batch_size
        self.vocab_size = model.config.get_text_config().vocab_size
        self.pad_id = model.config.get_text_config().pad_token_id or 0

    def score(self, sequences: list[list[int]]) -> torch.Tensor:
        """[B] float32 scores on the CPU; sequences longer than max_length keep their last tokens."""
        seqs = [s[-self.max_length :] if self.max_length else s for s in sequences]
        for i, seq in enumerate(seqs):
            if not seq:
                raise ValueError(f"sequence {i} is empty")
            if max(seq) >= self.vocab_size:
                raise UserError(
                    f"sequence {i} has token id {max(seq)} >= the reward model's vocabulary "
                    f"({self.vocab_size}); the reward model must share the policy's tokenizer"
                )
        chunks = [self._score(seqs[i : i + self.micro_batch_size]) for i in range(0, len(seqs), self.micro_batch_size)]
        return torch.cat(chunks) if chunks else torch.zeros(0)

    @torch.no_grad()
    def _score(self, seqs: list[list[int]]) -> torch.Tensor:
        lengths = torch.tensor([len(s) for s in seqs], device=self.device)
        ids = torch.full((len(seqs), int(lengths.max())), self.pad_id, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq)
        ids = ids.to(self.device)
        mask = (torch.arange(ids.shape[1], device=self.device) < lengths[:, None]).long()
        hidden = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        last = hidden[torch.arange(len(seqs), device=self.device), lengths - 1]
        return self.head(last).squeeze(-1).float().cpu()
