"""Start-up time: from the process's launch to the end of the first training step, part by part.

`StartupClock.mark(part)` gives a part the time since the previous mark, so the parts add up to
the whole: imports and checks, Ray, the workers' set-up, the first validation, the first step.
The workers measure what happens inside their set-up (model load, rollout engine start and what
the engine itself reports: rlkit.core.rollout.engine_start); those are `details`, the slowest
rank's, inside a part rather than beside it. Step 1's metrics carry both as `startup/<name>_s`,
plus `startup/launch_to_first_step_s` (docs/startup.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.table import Table

PREFIX = "startup/"
TOTAL = "launch_to_first_step"
_IMPORTED_AT = time.time()  # the fallback launch time: where the process start time is unknown
# The first clock of a process starts at its launch; later ones (Python API, tests) at their creation.
_launch_taken = False


def process_start_time(stat: str | None = None, uptime: str | None = None, now: float | None = None) -> float | None:
    """When this process started (seconds since the epoch), from Linux's /proc; None elsewhere.

    /proc/self/stat's 22nd field is the start in clock ticks after boot (the fields after the
    command name, which may hold spaces, are split after its closing parenthesis); /proc/uptime's
    first field is the seconds since boot now, so the process has run for their difference. Not
    /proc/stat's `btime` plus the ticks: btime is whole seconds and drifts from the wall clock as it is
    adjusted, which put the launch 1.0 s early on the development machine (every start-up 1 s longer).
    """
    try:
        now = time.time() if now is None else now
        stat = stat if stat is not None else Path("/proc/self/stat").read_text()
        uptime = uptime if uptime is not None else Path("/proc/uptime").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return now - (float(uptime.split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Marks the parts of a run's start-up; `metrics()` once the first step has ended."""

    def __init__(self, origin: float) -> None:
        self.origin = self.last = origin  # seconds since the epoch (wall clock: the launch is one)
        self.parts: dict[str, float] = {}
        self.details: dict[str, dict[str, float]] = {}  # part -> what the workers measured inside it
        self.finished = False

    @classmethod
    def from_launch(cls) -> StartupClock:
        """From the process's launch for the first clock of a process (the import of rlkit where the
        launch is unknown); from now for every later one, whose run did not start at the launch."""
        global _launch_taken
        origin = time.time() if _launch_taken else (process_start_time() or _IMPORTED_AT)
        _launch_taken = True
        return cls(origin)

    def mark(self, part: str, now: float | None = None) -> None:
        """`part` ended now: it took the time since the previous mark (after the first step: ignored)."""
        if self.finished:
            return
        now = time.time() if now is None else now
        self.parts[part] = self.parts.get(part, 0.0) + now - self.last
        self.last = now

    def add_details(self, per_rank: list[dict[str, float]]) -> None:
        """What each rank measured inside the part just marked (e.g. its model load): the slowest rank's, per name."""
        inside = self.details.setdefault(next(reversed(self.parts)), {})
        for measured in per_rank:
            for name, seconds in measured.items():
                inside[name] = max(inside.get(name, 0.0), seconds)

    def finish(self, now: float | None = None) -> dict[str, float]:
        """The first step ended: its `startup/*` metrics. Empty when called again."""
        if self.finished:
            return {}
        self.mark("first_step", now)
        self.finished = True
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        details = {name: value for inside in self.details.values() for name, value in inside.items()}
        seconds = {**self.parts, **details, TOTAL: self.last - self.origin}
        return {f"{PREFIX}{name}_s": round(value, 3) for name, value in seconds.items()}

    def table(self) -> Table:
        """The parts, each with its share of the whole, and under them what the workers measured inside them."""
        total = self.last - self.origin
        table = Table(title="start-up (docs/startup.md)", title_justify="left")
        for column in ("part", "seconds", "share"):
            table.add_column(column, justify="left" if column == "part" else "right")
        rows = []
        for part, seconds in self.parts.items():
            rows.append((part, seconds))
            rows += [(f"  {name}", inside) for name, inside in self.details.get(part, {}).items()]
        for name, seconds in rows:
            table.add_row(name, f"{seconds:.1f}", f"{100 * seconds / total:.0f}%" if total > 0 else "-")
        table.add_row("launch to first step", f"{total:.1f}", "100%", style="bold")
        return table
