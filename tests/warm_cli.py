"""`rlkit ARGS` in a child process that starts warm, for the runs a test must SIGKILL whose workers are objects in
the CLI's process (trainer.workers=in_process): the killed run is that one process.

A fresh interpreter spends ~8 s of CPU on these machines importing torch, transformers and rlkit before a tiny
run's first step. Instead the child is forked from a forkserver (multiprocessing's "forkserver" start method)
that imported them once per test session. The forkserver is a single-threaded process of its own, so the
fork is safe where forking the test process (its threads, a vLLM engine) would not be. The child gets the
environment it is given (the forkserver's own is from when it started) and exits with the CLI's exit code.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path

# What every run imports before its first step; the rest (vLLM, peft, ...) a child imports as a subprocess would.
PRELOAD = ["torch", "transformers", "rlkit.cli.main", "rlkit.core.controller.loop", "rlkit.core.train.policy_worker"]
_context: ForkServerContext | None = None


def _forkserver() -> ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _run(args: list[str], env: dict[str, str], log: str) -> None:
    """In the child: the CLI with `env`, its output to `log`; exits with the CLI's exit code."""
    # What the forkserver imported lives as long as the child: frozen, the run's full collections skip it (a 3-step
    # in-process GRPO run made 3, 0.51 s of CPU; 0.09 s frozen). No collection first: it would walk it all once more.
    gc.freeze()
    os.environ.clear()
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    from rlkit.cli.main import app

    code = 0
    try:
        app(args, prog_name="rlkit")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - a crash is exit code 1 with its traceback in the log, as a CLI's is
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def start(args: list[str], log: Path) -> multiprocessing.process.BaseProcess:
    """`rlkit ARGS` in a warm child with this process's environment (as os.environ is now); output to `log`."""
    child = _forkserver().Process(target=_run, args=(list(args), dict(os.environ), str(log)))
    child.start()
    return child


def run(args: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """`rlkit ARGS` in a warm child to its end: (exit code, output). Fault counters (RLKIT_FAULT) start at 0 in
    the child, as in a fresh process."""
    child = start(args, log)
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        raise TimeoutError(f"rlkit {' '.join(args)} did not finish within {timeout} s; see {log}")
    return child.exitcode, log.read_text()
