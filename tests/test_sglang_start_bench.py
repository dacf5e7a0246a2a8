"""bench/sglang_start.py: which start-up variants run after which outcomes, and a child that hangs is
stopped at its timeout with the stacks of each of its Python processes (a spawned grandchild too, as
SGLang's scheduler is) and nothing of it left running."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from bench import sglang_start
from bench.sglang_start import VARIANTS, decide, run_child, run_variants


def _outcomes(results: dict[str, str], budget: float = 1000.0) -> dict[str, str]:
    ran: list[tuple[str, float]] = []

    def run(variant, timeout):
        ran.append((variant.name, timeout))
        return results[variant.name]

    return run_variants(run, budget) | {"ran": ran}


def test_each_variant_runs_only_after_the_outcome_it_needs():
    assert [v.name for v in VARIANTS] == ["eager", "eager-nondeterministic", "eager-saver", "graphs-saver",
                                          "graphs-saver-small"]
    everything_starts = _outcomes(dict.fromkeys([v.name for v in VARIANTS], "ok"))
    assert everything_starts == {
        "eager": "ok", "eager-nondeterministic": "skipped: eager started", "eager-saver": "ok",
        "graphs-saver": "ok", "graphs-saver-small": "skipped: graphs-saver started",
        "ran": [("eager", 150), ("eager-saver", 90), ("graphs-saver", 150)]}
    eager_hangs = _outcomes({"eager": "timeout", "eager-nondeterministic": "ok"})
    assert eager_hangs == {
        "eager": "timeout", "eager-nondeterministic": "ok", "eager-saver": "skipped: eager did not start",
        "graphs-saver": "skipped: eager-saver did not run", "graphs-saver-small": "skipped: graphs-saver did not run",
        "ran": [("eager", 150), ("eager-nondeterministic", 90)]}
    graphs_fail = _outcomes({"eager": "ok", "eager-saver": "ok", "graphs-saver": "failed (exit -9)",
                             "graphs-saver-small": "ok"})
    assert graphs_fail["ran"] == [("eager", 150), ("eager-saver", 90), ("graphs-saver", 150),
                                  ("graphs-saver-small", 90)]


def test_the_budget_shortens_the_last_timeout_and_skips_what_no_longer_fits():
    assert decide(VARIANTS[0], {}, remaining=100.0) == (100.0, "")
    assert decide(VARIANTS[0], {}, remaining=29.0) == (None, "skipped: 29 s of the budget left")
    assert decide(VARIANTS[2], {"eager": "ok"}, remaining=500.0) == (90, "")


def test_a_hanging_child_is_stopped_with_the_stacks_of_all_its_python_processes(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp, os, time

        def grandchild_waits(ready):
            ready.put(os.getpid())
            time.sleep(60)

        def child_waits():
            time.sleep(60)

        if __name__ == "__main__":
            mp.set_start_method("spawn")
            ready = mp.Queue()
            mp.Process(target=grandchild_waits, args=(ready,)).start()
            print("pids", os.getpid(), ready.get(), flush=True)
            child_waits()
    """))
    status, elapsed = run_child([sys.executable, str(script)], dict(os.environ), 4.0, tmp_path / "out")
    assert status == "timeout" and 4.0 <= elapsed < 15.0
    child, grandchild = map(int, (tmp_path / "out" / "log.txt").read_text().split()[1:3])
    stacks = {pid: (tmp_path / "out" / f"stacks-{pid}.txt").read_text() for pid in (child, grandchild)}
    assert "in child_waits" in stacks[child] and "in grandchild_waits" in stacks[grandchild]
    listed = (tmp_path / "out" / "processes.txt").read_text()
    assert f"{child} " in listed and f"{grandchild} " in listed
    deadline = time.monotonic() + 5
    while sglang_start._session(child) and time.monotonic() < deadline:  # the orphan is reaped by init
        time.sleep(0.1)
    assert sglang_start._session(child) == []


@pytest.mark.parametrize(("code", "status"), [("0", "ok"), ("3", "failed (exit 3)")])
def test_a_child_that_ends_reports_how(tmp_path, code, status):
    assert run_child([sys.executable, "-c", f"raise SystemExit({code})"], dict(os.environ), 30.0, tmp_path)[0] == status
