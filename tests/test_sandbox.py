"""The Python sandbox stops what a model's program must not do, and code rewards score those programs 0."""

from __future__ import annotations

import os
import signal

import pytest

from rlkit.core.sandbox.isolation import ISOLATION_ENV
from rlkit.core.sandbox.process import Limits, run_python
from rlkit.core.data.humaneval import problems
from rlkit.core.rewards import code
from rlkit.core.rewards.code import humaneval_reward, program_for, run_tests

FAST = Limits(wall_s=2.0, cpu_s=1, memory_mb=512)


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    monkeypatch.delenv(ISOLATION_ENV, raising=False)  # the default: namespaces


def test_a_normal_program_runs_in_its_own_folder():
    code = "import os\nopen('note.txt', 'w').write('hi')\nprint(open('note.txt').read(), os.getcwd())"
    result = run_python(code, FAST)
    assert result.ok and result.stdout == "hi /sandbox\n"


def test_files_are_placed_next_to_the_program_and_importable():
    result = run_python("import helper\nprint(helper.X, open('data.txt').read())", FAST,
                        files={"helper.py": "X = 42", "data.txt": "rows"})
    assert result.ok and result.stdout == "42 rows\n"


@pytest.mark.parametrize("code, ending", [
    ("while True:\n    pass", ("killed: wall-clock limit", "killed: CPU-time limit")),
    ("import time\ntime.sleep(60)", ("killed: wall-clock limit",)),
])
def test_a_program_that_never_ends_is_killed(code, ending):
    result = run_python(code, FAST)
    assert not result.ok and result.describe() in ending and result.seconds < 10


@pytest.mark.parametrize("code, error", [
    ("x = bytearray(10 * 1024 ** 3)", "MemoryError"),
    ("import socket\nsocket.create_connection(('93.184.216.34', 80), timeout=2)",
     "OSError: [Errno 101] Network is unreachable"),
    ("import socket\nsocket.getaddrinfo('example.com', 80)",
     "socket.gaierror: [Errno -3] Temporary failure in name resolution"),
    ("open('/tmp/rlkit-sandbox-escape.txt', 'w')",
     "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/rlkit-sandbox-escape.txt'"),
    ("import os\nos.remove('/etc/hostname')", "PermissionError: [Errno 13] Permission denied: '/etc/hostname'"),
])
def test_memory_network_and_outside_writes_fail(code, error):
    result = run_python(code, FAST)
    assert result.exit_code == 1 and result.stderr.strip().splitlines()[-1] == error, result.stderr


def test_it_may_start_processes_inside_the_sandbox():
    result = run_python("import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)", FAST)
    assert result.ok and result.stdout == "b'hi\\n'\n"


def test_nice_lowers_the_programs_priority_and_it_cannot_raise_it_again():
    ours = os.nice(0)
    code = "import os\nprint(os.nice(0))\ntry:\n    os.nice(-1)\nexcept PermissionError:\n    print('refused')"
    assert run_python(code, Limits(wall_s=2.0, cpu_s=1, memory_mb=512, nice=10)).stdout.split() == [
        str(ours + 10), "refused"]
    assert run_python("import os\nprint(os.nice(0))", FAST).stdout.split() == [str(ours)]


def test_a_signal_death_is_reported_as_the_signal():
    assert run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", FAST).exit_code == -signal.SIGTERM


def test_output_is_bounded():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", Limits(wall_s=5, output_bytes=1 << 16))
    assert not result.ok and len(result.stdout) == 1 << 16


# -- code rewards -------------------------------------------------------------------
HE = {p["task_id"]: p for p in problems()}


def _result(task: str, response: str) -> dict:
    problem = HE[task]
    extra_info = {"prompt": problem["prompt"], "entry_point": problem["entry_point"]}
    return humaneval_reward(response, problem["test"], extra_info)


def _score(task: str, response: str) -> float:
    return _result(task, response)["score"]


@pytest.mark.parametrize("task", ["HumanEval/0", "HumanEval/32", "HumanEval/38", "HumanEval/53", "HumanEval/151"])
def test_canonical_solutions_score_one(task):
    """Includes tests that are loops (32, 38), that set up state first (151), and that use the prompt's helpers."""
    assert _score(task, HE[task]["canonical_solution"]) == 1.0


