"""SGLang on the GPU, phase by phase: rlkit's SGLangEngine started per variant in a child process with a
hard timeout, its start, a first generate (cold: kernels compile) and an identical second one (warm) timed
apart; then, if a variant generated, the GRPO bench lane with SGLang in the settings that worked.

  python bench/sglang_start.py --workdir /tmp/bw --out /tmp/sgl-start [--budget 280] [--grpo-budget 260]
                               [--tiny] [--dry-run]

GPU only; --dry-run prints the plan. Each variant starts the engine as rlkit does (make_engine from recipe
options, the GRPO bench's lengths and batch), SGLang's logs on, one thing changed, and runs only if the
variant it builds on generated (a narrowing one: did not). Its child rewrites OUT/<variant>/result.json
after each phase, so a timeout names the phase it came in; outcomes.json holds every variant's numbers and
the kernels JIT-compiled meanwhile (new files in the Triton, tvm-ffi and FlashInfer caches). On a timeout
each Python process (SGLang's scheduler too) writes its stacks to OUT/<variant>/stacks-<pid>.txt twice
(bench/sglang_start_site/sitecustomize.py): from a faulthandler timer DUMP_BEFORE s earlier ("Timeout"
header), then on SIGUSR1; processes.txt lists the process tree (a running gcc, nvcc, ninja or ptxas is a
JIT compile) with each process's state and signal masks (SIGUSR1 is bit 0x200), again after the signal,
and nvidia-smi. --grpo-budget S then runs bench/rlkit_grpo.py --rollout sglang (the benchmark workload) in
OUT/grpo for at most S s and prints its step time, rollout tokens/s and step 1's log-prob gap.
"""

from __future__ import annotations

import argparse
import collections
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
HERE = Path(__file__).resolve().parent
SITE = HERE / "sglang_start_site"  # its sitecustomize.py installs the stack dumps
DUMP_BEFORE = 5.0  # seconds before a child's timeout that the timer dump comes (the SIGUSR1 one comes at it)
PROBE_PROMPTS = 8  # prompts per probe generate, each with the workload's samples, lengths and EOS ignored


@dataclass(frozen=True)
class Variant:
    name: str
    timeout: float
    engine_kwargs: dict = field(default_factory=dict)  # rollout.sglang.engine_kwargs
    deterministic: bool = False  # rollout.sglang.deterministic
    sleep_mode: bool = False  # memory saver + weights' CPU backup (colocated), then one sleep/wake cycle
    after: str | None = None  # runs only if this variant...
    when: str = "ok"  # ...generated ("ok") or did not ("failed")


WHEN = {"ok": "generated", "failed": "did not generate"}
TORCH_SAMPLING = {"sampling_backend": "pytorch"}
VARIANTS = (
    # 2026-12-02 (issue 30): with deterministic inference the warm generate ran at 1,482 tok/s; without it the
    # scheduler died of a segfault in the second generate. Deterministic inference samples in PyTorch, SGLang's
    # default samples with FlashInfer's kernels: the first two variants tell whether those are the crash.
    Variant("eager-torch-sampling", 150, {**NO_GRAPHS, **TORCH_SAMPLING}),
    Variant("eager", 130, NO_GRAPHS),  # FlashInfer sampling: a crash leaves its Python stacks in log.txt
    Variant("graphs-saver", 180, LOGS, sleep_mode=True, after="eager"),  # what rlkit runs, logs on
    Variant("graphs-saver-torch-sampling", 180, {**LOGS, **TORCH_SAMPLING}, sleep_mode=True, after="eager",
            when="failed"),
    Variant("graphs-saver-deterministic", 150, LOGS, deterministic=True, sleep_mode=True),  # on request: its cost
)
MIN_TIMEOUT = 30.0  # a variant given less than this of the budget is skipped


def decide(variant: Variant, outcomes: dict[str, dict], remaining: float) -> tuple[float | None, str]:
    """(timeout, "") to run the variant now, or (None, why not)."""
    if variant.after is not None:
        before = outcomes.get(variant.after, {}).get("status")
        if before is None or before.startswith("skipped"):
            return None, f"skipped: {variant.after} did not run"
        if (before == "ok") != (variant.when == "ok"):
            return None, f"skipped: {variant.after} {WHEN['ok' if before == 'ok' else 'failed']}"
    if remaining < MIN_TIMEOUT:
        return None, f"skipped: {remaining:.0f} s of the budget left"
    return min(variant.timeout, remaining), ""


