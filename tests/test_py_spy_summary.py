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


def test_a_command_with_semicolons_is_one_process_and_imports_sum_per_module(tmp_path):
    """multiprocessing's spawned child runs `python -c "from multiprocessing.spawn import spawn_main; spawn_main(..)"`:
    the `;` inside its quoted command does not split the frame; it is `mp-spawn` until it names itself. A module's
    import counts every sample under its `<module>` frame (a package's holds its submodules'), once a sample."""
    child = 'process 20:"/usr/bin/python3 -B -c from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=9)"'
    path = tmp_path / "startup.txt"
    path.write_text("\n".join([
        f"{DRIVER};{child};<module> (<string>:1);<module> (vllm/__init__.py:3);<module> (torch/__init__.py:9) 150",
        f"{DRIVER};{child};<module> (<string>:1);<module> (vllm/__init__.py:4);<module> (vllm/config/__init__.py:1) 50",
        f"{DRIVER};{child};<module> (<string>:1);<module> (vllm/__init__.py:3);<module> (vllm/__init__.py:7) 20",
        f"{DRIVER};<module> (bench/rlkit_grpo.py:30);<module> (torch/__init__.py:9) 100",
    ]))
    profile = read(path)
    assert dict(profile.processes) == {"rlkit_grpo.py": 100, "mp-spawn": 220}
    assert dict(profile.imports["mp-spawn"]) == {"vllm/__init__.py": 220, "torch/__init__.py": 150,
                                                "vllm/config/__init__.py": 50}
    report = summary(profile, None, top=5, rate=100, keep="spawn", imports=True)
    imports = report.split("== mp-spawn: imports, inclusive")[1].splitlines()
    assert [line.split("|")[0].strip() for line in imports[3:6]] == [
        "vllm/__init__.py", "torch/__init__.py", "vllm/config/__init__.py"]
    assert imports[3].split("|")[1].strip() == "2.20"
