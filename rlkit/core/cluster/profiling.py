"""torch.profiler over the phases of chosen steps (trainer.profile_steps): where a step's device time goes.

The run loop arms every training worker before a profiled step and disarms it after
(rlkit.core.cluster.phases.profiled_step); an armed
worker runs each phase it enters (`PhaseReporter.reporting`: generate, log-probs, update, sync) under its own
torch.profiler and writes, per phase and rank, into RUN/profile/step<N>/:
- `rank<r>-<phase>.txt`: the phase's wall seconds, the seconds some kernel or copy ran on the device (the union of
  their intervals over all streams: what is left of the wall time is the host's), then torch's table of the ops
  and kernels by self device time (CPU time on a CPU);
- `rank<r>-<phase>.json`: the same figures and the top entries, for scripts;
- `rank<r>-<phase>.trace.json.gz`: the Chrome trace, for https://ui.perfetto.dev or TensorBoard's profiler.

Only what runs in the worker's own process is seen: a colocated vLLM or SGLang engine whose core runs in a process
of its own (streaming, replicas, separate_process) shows as host time waiting on it (vLLM profiles its own with
VLLM_TORCH_PROFILER_DIR). A phase inside another phase is part of the outer one's profile. The profiled step's
timings include the profiler's own cost.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

TOP_ROWS = 30  # rows of each phase's table and entries of its summary


def step_folder(run_path: Path | str, step: int) -> Path:
    return Path(run_path) / "profile" / f"step{step}"


class PhaseProfiler:
    """One worker's profiler: off until `arm(folder)`; then each outermost phase is profiled into `folder`."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.inside = False  # a phase is being profiled: an inner one is part of it

    def arm(self, folder: str | None) -> None:
        self.folder = Path(folder) if folder is not None else None

    @contextmanager
    def phase(self, name: str, rank: int) -> Iterator[None]:
        if self.folder is None or self.inside:
            yield
            return
        folder, self.inside = self.folder, True
        on_device = torch.cuda.is_available() and torch.cuda.is_initialized()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if on_device:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        try:
            began = time.perf_counter()
            with torch.profiler.profile(activities=activities) as profile:
                yield
                if on_device:
                    torch.cuda.synchronize()  # the phase's last kernels end inside the profile
            wall = time.perf_counter() - began
            write_phase(profile, folder, f"rank{rank}-{name.replace('/', '-')}", name, wall, on_device)
        finally:
            self.inside = False


def write_phase(profile: Any, folder: Path, stem: str, phase: str, wall: float, on_device: bool) -> None:
    """The phase's table, summary and trace (module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    events = profile.key_averages()
    key = "self_device_time_total" if on_device else "self_cpu_time_total"
    top = sorted(events, key=lambda event: getattr(event, key), reverse=True)[:TOP_ROWS]
    busy = device_busy_seconds(profile) if on_device else None
    summary = {
        "phase": phase,
        "wall_seconds": round(wall, 4),
        "device_busy_seconds": None if busy is None else round(busy, 4),
        "sorted_by": key,
        "top": [
            {"name": event.key, "calls": event.count, "self_seconds": round(getattr(event, key) / 1e6, 6)}
            for event in top
        ],
    }
    (folder / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    busy_line = "no device" if busy is None else f"device busy {busy:.3f} s ({busy / max(wall, 1e-9):.0%})"
    header = f"phase {phase}: {wall:.3f} s wall, {busy_line}\n\n"
    (folder / f"{stem}.txt").write_text(header + events.table(sort_by=key, row_limit=TOP_ROWS) + "\n")
    profile.export_chrome_trace(str(folder / f"{stem}.trace.json.gz"))


def device_busy_seconds(profile: Any) -> float:
    """Seconds at least one kernel or copy ran on the device: the union of their intervals over all streams."""
    intervals = sorted(
        (event.start_ns(), event.start_ns() + event.duration_ns())
        for event in profile.profiler.kineto_results.events()
        if event.device_type() == torch.autograd.DeviceType.CUDA and event.duration_ns() > 0
    )
    busy, end = 0, None
    for start, stop in intervals:
        if end is None or start > end:
            busy, end = busy + stop - start, stop
        elif stop > end:
            busy, end = busy + stop - end, stop
    return busy / 1e9


def summary_lines(folder: Path, rank: int = 0, top: int = 3) -> list[str]:
    """One line a phase of rank `rank`'s profiles in `folder`, longest first: its wall and device-busy seconds and
    its `top` ops or kernels by self device time (CPU time on a CPU), for the run's log."""
    lines = []
    summaries = [json.loads(path.read_text()) for path in folder.glob(f"rank{rank}-*.json")]
    for phase in sorted(summaries, key=lambda summary: -summary["wall_seconds"]):
        wall, busy = phase["wall_seconds"], phase["device_busy_seconds"]
        busy_text = "" if busy is None else f", device busy {busy:.3f} s ({busy / max(wall, 1e-9):.0%})"
        heads = ", ".join(
            f"{_short(entry['name'])} {entry['self_seconds']:.3f} s x{entry['calls']}" for entry in phase["top"][:top]
        )
        lines.append(f"{phase['phase']}: {wall:.3f} s{busy_text}; top: {heads}")
    return lines


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