def run_variants(run: Callable[[Variant, float], dict], budget: float) -> dict[str, dict]:
    """Each variant's outcome: what `run(variant, timeout)` returned ({"status": ...} and numbers), or why not."""
    outcomes: dict[str, dict] = {}
    deadline = time.monotonic() + budget
    for variant in VARIANTS:
        timeout, why = decide(variant, outcomes, deadline - time.monotonic())
        outcomes[variant.name] = {"status": why} if timeout is None else run(variant, timeout)
        if timeout is None:
            print(f"{variant.name}: {why}", flush=True)
    return outcomes


def grpo_overrides(outcomes: dict[str, dict]) -> list[str] | None:
    """The GRPO lane's recipe overrides: the settings of the variant that generated fastest; None if none did."""
    ok = [v for v in VARIANTS if outcomes.get(v.name, {}).get("status") == "ok"]
    if not ok:
        return None
    best = max(ok, key=lambda v: outcomes[v.name].get("tokens_per_s", 0))
    kwargs = ", ".join(f"{key}: {json.dumps(value)}" for key, value in best.engine_kwargs.items())
    return ["rollout.sglang.attention_backend=triton",  # the carried kernels have no FA3 (bench/sglang_wheels.sh)
            f"rollout.sglang.deterministic={str(best.deterministic).lower()}",
            f"rollout.sglang.engine_kwargs={{{kwargs}}}"]


def describe(result: dict, status: str, now: float) -> str:
    """One line of a variant's phases: what finished, in seconds, and where a timeout or failure came."""
    done = [f"{label} {result[key]} s" for key, label in (("started_s", "started in"),
                                                          ("first_generate_s", "first generate"),
                                                          ("second_generate_s", "second generate")) if key in result]
    if "tokens_per_s" in result:
        done[-1] += f", {result['tokens_per_s']:,.0f} tok/s ({result['tokens']} tokens)"
    if status != "ok" and "phase" in result:
        done.append(f"{status} in {result['phase']} ({now - result['since']:.0f} s into it)")
    return "; ".join(done) or status


def _session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process of session `sid` (orphans too)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # ended meanwhile
            if os.getsid(int(entry.name)) == sid:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]))
    return found


def _status(pid: int) -> str:
    """Parent, state, pending/blocked/ignored/caught signal masks and kernel wait channel of a process."""
    with contextlib.suppress(OSError):  # ended meanwhile
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        keys = ("PPid", "State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        return " ".join(f"{k}={fields[k].strip()}" for k in keys) + f" wchan={Path(f'/proc/{pid}/wchan').read_text()}"
    return "ended"


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signum)


