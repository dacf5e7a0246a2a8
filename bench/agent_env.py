"""The multi-turn benchmark's environment: fixed shapes, like the single-turn workload.

Every turn is answered with the same short user message; the episode ends after `turns`
policy turns with a cheap hash reward of the last turn (it varies between samples, so GRPO's
update does real work).
"""

from __future__ import annotations

import zlib


class FixedTurns:
    def __init__(self, turns: int = 3, chars: int = 19) -> None:
        self.turns, self.message = turns, "x" * chars

    def reset(self, row: dict) -> None:
        self.turn = 0

    def step(self, action: str) -> tuple[str | None, float | None, bool]:
        self.turn += 1
        if self.turn < self.turns:
            return self.message, None, False
        return None, (zlib.crc32(action.encode()) % 1000) / 1000, True
