"""Where SGLang's engine start stops: rlkit's SGLangEngine started per variant in a child process with a hard timeout.

  python bench/sglang_start.py --workdir /tmp/bw --out /tmp/sgl-start [--budget 230] [--tiny] [--dry-run]

GPU only; --dry-run prints the plan. Each variant starts the engine as rlkit does (make_engine, its
engine_kwargs), SGLang's logs on, one thing changed; it prints `started in X s` and one generate, or
`timeout`, and runs only if the variant it builds on started (a narrowing one: did not). On a timeout
each Python process (SGLang's scheduler too) writes its stacks to OUT/<variant>/stacks-<pid>.txt
(faulthandler on SIGUSR1: bench/sglang_start_site/sitecustomize.py) and processes.txt lists the process
tree (a running nvcc, ninja or ptxas is a JIT compile) and nvidia-smi; log.txt has all it printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LOGS = {"log_level": "info"}
NO_GRAPHS = {**LOGS, "disable_cuda_graph": True}
SITE = Path(__file__).resolve().parent / "sglang_start_site"  # its sitecustomize.py installs the stack dumps


@dataclass(frozen=True)
class Variant:
    name: str
    timeout: float
    engine_kwargs: dict = field(default_factory=dict)  # rollout.sglang.engine_kwargs
    sleep_mode: bool = False  # memory saver + weights' CPU backup (colocated), then one sleep/wake cycle
    patch: dict = field(default_factory=dict)  # sglang.Engine arguments changed after rlkit built them
    after: str | None = None  # runs only if this variant...
    when: str = "ok"  # ...started ("ok") or did not ("failed")


WHEN = {"ok": "started", "failed": "did not start"}
VARIANTS = (
    Variant("eager", 150, NO_GRAPHS),
    Variant("eager-nondeterministic", 90, NO_GRAPHS, patch={"enable_deterministic_inference": False},
            after="eager", when="failed"),
    Variant("eager-saver", 90, NO_GRAPHS, sleep_mode=True, after="eager"),
    Variant("graphs-saver", 150, LOGS, sleep_mode=True, after="eager-saver"),  # what rlkit runs, logs on
    Variant("graphs-saver-small", 90, {**LOGS, "cuda_graph_max_bs_decode": 8, "disable_prefill_cuda_graph": True},
            sleep_mode=True, after="graphs-saver", when="failed"),
)
MIN_TIMEOUT = 30.0  # a variant given less than this of the budget is skipped


def decide(variant: Variant, outcomes: dict[str, str], remaining: float) -> tuple[float | None, str]:
    """(timeout, "") to run the variant now, or (None, why not)."""
    if variant.after is not None:
        before = outcomes.get(variant.after)
        if before is None or before.startswith("skipped"):
            return None, f"skipped: {variant.after} did not run"
        if (before == "ok") != (variant.when == "ok"):
            return None, f"skipped: {variant.after} {WHEN['ok' if before == 'ok' else 'failed']}"
    if remaining < MIN_TIMEOUT:
        return None, f"skipped: {remaining:.0f} s of the budget left"
    return min(variant.timeout, remaining), ""


def run_variants(run: Callable[[Variant, float], str], budget: float) -> dict[str, str]:
    """Each variant's outcome: what `run(variant, timeout)` returned, or why it was skipped."""
    outcomes: dict[str, str] = {}
    deadline = time.monotonic() + budget
    for variant in VARIANTS:
        timeout, why = decide(variant, outcomes, deadline - time.monotonic())
        outcomes[variant.name] = why if timeout is None else run(variant, timeout)
        if timeout is None:
            print(f"{variant.name}: {why}", flush=True)
    return outcomes


def _session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process of session `sid` (orphans too)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # ended meanwhile
            if os.getsid(int(entry.name)) == sid:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]))
    return found


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signum)


