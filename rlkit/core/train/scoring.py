"""The scoring role: passes that score the batch without training anything, beside the actor on its device.

The reference policy's log-probs (the base model: a frozen copy, or with LoRA the actor itself with
its adapters off, rlkit.core.train.model.TrainableModel.reference) and the reward model's scores
(reward_model.path).
"""

from __future__ import annotations

import torch

from rlkit.core.batch import Batch
from rlkit.core.cluster.phases import PhaseReporter, in_phase
from rlkit.core.cluster.roles import Role
from rlkit.core.rewards.reward_model import RewardModel
from rlkit.core.train.actor import response_log_probs
from rlkit.core.train.model import TrainableModel


class Scoring(Role):
    """The reference of `model` (the actor's) and `reward_model` (None when the run has none), on `device`;
    log-probs at `temperature` (the actor's: rollout.temperature in RL, 1 offline), through the fused head when
    `fused_head` (actor.fused_lm_head)."""

    def __init__(
        self,
        phases: PhaseReporter,
        model: TrainableModel,
        reward_model: RewardModel | None,
        device: torch.device,
        micro_batch_tokens: int,
        *,
        temperature: float,
        fused_head: bool,
    ) -> None:
        super().__init__(phases)
        self.model, self.reward_model = model, reward_model
        self.device, self.micro_batch_tokens, self.temperature = device, micro_batch_tokens, temperature
        self.fused_head = fused_head

    @torch.no_grad()
    @in_phase("log_probs/ref")
    def reference_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Per-token log-probs of the batch's responses under the reference (entropy: zeros)."""
        self.model.module.eval()  # with LoRA the reference is this module; the update switches it back to train()
        with self.model.reference() as reference:
            return response_log_probs(
                reference,
                batch,
                device=self.device,
                micro_batch_tokens=self.micro_batch_tokens,
                temperature=self.temperature,
                with_entropy=False,
                fused_head=self.fused_head,
            )

    @torch.no_grad()
    @in_phase("reward_model")
    def reward_model_scores(self, batch: Batch) -> torch.Tensor:
        """The reward model's score of each (prompt + response) in this worker's shard."""
        mask = batch["attention_mask"].bool()
        sequences = [ids[row_mask].tolist() for ids, row_mask in zip(batch["input_ids"], mask)]
        return self.reward_model.score(sequences).float().cpu()  # type: ignore[union-attr]
