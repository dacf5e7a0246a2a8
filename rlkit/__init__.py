"""rlkit: recipe-driven RL post-training of LLMs, from the command line (`rlkit train`) or from Python:

    from rlkit import train, dry_run, resume, Run

(docs/python_api.md). The names load on first use, so `import rlkit` imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlkit.api import Run, dry_run, resume, train

__all__ = ["Run", "dry_run", "resume", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rlkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlkit' has no attribute {name!r}")
