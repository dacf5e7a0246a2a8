"""bench/py_spy_summary.py: a py-spy profile of every process, summed per process name, thread and function."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.py_spy_summary import function_name, process_name, read, summary  # noqa: E402

DRIVER = 'process 10:"python3 bench/rlkit_grpo.py --label x"'
WORKER = 'process 11:"ray::PolicyWorker"'
CORE_A, CORE_B = 'process 12:"VLLM::EngineCore"', 'process 13:"VLLM::EngineCore"'
PROFILE = "\n".join([
    f"{DRIVER};<module> (bench/rlkit_grpo.py:281);main (bench/rlkit_grpo.py:250) 40",
    f"{DRIVER};{WORKER};Thread._bootstrap (threading.py:1030);decode (vllm/serial_utils.py:346) 300",
    f"{DRIVER};{WORKER};Thread._bootstrap (threading.py:1030);decode (vllm/serial_utils.py:350) 100",
    f"{DRIVER};{WORKER};<module> (ray/default_worker.py:323);update (rlkit/actor.py:139) 200",
    f"{DRIVER};{WORKER};{CORE_A};step (vllm/core.py:645);step (vllm/core.py:700) 500",
    f"{DRIVER};{WORKER};{CORE_B};step (vllm/core.py:645) 300",
    "a line py-spy did not write",
])


def test_processes_by_name_threads_by_first_frame_functions_once_a_sample(tmp_path):
    """The innermost process frame owns a stack (a child's under its parent's); two engine cores sum under one
    name; a function is counted once a sample however often it recurs on the stack, its call sites (lines) as
    one; 200 samples a second."""
    path = tmp_path / "profile.txt"
    path.write_text(PROFILE)
    profile = read(path)
    assert dict(profile.processes) == {"rlkit_grpo.py": 40, "ray::PolicyWorker": 600, "VLLM::EngineCore": 800}
    assert profile.threads[("ray::PolicyWorker", "Thread._bootstrap (threading.py)")] == 400
    assert profile.functions["ray::PolicyWorker"]["decode (serial_utils.py)"] == 400
    assert profile.functions["VLLM::EngineCore"]["step (core.py)"] == 800  # twice on one stack: counted once
    report = summary(profile, None, top=5, rate=200, keep=None)
    assert "VLLM::EngineCore  | 4.00" in report and "ray::PolicyWorker | 3.00" in report


def test_against_another_profile_the_rows_are_the_differences_largest_first(tmp_path):
    with_lp, without = tmp_path / "with.txt", tmp_path / "without.txt"
    with_lp.write_text(PROFILE)
    without.write_text(f"{DRIVER};{WORKER};<module> (ray/default_worker.py:323);update (rlkit/actor.py:139) 300\n"
                       f"{DRIVER};{WORKER};{CORE_A};step (vllm/core.py:645) 700")
    report = summary(read(with_lp), read(without), top=5, rate=200, keep="PolicyWorker")
    lines = report.splitlines()
    assert lines[3].split("|")[0].strip() == "ray::PolicyWorker" and "VLLM" not in report  # --process
    decode = next(line for line in lines if line.startswith("decode (serial_utils.py)"))
    assert [cell.strip() for cell in decode.split("|")[1:]] == ["2.00", "0.00", "2.00"]
    update = next(line for line in lines if line.startswith("update (actor.py)"))
    assert [cell.strip() for cell in update.split("|")[1:]] == ["1.00", "1.50", "-0.50"]


def test_names_a_command_by_its_program_and_a_frame_by_its_file():
    monitor = 'process 1:"/usr/bin/python3 -u /root/site/ray/_private/log_monitor.py --x"'
    assert process_name(monitor) == "log_monitor.py"
    assert process_name('process 2:"/root/site/ray/core/src/ray/raylet/raylet --a=b"') == "raylet"
    assert function_name("Worker.main_loop (ray/_private/worker.py:1069)") == "Worker.main_loop (worker.py)"
    assert function_name("<module> (<string>:1)") == "<module> (<string>)"
