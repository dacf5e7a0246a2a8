"""Where a profiled phase's device time goes: a Chrome trace of torch.profiler (`trainer.profile_steps`,
`bench/rlkit_grpo.py --torch-profile`: RUN/profile/step<N>/rank<r>-<phase>.trace.json.gz), read back per op family.

  python bench/trace_summary.py rank0-update_actor.trace.json.gz [--top 25]

Every kernel, copy and memset on the device is traced back to the host op that launched it (its runtime call's
correlation id, then the ops open on that thread at the call), and counted under the innermost of those ops that is
not aten's, the runtime's or inductor's own calls: an autograd node (`CompiledFunctionBackward`,
`SelectedLogProbsBackward`), a compiled region, an FSDP hook; layer numbers are folded (`model.layers.N`).
Each family's time is split into matrix multiplies (cuBLAS/cuBLASLt/CUTLASS/nvjet kernels) and the rest, so a
reader sees at once what runs at the GEMMs' rate and what is memory-bound around them. A second table lists the
kernels themselves, by time. Read on 2026-12-07's H100 profile of the 0.5B update (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# cuBLAS(Lt)'s kernels on Hopper (nvjet_*), and GEMMs by name elsewhere; flash attention's names hold "cutlass" too
MATMUL_KERNEL = re.compile(r"^nvjet|gemm|^cutlass::Kernel|cublas|xmma", re.IGNORECASE)
# ops that say how, not what: aten's, the runtime's, inductor's calls of its graphs and kernels
NOT_A_FAMILY = ("aten::", "cuda", "Memcpy", "Memset", "triton_", "## Call CompiledFxGraph")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def family(open_ops: list[str]) -> str:
    """The innermost host op that says what runs (an autograd node, a hook, a compiled region), layer numbers
    folded; the innermost op where none does."""
    named = [name for name in open_ops if not name.startswith(NOT_A_FAMILY)] or open_ops or ["(no host op)"]
    return re.sub(r"\.\d+\b", ".N", named[-1])


def enclosing_ops(events: list[dict]) -> dict[int, list[str]]:
    """correlation id -> the host ops open (outermost first) when that launch was made, one sweep per thread."""
    by_thread: dict[object, list[tuple[float, int, dict]]] = collections.defaultdict(list)
    for event in events:
        category = event.get("cat")
        if category in HOST_CATEGORIES:
            by_thread[event["tid"]].append((event["ts"], 0, event))  # ops before launches at the same instant
        elif category in LAUNCH_CATEGORIES and "correlation" in event.get("args", {}):
            by_thread[event["tid"]].append((event["ts"], 1, event))
    found: dict[int, list[str]] = {}
    for timeline in by_thread.values():
        timeline.sort(key=lambda item: (item[0], item[1], -item[2].get("dur", 0)))
        stack: list[dict] = []
        for ts, kind, event in timeline:
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) < ts:
                stack.pop()
            if kind == 0:
                stack.append(event)
            else:
                found[event["args"]["correlation"]] = [op["name"] for op in stack]
    return found


def summarize(events: list[dict]) -> tuple[dict[str, list[float]], dict[str, list[float]], float]:
    """(family -> [matmul us, other us, launches], kernel name -> [us, count], all device us)."""
    launched_by = enclosing_ops(events)
    families: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    total = 0.0
    for event in events:
        if event.get("cat") not in DEVICE_CATEGORIES:
            continue
        duration = float(event.get("dur", 0))
        total += duration
        name = event["name"]
        row = families[family(launched_by.get(event.get("args", {}).get("correlation"), []))]
        row[0 if MATMUL_KERNEL.search(name) else 1] += duration
        row[2] += 1
        kernels[name][0] += duration
        kernels[name][1] += 1
    return families, kernels, total


def report(path: Path, top: int) -> str:
    families, kernels, total = summarize(load(path))
    matmul = sum(row[0] for row in families.values())
    lines = [f"{path.name}: device time {total / 1e3:.1f} ms, of it matrix multiplies {matmul / 1e3:.1f} ms "
             f"({100 * matmul / max(total, 1):.1f}%)", "",
             "ms total | ms matmul | ms other | share | launches | host op family"]
    for name, (mm, other, count) in sorted(families.items(), key=lambda item: -(item[1][0] + item[1][1]))[:top]:
        lines.append(f"{(mm + other) / 1e3:8.1f} | {mm / 1e3:9.1f} | {other / 1e3:8.1f} | "
                     f"{100 * (mm + other) / max(total, 1):4.1f}% | {count:8d} | {name[:100]}")
    lines += ["", "ms | count | kernel"]
    for name, (duration, count) in sorted(kernels.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"{duration / 1e3:8.1f} | {count:6d} | {name[:140]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(report(args.trace, args.top))


if __name__ == "__main__":
    main()
