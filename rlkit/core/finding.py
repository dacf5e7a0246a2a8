"""A finding of `rlkit doctor`: what was looked at, what was seen, and the fix."""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("ok", "info", "warn", "fail")


@dataclass
class Finding:
    level: str  # one of LEVELS
    check: str  # what was looked at
    found: str  # what was seen
    fix: str = ""  # what to do (empty when nothing is to be done)