def test_the_score_is_the_share_of_tests_passed():
    # HumanEval/0's 7 asserts expect True, False, True, False, True, True, False.
    assert _score("HumanEval/0", "    return True\n") == pytest.approx(4 / 7)
    assert _score("HumanEval/0", "") == 0.0 and _score("HumanEval/0", "   \n") == 0.0
    whole = "Here it is:\n```python\ndef has_close_elements(numbers, threshold):\n    return False\n```\nDone."
    assert _score("HumanEval/0", whole) == pytest.approx(3 / 7)
    assert _score("HumanEval/0", "    return undefined_name\n") == 0.0
    assert _score("HumanEval/0", "    syntax error here\n") == 0.0


@pytest.mark.parametrize("body", [
    "    while True:\n        pass\n",
    "    x = bytearray(10 * 1024 ** 3)\n    return True\n",
    "    import socket\n    socket.create_connection(('93.184.216.34', 80))\n    return True\n",
])
def test_a_solution_that_hangs_allocates_or_connects_scores_zero(body):
    problem = HE["HumanEval/0"]
    program = program_for(body, problem["prompt"], problem["entry_point"])
    assert run_tests(program, problem["prompt"], problem["test"], problem["entry_point"], FAST)["score"] == 0.0


REASONS = [  # HumanEval/0: 7 tests; the first expects True, the second False
    ("    while True:\n        pass\n", "timeout: test 1: no answer within 0.5 s (7 of 7 tests failed)"),
    ("    while True:\n        print('x' * 65536)\n",  # 1 MiB of output: the write over the file-size limit fails
     "output limit: test 1: the program raised OSError: [Errno 27] File too large (7 of 7 tests failed)"),
    ("    print('x' * 10**9)\n", "memory limit: test 1: the program raised MemoryError (7 of 7 tests failed)"),
    ("    return 1 / 0\n",
     "exception: test 1: the program raised ZeroDivisionError: division by zero (7 of 7 tests failed)"),
    ("    return True\n", "test failed: test 2: AssertionError (assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) "
                         "== False) (3 of 7 tests failed)"),
    ("    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
     "signal: test 1: the program ended: killed by signal SIGSEGV (7 of 7 tests failed)"),
    ("    syntax error here\n",
     "does not run: loading the program: SyntaxError: invalid syntax (solution.py, line 12)"),
    ("def has_close_elements(numbers, threshold):\n    return True\nwhile True:\n    pass\n",
     "timeout: loading the program: no answer within 0.5 s"),
    ("", "empty response: no code to run"),
    (HE["HumanEval/0"]["canonical_solution"], None),
]


@pytest.mark.parametrize(("response", "reason"), REASONS)
def test_each_failure_says_why(response, reason, monkeypatch):
    monkeypatch.setattr(code, "PER_TEST_S", 0.5)
    problem = HE["HumanEval/0"]
    program = program_for(response, problem["prompt"], problem["entry_point"])
    # The row's 4 s hold the judge's start too: with 1.5 s, on the 2-core machine under a full suite, the judge did not
    # answer in time beside a program spinning at load (2026-12-06), and the row failed as "the tests do not run".
    # The CPU limit (3 s) stays well above the per-test 0.5 s: on a loaded machine a program spinning at load once
    # spent 1 s of CPU before its judge, descheduled, saw the 0.5 s pass ("cpu limit" instead of "timeout", 2026-12-06).
    limits = Limits(wall_s=4.0, cpu_s=3, memory_mb=512)
    result = run_tests(program, problem["prompt"], problem["test"], problem["entry_point"], limits) if program else (
        _result("HumanEval/0", response))
    assert result.get("reason") == reason


def test_the_candidate_runs_ten_nice_values_below_the_judge():
    """So a candidate spinning while it loads cannot starve the judge's start (rewards/code.py CANDIDATE_NICE)."""
    tests = f"def check(candidate):\n    assert candidate() == {os.nice(0) + 10}\n"
    result = run_tests("import os\ndef niceness():\n    return os.nice(0)\n", "", tests, "niceness", FAST)
    assert result["score"] == 1.0, result


@pytest.mark.slow
def test_every_canonical_humaneval_solution_scores_one():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        scores = dict(zip(HE, pool.map(lambda task: _score(task, HE[task]["canonical_solution"]), HE)))
    assert len(scores) == 164 and {task: s for task, s in scores.items() if s != 1.0} == {}
