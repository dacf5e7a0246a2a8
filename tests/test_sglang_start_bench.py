"""bench/sglang_start.py: which variants run after which outcomes and within which budget, which settings the
GRPO lane takes from them, how a variant's phases read; a child that hangs is stopped at its timeout with
the stacks of each of its Python processes (a spawned grandchild too, as SGLang's scheduler is), twice, and
nothing of it left running; and a variant's child, with a stand-in `sglang`, records each phase."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from bench import sglang_start
from bench.sglang_start import VARIANTS, compiled, decide, describe, grpo_overrides, jit_files, run_child, run_variants

NAMES = [v.name for v in VARIANTS]


def _outcomes(statuses: dict[str, str], budget: float = 1000.0, monkeypatch=None) -> dict:
    """run_variants with each variant ending as `statuses` says, using all of its timeout on a fake clock."""
    clock, ran = [0.0], []
    if monkeypatch is not None:
        monkeypatch.setattr(sglang_start, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def run(variant, timeout):
        ran.append((variant.name, timeout))
        clock[0] += timeout
        return {"status": statuses[variant.name]}

    return {name: o["status"] for name, o in run_variants(run, budget).items()} | {"ran": ran}


def test_each_variant_runs_only_after_the_outcome_it_needs():
    assert NAMES == ["eager-torch-sampling", "eager", "graphs-saver", "graphs-saver-torch-sampling",
                     "graphs-saver-deterministic"]
    assert _outcomes(dict.fromkeys(NAMES, "ok")) == {
        "eager-torch-sampling": "ok", "eager": "ok", "graphs-saver": "ok",
        "graphs-saver-torch-sampling": "skipped: eager generated", "graphs-saver-deterministic": "ok",
        "ran": [("eager-torch-sampling", 150), ("eager", 130), ("graphs-saver", 180),
                ("graphs-saver-deterministic", 150)]}
    # FlashInfer's sampling crashes (2026-12-02): the graphs run samples in PyTorch.
    crash = _outcomes({"eager-torch-sampling": "ok", "eager": "failed (exit -11)", "graphs-saver-torch-sampling": "ok",
                       "graphs-saver-deterministic": "ok"})
    assert [name for name, _ in crash["ran"]] == [n for n in NAMES if n != "graphs-saver"]
    assert crash["graphs-saver"] == "skipped: eager did not generate"


def test_the_budget_shortens_the_last_timeout_and_skips_what_no_longer_fits(monkeypatch):
    assert decide(VARIANTS[0], {}, remaining=100.0) == (100.0, "")
    assert decide(VARIANTS[0], {}, remaining=29.0) == (None, "skipped: 29 s of the budget left")
    assert decide(VARIANTS[2], {"eager": {"status": "ok"}}, remaining=500.0) == (180, "")
    # 320 s: 150 + 130, then the graphs variant gets the 40 left and nothing is left for the last.
    outcomes = _outcomes(dict.fromkeys(NAMES, "ok"), budget=320.0, monkeypatch=monkeypatch)
    assert outcomes["ran"] == [("eager-torch-sampling", 150), ("eager", 130), ("graphs-saver", 40)]
    assert outcomes["graphs-saver-deterministic"] == "skipped: 0 s of the budget left"


def test_the_grpo_lane_takes_the_settings_of_the_fastest_variant_that_generated():
    assert grpo_overrides({"eager": {"status": "timeout"}, "graphs-saver": {"status": "skipped: x"}}) is None
    triton = "rollout.sglang.attention_backend=triton"
    assert grpo_overrides({"eager": {"status": "ok", "tokens_per_s": 9000},
                           "eager-torch-sampling": {"status": "ok", "tokens_per_s": 8000}}) == [
        triton, "rollout.sglang.deterministic=false",
        'rollout.sglang.engine_kwargs={log_level: "info", disable_cuda_graph: true}']
    assert grpo_overrides({"graphs-saver-torch-sampling": {"status": "ok", "tokens_per_s": 30000},
                           "graphs-saver-deterministic": {"status": "ok", "tokens_per_s": 5000},
                           "eager": {"status": "failed (exit -11)"}}) == [
        triton, "rollout.sglang.deterministic=false",
        'rollout.sglang.engine_kwargs={log_level: "info", sampling_backend: "pytorch"}']
    assert grpo_overrides({"graphs-saver-deterministic": {"status": "ok", "tokens_per_s": 5000}})[1:] == [
        "rollout.sglang.deterministic=true", 'rollout.sglang.engine_kwargs={log_level: "info"}']


def test_a_variants_phases_read_as_one_line():
    done = {"started_s": 32.3, "first_generate_s": 61.0, "second_generate_s": 4.0, "tokens": 32768,
            "tokens_per_s": 8192, "phase": "done", "since": 0.0}
    assert describe(done, "ok", now=5.0) == ("started in 32.3 s; first generate 61.0 s; "
                                             "second generate 4.0 s, 8,192 tok/s (32768 tokens)")
    in_generate = {"started_s": 32.3, "phase": "first generate", "since": 1000.0}
    assert describe(in_generate, "timeout", now=1050.4) == "started in 32.3 s; timeout in first generate (50 s into it)"
    assert describe({}, "failed (exit 1)", now=0.0) == "failed (exit 1)"


def test_new_kernels_are_counted_per_cache_and_name(tmp_path):
    for name in ("a/k.cubin", "a/k.json", "b/__triton_launcher.so", "b/k.ptx"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    found = jit_files({"triton": tmp_path, "flashinfer": tmp_path / "absent"})
    assert found == {("triton", tmp_path / "a/k.cubin"), ("triton", tmp_path / "b/__triton_launcher.so")}
    later = found | {("triton", tmp_path / "c/k.cubin"), ("tvm-ffi", tmp_path / "m/silu_and_mul.so")}
    assert compiled(found, later) == {"triton:k": 1, "tvm-ffi:silu_and_mul": 1}


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
    status, elapsed = run_child([sys.executable, str(script)], dict(os.environ), 6.0, tmp_path / "out", dump_before=2.0)
    assert status == "timeout" and 6.0 <= elapsed < 17.0
    child, grandchild = map(int, (tmp_path / "out" / "log.txt").read_text().split()[1:3])
    stacks = {pid: (tmp_path / "out" / f"stacks-{pid}.txt").read_text() for pid in (child, grandchild)}
    # Twice each: from the timer 2 s before the timeout, then on SIGUSR1.
    assert stacks[child].count("in child_waits") == 2 and stacks[grandchild].count("in grandchild_waits") == 2
    assert stacks[grandchild].index("Timeout (") < stacks[grandchild].index("in grandchild_waits")
    listed = (tmp_path / "out" / "processes.txt").read_text()
    assert f"{child} " in listed and f"{grandchild} " in listed and "SigCgt=" in listed
    assert "3 s after SIGUSR1:" in listed
    deadline = time.monotonic() + 5
    while sglang_start._session(child) and time.monotonic() < deadline:  # the orphan is reaped by init
        time.sleep(0.1)
    assert sglang_start._session(child) == []


@pytest.mark.parametrize(("code", "status"), [("0", "ok"), ("3", "failed (exit 3)")])
def test_a_child_that_ends_reports_how(tmp_path, code, status):
    assert run_child([sys.executable, "-c", f"raise SystemExit({code})"], dict(os.environ), 30.0, tmp_path)[0] == status


STAND_IN = '''
"""A stand-in for sglang.Engine: ids from the per-request seed under deterministic inference, random
otherwise; its first generate never returns when STAND_IN_HANGS is set (as a kernel compile that outlasts the
timeout)."""
import os, random, time

__version__ = "stand-in"


class Engine:
    def __init__(self, **kwargs):
        self.deterministic = kwargs["enable_deterministic_inference"]

    def generate(self, input_ids, sampling_params, return_logprob):
        if os.environ.get("STAND_IN_HANGS"):
            time.sleep(60)
        outputs = []
        for params in sampling_params:
            rng = random.Random(params["sampling_seed"] if self.deterministic else None)
            ids = [rng.randrange(3, 500) for _ in range(params["max_new_tokens"])]
            outputs.append({"output_ids": ids, "meta_info": {"output_token_logprobs": [[-2.0, i, None] for i in ids],
                                                             "finish_reason": {"type": "length"}}})
        return outputs

    def shutdown(self):
        pass
'''


@pytest.mark.bench
@pytest.mark.slow  # two children that import torch and rlkit, one hanging to its timeout: ~30 s
def test_a_variants_child_records_each_phase_and_where_it_hung(tmp_path):
    """The child as the bench starts it, on the tiny workload with a stand-in SGLang (no GPU is touched
    without the memory saver): numbers of each phase, or the phase a timeout came in."""
    from bench.workload import TINY, prepared

    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text(STAND_IN)
    prepared(tmp_path / "bw", tiny=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(sglang_start.HERE).parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"

    def child(variant: str, timeout: float, **extra: str) -> tuple[str, dict]:
        command = [sys.executable, str(sglang_start.HERE / "sglang_start.py"), "--child", variant,
                   "--workdir", str(tmp_path / "bw"), "--out", str(out), "--tiny"]
        status, _ = run_child(command, {**env, **extra}, timeout, out / variant, dump_before=2.0)
        return status, json.loads((out / variant / "result.json").read_text())

    status, result = child("eager", 120.0)
    assert status == "ok", (out / "eager" / "log.txt").read_text()
    # The tiny workload: 4 prompts x 4 samples x 8 tokens, each token's log-prob -2; the same seeds again
    # give other tokens without deterministic inference (rlkit's default on GPUs).
    assert result["tokens"] == TINY.prompts * TINY.samples * TINY.response_tokens == 128
    assert result["phase"] == "done" and result["mean_log_prob"] == -2.0
    assert result["honors_seeds"] is False and result["repeated"] is False
    assert {"import_s", "started_s", "first_generate_s", "second_generate_s", "tokens_per_s"} <= result.keys()
    status, result = child("eager-torch-sampling", 20.0, STAND_IN_HANGS="1")
    assert status == "timeout" and result["phase"] == "first generate" and "first_generate_s" not in result
    stacks = "".join(p.read_text() for p in (out / "eager-torch-sampling").glob("stacks-*.txt"))
    # In the stand-in's generate, from the timer and on SIGUSR1.
    assert len(re.findall(r'sglang/__init__\.py", line \d+ in generate', stacks)) == 2
