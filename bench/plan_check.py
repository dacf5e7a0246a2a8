"""`rlkit plan` against a measured run: predicted vs measured memory per phase and seconds per phase.

  python bench/plan_check.py --workdir /tmp/bench --out plan_check.json [--gpus 2] [--placement split]
      [--compile] [--cuda-graphs] [--grad-ckpt] [--micro-batch-tokens N] [--steps 4] [--tiny]

Runs the benchmark workload (bench/workload.py) through the controller as bench/rlkit_grpo.py does,
with every phase's start and end recorded (the controller's `timed` blocks). A thread samples each
GPU's used memory (nvidia-smi, every 0.1 s: everything on the device, CUDA contexts included); a
phase's measured peak is the highest sample of the busiest GPU inside that phase, over the steps
after --warmup. Without GPUs (--tiny on a CPU) only the times are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rlkit_grpo import overrides, with_defaults  # noqa: E402
from bench.workload import prepared  # noqa: E402

GIB = 2**30
PLAN_PHASES = {"gen": "generate", "update_actor": "update", "sync": "sync"}  # controller phase -> plan phase


class MemorySampler(threading.Thread):
    """(time, [used bytes per GPU]) every `period` seconds until stopped.

    Only the GPUs CUDA_VISIBLE_DEVICES names, when set, so that a run on the machine's other GPU
    does not show up in this one's peaks.
    """

    def __init__(self, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.period, self.samples, self.running = period, [], True

    def run(self) -> None:
        while self.running:
            try:
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      *([f"--id={visible}"] if visible else [])],
                                     capture_output=True, text=True, timeout=5).stdout
                self.samples.append((time.monotonic(), [int(v) * 2**20 for v in out.split()]))
            except (OSError, subprocess.SubprocessError):
                return
            time.sleep(self.period)

    def peak(self, start: float, end: float) -> float | None:
        inside = [max(used) for t, used in self.samples if start <= t <= end and used]
        return max(inside) if inside else None


def record_phases(spans: list[tuple[int, str, float, float]], step_of: list[int]) -> None:
    """Wrap rlkit's `timed` wherever the step uses it (controller, rollout source), keeping every
    phase's (step, name, start, end)."""
    from contextlib import contextmanager

    from rlkit.core.controller import controller as controller_module
    from rlkit.core.rollout import source as source_module

    original = source_module.timed

    @contextmanager
    def timed(timing, name):
        start = time.monotonic()
        with original(timing, name):
            yield
        spans.append((step_of[0], name, start, time.monotonic()))

    for module in (controller_module, source_module):
        module.timed = timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--placement", default="colocated", choices=["colocated", "split"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    args = with_defaults(parser.parse_args())  # the rest as bench/rlkit_grpo.py's defaults: full fine-tuning, sync

    from rlkit.core.controller.controller import Controller
    from rlkit.core.state.run_dir import RunDir
    from rlkit.core.planning.plan import build_plan
    from rlkit.recipes.loader import load_config

    workload, workdir = prepared(args.workdir, args.tiny)
    config = load_config("grpo", overrides(args, workload, str(workdir / "prompts.parquet"), str(workdir / "runs")),
                         model=str(workdir / "model"))
    plan = build_plan(config)
    result = {"args": vars(args), "device": plan.device.name,
              "predicted": {"memory_gib": {k: v / GIB for k, v in plan.memory.phases.items()},
                            "parts_gib": {k: v / GIB for k, v in plan.memory.parts.items()},
                            "seconds": plan.time.phases, "step_seconds": plan.time.step}}
    spans: list[tuple[int, str, float, float]] = []
    step_of = [0]
    record_phases(spans, step_of)
    sampler = MemorySampler()
    sampler.start()
    controller = Controller(config, RunDir.create(config))
    try:
        metrics = []
        for step in range(1, args.steps + 1):
            step_of[0] = step
            metrics.append(controller.step(step))
            print(f"step {step}: {metrics[-1]['timing/step']:.2f} s", flush=True)
    finally:
        sampler.running = False
        controller.close()
    kept = [s for s in spans if s[0] > args.warmup]
    measured_memory = {}
    for phase, plan_phase in PLAN_PHASES.items():
        peaks = [p for _, name, start, end in kept if name == phase and (p := sampler.peak(start, end)) is not None]
        if peaks:
            measured_memory[plan_phase] = max(peaks) / GIB
    measured_seconds = {}
    for _, name, start, end in kept:
        measured_seconds.setdefault(name, []).append(end - start)
    result["measured"] = {"memory_gib": measured_memory,
                          "seconds": {k: sum(v) / len(v) for k, v in measured_seconds.items()}}
    result["ratio_memory"] = {k: v / result["predicted"]["memory_gib"][k] for k, v in measured_memory.items()
                              if result["predicted"]["memory_gib"].get(k)}
    step_measured = result["measured"]["seconds"].get("step")
    result["ratio_step_seconds"] = step_measured / plan.time.step if step_measured else None
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("ratio_memory", "ratio_step_seconds")}, indent=1))


if __name__ == "__main__":
    main()
