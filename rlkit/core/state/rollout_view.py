"""A recorded step's samples in words: prompt, response tokens, reward, advantage, per-token log-prob gap.

Response tokens include an environment's or a tool's (multi-turn): they are shown, marked as
not trained (the loss mask), and have no gap.

What `rlkit inspect` prints and writes to TensorBoard. The gap is |engine - trainer| log-prob
of each response token: the trainer's log-probs are the old-log-prob pass's, or (when the
update took its own) the extra pass trainer.record_rollouts makes on log-prob check steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlkit.core.state.records import Record

SORT_KEYS = ("reward", "advantage", "gap", "length", "index")


@dataclass
class SampleView:
    index: int  # row in the recorded batch
    group: int  # prompt group (GRPO's group)
    prompt: str
    tokens: list[str]  # response tokens, each decoded on its own (environment/tool tokens too)
    trained: list[bool]  # per token: the policy generated it (the loss mask); False for environment tokens
    gaps: list[float | None] | None  # |rollout - trainer| log-prob per policy token (None on the others);
    # None without engine log-probs
    reward: float
    advantage: float  # mean over the response tokens (constant per sequence for GRPO/RLOO)
    finished: bool

    @property
    def mean_gap(self) -> float | None:
        gaps = [g for g in self.gaps or [] if g is not None]
        return sum(gaps) / len(gaps) if gaps else None

    def sort_value(self, key: str) -> float:
        return {
            "reward": self.reward,
            "advantage": self.advantage,
            "gap": self.mean_gap or 0.0,
            "length": float(len(self.tokens)),
            "index": float(self.index),
        }[key]


def trainer_log_probs(record: Record) -> torch.Tensor | None:
    batch = record.batch
    for key in ("old_log_probs", "trainer_log_probs"):
        if key in batch:
            return batch[key]
    return None


def sample_views(record: Record, tokenizer: Any) -> list[SampleView]:
    batch = record.batch
    loss_mask = batch["response_mask"].bool()
    prompt_width = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    real = batch["attention_mask"][:, prompt_width:].bool()  # every response token, the environment's too
    engine, trainer = batch.tensors.get("rollout_log_probs"), trainer_log_probs(record)
    gaps = (engine - trainer).abs() if engine is not None and trainer is not None else None
    advantages = (batch["advantages"] * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
    views = []
    for i in range(len(batch)):
        prompt_ids = batch["input_ids"][i, :prompt_width][batch["attention_mask"][i, :prompt_width].bool()]
        trained = loss_mask[i][real[i]].tolist()
        row_gaps = None
        if gaps is not None and batch["rollout_log_prob_rows"][i]:  # a check step's share of the rows has them
            row_gaps = [g if t else None for g, t in zip(gaps[i][real[i]].tolist(), trained)]
        views.append(
            SampleView(
                index=i,
                group=int(batch["group_ids"][i]),
                prompt=tokenizer.decode(prompt_ids.tolist()),
                tokens=[tokenizer.decode([t]) for t in batch["responses"][i][real[i]].tolist()],
                trained=trained,
                gaps=row_gaps,
                reward=float(batch["scores"][i]),
                advantage=float(advantages[i]),
                finished=bool(batch["finished"][i]),
            )
        )
    return views


def sort_views(views: list[SampleView], key: str, descending: bool = True) -> list[SampleView]:
    if key not in SORT_KEYS:
        raise ValueError(f"sort by one of {SORT_KEYS}, not {key!r}")
    return sorted(views, key=lambda v: v.sort_value(key), reverse=descending)


def summary(record: Record, views: list[SampleView]) -> dict[str, float]:
    rewards = [v.reward for v in views]
    gaps = [g for v in views for g in (v.gaps or []) if g is not None]
    out = {
        "samples": float(len(views)),
        "groups": float(len({v.group for v in views})),
        "reward_mean": sum(rewards) / len(rewards),
        "reward_max": max(rewards),
        "reward_min": min(rewards),
    }
    if gaps:
        out.update(gap_mean=sum(gaps) / len(gaps), gap_max=max(gaps))
    return out


def markdown(record: Record, views: list[SampleView], limit: int = 8) -> str:
    """The step's summary and its best and worst samples by reward, as TensorBoard text (markdown)."""
    stats = summary(record, views)
    lines = [
        f"**step {record.step}**: " + ", ".join(f"{k} {v:.4g}" for k, v in stats.items()),
        "",
        "| sample | group | reward | advantage | mean gap | prompt | response |",
        "|---|---|---|---|---|---|---|",
    ]
    ranked = sort_views(views, "reward")
    chosen = ranked if len(ranked) <= limit else ranked[: limit // 2] + ranked[-(limit - limit // 2) :]
    for v in chosen:
        gap = f"{v.mean_gap:.3g}" if v.mean_gap is not None else "-"
        lines.append(
            f"| {v.index} | {v.group} | {v.reward:.4g} | {v.advantage:+.4g} | {gap} | "
            f"{cell(v.prompt)} | {cell(''.join(v.tokens))} |"
        )
    return "\n".join(lines)


def write_tensorboard(run_path: Path, record: Record, views: list[SampleView]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    folder = Path(run_path) / "tensorboard"
    writer = SummaryWriter(log_dir=str(folder))
    try:
        writer.add_text("rollouts", markdown(record, views), record.step)
    finally:
        writer.close()
    return folder


def tail(text: str, width: int) -> str:
    """The end of `text` on one line (a prompt's end is where the question is)."""
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else "…" + text[-width:]


def cell(text: str, width: int = 120) -> str:
    """A markdown table cell."""
    return tail(text, width).replace("|", "\\|")
