"""One sampled episode, as the learner sees it: what was generated, and which tokens to train.

A single-turn completion is a trajectory of one turn. A multi-turn episode appends, turn by
turn, the policy's tokens (trained) and the tokens the environment or a tool answered with
(not trained) to `response_ids`; `loss_mask` says which is which. Token ids are kept exactly
as the engine produced them: nothing is decoded and re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlkit.core.data.dataset import PromptRow
    from rlkit.core.rewards.worker_pool import Outcome
    from rlkit.core.rollout.base import RolloutSample

# Why generation ended: "stop" (the model's EOS or a stop token), "length" (max tokens),
# "truncated" (a trajectory limit cut it short), "error" (the environment failed).
FINISH_REASONS = ("stop", "length", "truncated", "error")


@dataclass
class Trajectory:
    row: PromptRow  # the prompt's dataset row (data source, ground truth, extra info)
    group: int  # the prompt's position among the step's prompts: its samples form a group
    response_ids: list[int]  # every token after the prompt, policy and environment tokens alike
    loss_mask: list[int]  # 1 on tokens the policy generated (trained), 0 on the rest
    log_probs: list[float] = field(default_factory=list)  # engine log-prob per response token; [] if not asked
    finish_reason: str = "stop"
    reward: float | None = None  # set by an environment that scores the episode itself
    policy_version: int = 0  # the policy (count of weight syncs) that generated it
    info: dict[str, Any] = field(default_factory=dict)
    # the reward's call on it, already run in the rollout worker as it finished (reward.while_generating);
    # None: the controller scores it
    reward_outcome: Outcome | None = None

    def __post_init__(self) -> None:
        if len(self.loss_mask) != len(self.response_ids):
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {len(self.response_ids)} tokens")
        if self.log_probs and len(self.log_probs) != len(self.response_ids):
            raise ValueError(f"log_probs has {len(self.log_probs)} entries for {len(self.response_ids)} tokens")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason {self.finish_reason!r} is not one of {FINISH_REASONS}")

    @property
    def prompt_ids(self) -> list[int]:
        return self.row.prompt_token_ids

    @property
    def policy_ids(self) -> list[int]:
        """The policy's own tokens of every turn (what a reward function scores), without the environment's."""
        return [token for token, mask in zip(self.response_ids, self.loss_mask) if mask]

    @property
    def finished(self) -> bool:
        """Ended on its own (not cut at a length limit)."""
        return self.finish_reason == "stop"

    @classmethod
    def single_turn(
        cls,
        row: PromptRow,
        group: int,
        sample: RolloutSample,
        policy_version: int = 0,
        reward_outcome: Outcome | None = None,
    ) -> Trajectory:
        """A one-turn completion: every response token is the policy's."""
        return cls(
            row=row,
            group=group,
            response_ids=list(sample.token_ids),
            loss_mask=[1] * len(sample.token_ids),
            log_probs=list(sample.log_probs),
            finish_reason="stop" if sample.finished else "length",
            policy_version=policy_version,
            reward_outcome=reward_outcome,
        )
