"""The controller's view of a step's episodes: metrics, every environment failure in the run's
log (row and traceback), and the stop when too many failed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.core.rollout.trajectory import Trajectory
    from rlkit.recipes.agent_schema import AgentConfig

logger = logging.getLogger("rlkit")


class EnvironmentFailures(UserError):
    """More of a step's episodes failed in the environment than rollout.agent.max_error_rate allows."""


def episode_metrics(trajectories: list[Trajectory], config: AgentConfig, at: str) -> dict[str, float]:
    """agent/* metrics of the episodes of `at` ("step 5", "step 5's validation"); logs each failed
    episode; raises EnvironmentFailures above the allowed rate."""
    failed = [t for t in trajectories if t.info.get("env_error")]
    for t in failed:
        logger.warning("%s: the environment failed on %s (scored 0):\n%s", at, where(t), t.info["env_error"])
    if len(failed) > config.max_error_rate * len(trajectories):
        first = failed[0]
        last_line = first.info["env_error"].strip().splitlines()[-1]
        raise EnvironmentFailures(
            f"the environment failed on {len(failed)} of {len(trajectories)} episodes of {at}, more than "
            f"rollout.agent.max_error_rate={config.max_error_rate:g} allows; first on {where(first)}: {last_line} "
            "(every traceback is in the run's console.log); fix the environment or raise rollout.agent.max_error_rate"
        )
    count = max(len(trajectories), 1)
    env_tokens = sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajectories)
    reported: dict[str, list[float]] = {}
    for t in trajectories:
        for key, value in (t.info.get("env_metrics") or {}).items():
            reported.setdefault(key, []).append(value)
    return {
        **{key: sum(values) / len(values) for key, values in reported.items()},
        "agent/env_errors": float(len(failed)),
        "agent/turns_mean": sum(t.info.get("turns", 0) for t in trajectories) / count,
        "agent/truncated": sum(t.finish_reason == "truncated" for t in trajectories) / count,
        "agent/env_tokens_mean": env_tokens / count,
    }


def where(t: Trajectory) -> str:
    """An episode's row, as a person finds it in the data."""
    index = (t.row.extra_info or {}).get("index")
    return (
        f"row {t.row.index} (data_source {t.row.data_source!r}"
        + (f", extra_info.index {index}" if index is not None else "")
        + f", sample group {t.group})"
    )