def run_child(command: list[str], env: dict, timeout: float, folder: Path,
              dump_before: float = DUMP_BEFORE) -> tuple[str, float]:
    """Run `command` in its own session; past `timeout`, dump its Python stacks and kill all of it."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**env, "SGLANG_START_STACKS": str(folder), "SGLANG_START_DUMP_AT": str(time.time() + timeout - dump_before),
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
            listing = "\n".join(f"{pid} {cmd}\n    {_status(pid)}" for pid, cmd in tree)
            (folder / "processes.txt").write_text(listing + "\n\n" + (smi.stdout if smi else "no nvidia-smi"))
            # Only processes that installed the handler (they have a stacks file): SIGUSR1 ends any other.
            python = [pid for pid, _ in tree if (folder / f"stacks-{pid}.txt").exists()]
            _signal(python, signal.SIGUSR1)
            time.sleep(3)
            with open(folder / "processes.txt", "a") as out:  # a signal still pending is blocked in every thread
                out.write("\n3 s after SIGUSR1:\n" + "\n".join(f"{pid} {_status(pid)}" for pid in python) + "\n")
    elapsed = time.monotonic() - start
    _signal([pid for pid, _ in _session(child.pid)], signal.SIGKILL)  # what is left, e.g. an orphaned scheduler
    child.wait()
    return status, elapsed


def jit_caches() -> dict[str, Path]:
    """Where Triton, SGLang's tvm-ffi kernels and FlashInfer keep what they compile (their defaults)."""
    home = Path.home()
    triton = os.environ.get("TRITON_CACHE_DIR") or Path(os.environ.get("TRITON_HOME", home)) / ".triton" / "cache"
    return {"triton": Path(triton),
            "tvm-ffi": Path(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser(),
            "flashinfer": home / ".cache" / "flashinfer"}


def jit_files(caches: dict[str, Path]) -> set[tuple[str, Path]]:
    """Compiled kernels in the caches: a .cubin per Triton kernel, a .so per launcher or module."""
    return {(name, path) for name, root in caches.items() if root.is_dir()
            for path in root.rglob("*") if path.suffix in (".cubin", ".so")}


def compiled(before: set[tuple[str, Path]], after: set[tuple[str, Path]]) -> dict[str, int]:
    """New kernels per cache and name ("triton:_fwd_kernel": 2 = two specializations of it)."""
    return dict(sorted(collections.Counter(f"{name}:{path.stem}" for name, path in after - before).items()))


def child_main(args: argparse.Namespace) -> None:
    """One variant: start the engine as rlkit does, generate twice, sleep and wake; result.json after each phase."""
    variant = next(v for v in VARIANTS if v.name == args.child)
    out = Path(args.out) / variant.name / "result.json"
    result: dict = {}

    def phase(name: str, **numbers: object) -> None:
        """What just finished and the phase that starts now (read by the parent after a timeout)."""
        result.update(numbers, phase=name, since=time.time())
        out.with_suffix(".tmp").write_text(json.dumps(result))
        out.with_suffix(".tmp").replace(out)

    tic = time.monotonic()
    phase("import")
    import sglang
    import torch

    from bench.workload import prepared
    from rlkit.core.rollout.base import Sampling
    from rlkit.core.rollout.engines import make_engine
    from rlkit.recipes.schema import RLConfig

    workload, folder = prepared(args.workdir, args.tiny)
    print(f"import sglang {sglang.__version__}, torch {torch.__version__}: {time.monotonic() - tic:.1f} s", flush=True)
    config = RLConfig(rollout={"name": "sglang", "gpu_memory_utilization": 0.35, "max_num_seqs": workload.sequences,
                               "sglang": {"attention_backend": "triton", "deterministic": variant.deterministic,
                                          "engine_kwargs": variant.engine_kwargs}},  # as the GRPO bench runs it
                      data={"max_prompt_length": workload.prompt_tokens, "max_response_length": workload.response_tokens})
    phase("start", import_s=round(time.monotonic() - tic, 1))
    tic = time.monotonic()
    rollout = make_engine(config.rollout, str(folder / "model"),
                          max_model_len=config.data.max_prompt_length + config.data.max_response_length,
                          device=torch.device("cuda", 0), dtype="bfloat16", seed=0, sleep_mode=variant.sleep_mode)
    phase("first generate", started_s=round(time.monotonic() - tic, 1))
    print(f"started in {result['started_s']} s", flush=True)
    prompts = [[3 + (7 * i + j) % 200 for j in range(workload.prompt_tokens)]
               for i in range(min(PROBE_PROMPTS, workload.prompts))]
    sampling = Sampling(n=workload.samples, max_tokens=workload.response_tokens, seed=1, ignore_eos=True)
    tic = time.monotonic()
    first = rollout.generate(prompts, sampling)
    phase("second generate", first_generate_s=round(time.monotonic() - tic, 1))
    print(f"first generate {result['first_generate_s']} s", flush=True)
    tic = time.monotonic()
    second = rollout.generate(prompts, sampling)
    seconds = time.monotonic() - tic
    tokens = sum(len(s.token_ids) for s in second)
    log_probs = [lp for s in second for lp in s.log_probs]
    phase("sleep/wake" if variant.sleep_mode else "shutdown", second_generate_s=round(seconds, 2), tokens=tokens,
          tokens_per_s=round(tokens / seconds), honors_seeds=rollout.honors_seeds,
          repeated=[s.token_ids for s in second] == [s.token_ids for s in first],  # same seeds: equal if they count
          mean_log_prob=round(sum(log_probs) / len(log_probs), 4))
    print(f"second generate {seconds:.2f} s, {tokens / seconds:,.0f} tok/s", flush=True)
    if variant.sleep_mode:  # free device memory (GiB) awake, asleep, awake again
        free = [torch.cuda.mem_get_info(0)[0] / 2**30]
        for step in (rollout.sleep, rollout.wake_up):
            step()
            free.append(torch.cuda.mem_get_info(0)[0] / 2**30)
        phase("shutdown", free_gib_awake_asleep_awake=[round(f, 2) for f in free])
    rollout.shutdown()
    phase("done")


def run_grpo(args: argparse.Namespace, overrides: list[str]) -> dict:
    """The GRPO bench lane with SGLang for at most --grpo-budget s; its step time, rollout tok/s, log-prob gap."""
    folder = Path(args.out) / "grpo"
    command = [sys.executable, str(HERE / "rlkit_grpo.py"), "--workdir", args.workdir, "--out",
               str(folder / "result.json"), "--label", "rlkit-1gpu-sglang", "--rollout", "sglang", "--defaults",
               *(["--tiny"] if args.tiny else []), *[a for o in overrides for a in ("--override", o)]]
    print("grpo:", " ".join(command), flush=True)
    status, elapsed = run_child(command, dict(os.environ), args.grpo_budget, folder)
    path = folder / "result.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    summary = result.get("summary") or {}
    outcome = {"status": status, "seconds": round(elapsed), "lane": result.get("status"),
               "setup_s": result.get("setup_seconds"), "steps_s": [s["timing/step"] for s in result.get("steps", [])],
               "step_s": summary.get("step_seconds"), "rollout": summary.get("rollout"),
               "log_prob_diff_by_step": result.get("log_prob_diff_by_step"), "overrides": overrides}
    print(f"grpo: {status} after {elapsed:.0f} s:", json.dumps(outcome), flush=True)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/bw", help="the benchmark model (bench/workload.py), built on first use")
    parser.add_argument("--out", default="/tmp/sglang-start")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for all variants together")
    parser.add_argument("--grpo-budget", type=float, default=0.0,
                        help="then, if a variant generated, the GRPO bench lane with SGLang for at most this long")
    parser.add_argument("--tiny", action="store_true", help="the tiny workload model instead of the 0.5B shape")
    parser.add_argument("--outcomes", help="an earlier call's outcomes.json: its variants are not run again, the GRPO "
                        "lane takes its settings from them")
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args)
    for v in VARIANTS:
        print(f"plan: {v.name} ({v.timeout:.0f} s{f' if {v.after} {WHEN[v.when]}' if v.after else ''}): "
              f"engine_kwargs={v.engine_kwargs} deterministic={v.deterministic} sleep_mode={v.sleep_mode}")
    print(f"plan: within --budget {args.budget:.0f} s; then, if one generated and --grpo-budget "
          f"{args.grpo_budget:.0f} > 0, bench/rlkit_grpo.py --rollout sglang --defaults in the settings of the "
          "variant that generated fastest", flush=True)
    if args.dry_run:
        return
    from bench.workload import prepared

    prepared(args.workdir, args.tiny)  # built once here, not in each child
    print("env:", {name: os.environ.get(name) for name in ("CUDA_HOME", "PYTORCH_CUDA_ALLOC_CONF", "LD_LIBRARY_PATH")},
          {tool: shutil.which(tool) for tool in ("nvcc", "ninja", "gcc")}, {k: str(v) for k, v in jit_caches().items()})

    def run(variant: Variant, timeout: float) -> dict:
        vdir = Path(args.out) / variant.name
        command = [sys.executable, str(Path(__file__).resolve()), "--child", variant.name, "--workdir", args.workdir,
                   "--out", args.out, *(["--tiny"] if args.tiny else [])]
        before = jit_files(jit_caches())
        status, elapsed = run_child(command, dict(os.environ), timeout, vdir)
        path = vdir / "result.json"
        result = json.loads(path.read_text()) if path.exists() else {}
        outcome = {"status": status, "seconds": round(elapsed), **result,
                   "compiled": compiled(before, jit_files(jit_caches()))}
        tail = [] if status == "ok" else (vdir / "log.txt").read_text(errors="replace").splitlines()[-8:]
        stopped = time.time() - max(0.0, elapsed - timeout)  # a timeout's dumps and kill took a few seconds more
        print(f"{variant.name}: {status} after {elapsed:.0f} s: {describe(result, status, stopped)}",
              f"  compiled: {outcome['compiled']}", *("  | " + line[:240] for line in tail), sep="\n", flush=True)
        return outcome

    outcomes_file = Path(args.out) / "outcomes.json"
    outcomes_file.parent.mkdir(parents=True, exist_ok=True)
    outcomes = json.loads(Path(args.outcomes).read_text()) if args.outcomes else run_variants(run, args.budget)
    outcomes_file.write_text(json.dumps(outcomes, indent=1))
    overrides = grpo_overrides(outcomes)
    if args.grpo_budget > 0:
        outcomes["grpo"] = run_grpo(args, overrides) if overrides else {"status": "skipped: no variant generated"}
        if not overrides:
            print("grpo:", outcomes["grpo"]["status"], flush=True)
        outcomes_file.write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    main()