def run_child(command: list[str], env: dict, timeout: float, folder: Path) -> tuple[str, float]:
    """Run `command` in its own session; past `timeout`, dump its Python stacks and kill all of it."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**env, "SGLANG_START_STACKS": str(folder),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH", "")]))}
    start = time.monotonic()
    with open(folder / "log.txt", "w") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = child.wait(timeout)
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            status = "timeout"
            tree = _session(child.pid)
            smi = shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
            (folder / "processes.txt").write_text("\n".join(f"{pid} {cmd}" for pid, cmd in tree) + "\n\n"
                                                  + (smi.stdout if smi else "no nvidia-smi"))
            # Only processes that installed the handler (they have a stacks file): SIGUSR1 ends any other.
            _signal([pid for pid, _ in tree if (folder / f"stacks-{pid}.txt").exists()], signal.SIGUSR1)
            time.sleep(3)
    elapsed = time.monotonic() - start
    _signal([pid for pid, _ in _session(child.pid)], signal.SIGKILL)  # what is left, e.g. an orphaned scheduler
    child.wait()
    return status, elapsed


def child_main(args: argparse.Namespace) -> None:
    """One variant: start the engine as rlkit does, generate, sleep and wake; write result.json."""
    variant = next(v for v in VARIANTS if v.name == args.child)
    tic = time.monotonic()
    import sglang
    import torch

    from rlkit.core.rollout.base import Sampling
    from rlkit.core.rollout.engines import make_engine
    from rlkit.recipes.schema import RLConfig
    print(f"import sglang {sglang.__version__}, torch {torch.__version__}: {time.monotonic() - tic:.1f} s", flush=True)
    real_engine = sglang.Engine  # SGLangEngine looks it up when it starts; SGLang logs the arguments it got
    sglang.Engine = lambda **kwargs: real_engine(**{**kwargs, **variant.patch})
    config = RLConfig(rollout={"name": "sglang", "gpu_memory_utilization": 0.35,  # the GRPO bench's
                               "sglang": {"attention_backend": "triton", "engine_kwargs": variant.engine_kwargs}},
                      data={"max_prompt_length": 256, "max_response_length": 512})
    tic = time.monotonic()
    rollout = make_engine(config, args.model, device=torch.device("cuda", 0), dtype="bfloat16", seed=0,
                          sleep_mode=variant.sleep_mode)
    result = {"started_s": round(time.monotonic() - tic, 1)}
    print(f"engine started in {result['started_s']} s", flush=True)  # then a generate (eager: the first forward)
    tic = time.monotonic()
    samples = rollout.generate([[1, 2, 3, 4]], Sampling(n=2, max_tokens=8, seed=1, log_probs=True))
    result.update(generate_s=round(time.monotonic() - tic, 2), tokens=[s.token_ids for s in samples],
                  log_probs=[s.log_probs for s in samples])
    if variant.sleep_mode:  # free device memory (GiB) awake, asleep, awake again
        free = [torch.cuda.mem_get_info(0)[0] / 2**30]
        for step in (rollout.sleep, rollout.wake_up):
            step()
            free.append(torch.cuda.mem_get_info(0)[0] / 2**30)
        result["free_gib_awake_asleep_awake"] = [round(f, 2) for f in free]
    rollout.shutdown()
    (Path(args.out) / variant.name / "result.json").write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/bw", help="the benchmark model (bench/workload.py), built on first use")
    parser.add_argument("--out", default="/tmp/sglang-start")
    parser.add_argument("--budget", type=float, default=230.0, help="seconds for all variants together")
    parser.add_argument("--tiny", action="store_true", help="the tiny workload model instead of the 0.5B shape")
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args)
    for v in VARIANTS:
        print(f"plan: {v.name} ({v.timeout:.0f} s{f' if {v.after} {WHEN[v.when]}' if v.after else ''}): "
              f"engine_kwargs={v.engine_kwargs} sleep_mode={v.sleep_mode} patch={v.patch}")
    if args.dry_run:
        return
    from bench.workload import prepared

    _, folder = prepared(args.workdir, args.tiny)
    print("env:", {name: os.environ.get(name) for name in ("CUDA_HOME", "PYTORCH_CUDA_ALLOC_CONF", "LD_LIBRARY_PATH")},
          {tool: shutil.which(tool) for tool in ("nvcc", "ninja")}, "/usr/local/cuda", Path("/usr/local/cuda").exists())

    def run(variant: Variant, timeout: float) -> str:
        vdir = Path(args.out) / variant.name
        command = [sys.executable, str(Path(__file__).resolve()), "--child", variant.name,
                   "--model", str(folder / "model"), "--out", args.out]
        status, elapsed = run_child(command, dict(os.environ), timeout, vdir)
        result, tail = vdir / "result.json", (vdir / "log.txt").read_text(errors="replace").splitlines()[-8:]
        print(f"{variant.name}: {status} after {elapsed:.0f} s", result.read_text() if result.exists() else "",
              *("  | " + line[:240] for line in ([] if status == "ok" else tail)), sep="\n", flush=True)
        return status

    (Path(args.out) / "outcomes.json").write_text(json.dumps(run_variants(run, args.budget), indent=1))


if __name__ == "__main__":
    main()
