"""Where a generate's wall time goes: the GPU's busy time, Python's garbage collections, profiles.

Benchmarks only (bench/vllm_rollout.py, bench/rlkit_grpo.py). Nothing here runs in rlkit itself.
"""

from __future__ import annotations

import cProfile
import gc
import io
import os
import pstats
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


class GcTimer:
    """Seconds and count of Python's garbage collections per generation, while `measuring()`."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            self.seconds[info["generation"]] += time.perf_counter() - self.started
            self.counts[info["generation"]] += 1
            self.started = None

    @contextmanager
    def measuring(self) -> Iterator["GcTimer"]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        return {"gc_seconds": round(sum(self.seconds), 4),
                "gc_seconds_by_generation": [round(s, 4) for s in self.seconds],
                "gc_collections_by_generation": self.counts, "gc_tracked_objects": len(gc.get_objects())}


def gpu_busy(run: Callable[[], Any]) -> dict[str, float]:
    """Run `run` under torch.profiler (CUDA activity only) and return the wall seconds, the seconds at
    least one kernel or copy ran on the GPU (the union of their intervals, all streams), and their ratio."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlkit.core.cluster.profiling import device_busy_seconds

    began = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    wall = time.perf_counter() - began
    busy = device_busy_seconds(prof)  # the trainer's profiler's union (trainer.profile_steps)
    intervals = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in prof.profiler.kineto_results.events()
                       if e.device_type() == torch.autograd.DeviceType.CUDA and e.duration_ns() > 0)
    span = (intervals[-1][1] - intervals[0][0]) / 1e9 if intervals else 0.0
    return {"wall_seconds": round(wall, 3), "gpu_busy_seconds": round(busy, 3),
            "gpu_busy_fraction": round(busy / wall, 3), "gpu_span_seconds": round(span, 3),
            "kernels": len(intervals)}


class NvmlSampler:
    """nvidia-smi sampling one GPU's utilisation (NVML: the share of its last sample window in which a kernel ran)
    every `period_ms`, in the background from `start` to `stop`: `samples` holds (when, percent). It sees every
    process on the GPU (vLLM's engine cores in processes of their own) and adds no profiling cost. Without
    nvidia-smi (a CPU) it takes none."""

    def __init__(self, period_ms: int = 50) -> None:
        self.period_ms = period_ms
        self.samples: list[tuple[float, float]] = []
        self.process: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None

    def start(self) -> "NvmlSampler":
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        query = [exe, "--query-gpu=timestamp,utilization.gpu", "--format=csv,noheader,nounits",
                 f"-lms={self.period_ms}", f"--id={visible if visible.isdigit() else 0}"]
        self.process = subprocess.Popen(query, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self.reader.start()
        return self

    def _read(self, lines: Iterable[str]) -> None:
        for line in lines:
            sample = parse_nvml_line(line)
            if sample is not None:
                self.samples.append(sample)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()
            if self.reader is not None:
                self.reader.join(5)


def parse_nvml_line(line: str) -> tuple[float, float] | None:
    """(when, percent) from nvidia-smi's `timestamp, utilization.gpu` line; None for anything else."""
    from datetime import datetime

    try:
        stamp, value = (part.strip() for part in line.split(","))
        return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(value)
    except ValueError:
        return None


def busy_within(samples: list[tuple[float, float]], windows: list[tuple[float, float]]) -> dict[str, float]:
    """The mean of the utilisation samples taken inside any of `windows` ((start, end) by time.time()), as a
    fraction, and how many there were; nothing where none fell inside."""
    inside = [value for when, value in samples if any(start <= when <= end for start, end in windows)]
    if not inside:
        return {}
    return {"nvml_busy_fraction": round(sum(inside) / len(inside) / 100, 3), "nvml_samples": len(inside)}


def nvml_busy(run: Callable[[], Any], period_ms: int = 50) -> dict[str, float]:
    """Run `run` under an `NvmlSampler`: the mean of the samples taken during the run."""
    if shutil.which("nvidia-smi") is None:
        run()
        return {}
    sampler = NvmlSampler(period_ms).start()
    time.sleep(0.5)
    began = time.time()
    run()
    ended = time.time()
    time.sleep(0.2)
    sampler.stop()
    found = busy_within(sampler.samples, [(began, ended)])
    return {**found, "nvml_wall_seconds": round(ended - began, 3)} if found else {"nvml_samples": 0}


def python_profile(run: Callable[[], Any], rows: int = 30) -> tuple[float, str]:
    """cProfile of `run`: its wall seconds under the profiler and the top functions by own time and cumulative."""
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.runcall(run)
    wall = time.perf_counter() - began
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    return wall, text.getvalue()


@contextmanager
def py_spy(output: Path, seconds: float, subprocesses: bool = False) -> Iterator[None]:
    """py-spy sampling this process (and its children) for `seconds` while the block runs: raw
    collapsed stacks in `output`. Does nothing where py-spy is not installed."""
    carried = Path.home() / "site" / "bin" / "py-spy"  # where the GPU machine's carried wheels put it
    exe = shutil.which("py-spy") or (str(carried) if carried.exists() else None)
    if exe is None:
        yield
        return
    command = [exe, "record", "--pid", str(os.getpid()), "--duration", str(int(seconds) + 1), "--rate", "200",
               "--format", "raw", "--nonblocking", "--output", str(output)]
    command += ["--subprocesses"] if subprocesses else []
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(0.5)  # attached before the block starts
    try:
        yield
    finally:
        try:
            spy.wait(timeout=seconds + 10)
        except subprocess.TimeoutExpired:
            spy.kill()
