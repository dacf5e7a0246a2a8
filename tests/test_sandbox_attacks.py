"""The sandbox half of the reward-hacking suite: programs written to escape the Python sandbox, each
blocked or contained (rlkit.core.sandbox.process, isolation=namespaces)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from ast import literal_eval
from pathlib import Path

import pytest

from rlkit.core.sandbox.isolation import ISOLATION_ENV, isolation_problem
from rlkit.core.sandbox.process import Limits, run_python

pytestmark = pytest.mark.skipif(isolation_problem() is not None, reason=f"no isolation here: {isolation_problem()}")

LIMITS = Limits(wall_s=3.0, cpu_s=3, memory_mb=256, processes=8, disk_mb=8)
SECRET = "rlkit-secret-" + secrets.token_hex(8)
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    monkeypatch.delenv(ISOLATION_ENV, raising=False)  # the default: namespaces
    monkeypatch.setenv("RLKIT_TEST_SECRET", SECRET)  # a host environment variable the program must not see


@pytest.fixture
def host(tmp_path):
    """A host folder (a runs directory with a secret in it), and a sentinel process to be left alone."""
    (tmp_path / "runs" / "run-1").mkdir(parents=True)
    (tmp_path / "runs" / "run-1" / "token.txt").write_text(SECRET)
    sentinel = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield {"dir": str(tmp_path), "runs": str(tmp_path / "runs"), "sentinel": sentinel.pid, "me": os.getpid()}
    assert sentinel.poll() is None, "the sentinel host process was killed"
    sentinel.kill()
    sentinel.wait()


def _run(code: str, host: dict, limits: Limits = LIMITS):
    return run_python(code.format(**host), limits)


def _nothing_written(host: dict) -> None:
    assert sorted(os.listdir(host["dir"])) == ["runs"]


# -- writes outside its folder: the host's disk is not mounted, so each lands nowhere -----------
@pytest.mark.parametrize("code", [
    "open('{dir}/pwned', 'w').write('x')",
    ("import os\nfolder = os.open('{dir}', os.O_RDONLY)\n"
     "os.write(os.open('pwned', os.O_WRONLY | os.O_CREAT, dir_fd=folder), b'x')"),
    "import os\nopen('a', 'w').write('x')\nos.link('a', '{dir}/pwned')",
    "import os\nopen('a', 'w').write('x')\nos.rename('a', '{dir}/pwned')",
    "import os\nos.symlink('{dir}', 'link')\nopen('link/pwned', 'w').write('x')",
    "open('/proc/1/root{dir}/pwned', 'w').write('x')",
    LIBC + ("fd = libc.open(b'{dir}/pwned', os.O_WRONLY | os.O_CREAT, 0o644)\nassert fd >= 0, ctypes.get_errno()\n"
            "libc.write(fd, b'x', 1)"),
    # the old audit hook read its settings from __main__; there is no hook to switch off now
    "import __main__\n__main__.DENIED, __main__.home = (), '/'\nopen('{dir}/pwned', 'w').write('x')",
], ids=["open", "dir_fd", "link", "rename", "symlink", "proc-root", "ctypes-open", "audit-hook-off"])
def test_writes_outside_its_folder_reach_nothing_on_the_host(code, host):
    result = _run(code, host)
    last_line = result.stderr.strip().splitlines()[-1]
    assert result.exit_code == 1 and last_line.startswith(("FileNotFoundError", "PermissionError", "AssertionError: 2"))
    _nothing_written(host)


# -- reads of the host ---------------------------------------------------------------------
def test_it_sees_a_filesystem_of_its_own():
    code = "import os\nprint(sorted(os.listdir('/')))\nprint(os.getcwd())\nprint(sorted(os.listdir('/dev')))"
    result = run_python(code, LIMITS)
    top, cwd, dev = result.stdout.splitlines()
    assert result.ok and cwd == "/sandbox"
    assert set(literal_eval(top)) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "proc", "root", "sandbox", "sbin",
                                      "usr"}
    assert set(literal_eval(dev)) <= {"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm",
                                      "stderr", "stdin", "stdout", "tty", "urandom", "zero"}


@pytest.mark.parametrize("code", [
    "print(open('{runs}/run-1/token.txt').read())",
    "import os\nprint(os.listdir('/tmp/ray'))",
    "import os\nprint(os.listdir('/work'))",
    "print(open('/proc/{me}/environ').read())",  # the caller's pid, as the host numbers it
    "print(open('/proc/1/environ').read())",  # bubblewrap's init: root's, not readable by the sandbox's uid
], ids=["runs-dir", "tmp-ray", "work", "parent-environ", "init-environ"])
def test_host_files_and_other_processes_cannot_be_read(code, host):
    result = _run(code, host)
    assert result.exit_code == 1 and SECRET not in result.stdout
    assert "FileNotFoundError" in result.stderr or "PermissionError" in result.stderr


def test_home_shows_only_the_folders_on_the_way_to_the_interpreter():
    home = os.path.expanduser("~")
    result = run_python(f"import os\nprint(sorted(os.listdir({home!r})) if os.path.isdir({home!r}) else [])", LIMITS)
    on_the_way = {Path(p).name for p in Path(sys.base_prefix).parents} | {Path(sys.base_prefix).name}
    assert result.ok and set(literal_eval(result.stdout)) <= on_the_way


def test_its_environment_holds_no_host_variable():
    result = run_python("import os\nprint(sorted(os.environ))", LIMITS)
    assert result.ok and literal_eval(result.stdout) == ["HOME", "LANG", "PATH", "PWD", "TMPDIR"]


# -- signals to the caller and other processes -------------------------------------------------
@pytest.mark.parametrize("code", [
    ("import os\nfor pid in (os.getppid(), {me}, {sentinel}, 1):\n    try:\n        os.kill(pid, 9)\n"
     "    except OSError as e:\n        print(type(e).__name__)"),
    ("import os, signal\nfor group in ({sentinel}, {me}, 0):\n    try:\n        os.killpg(group, 9)\n"
     "    except OSError as e:\n        print(type(e).__name__)\nos.kill(-1, 9)"),
    "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({sentinel}), 9)",
    LIBC + "print(libc.kill({sentinel}, 9), libc.kill({me}, 9), libc.kill(-1, 9))",
], ids=["kill", "killpg", "pidfd", "ctypes-kill"])
def test_signals_reach_no_host_process(code, host):
    _run(code, host)  # the fixture asserts the sentinel survived; this test's own process is alive to see it


# -- nothing outlives the program -------------------------------------------------------------
def _alive(token: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if token.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("main_waits", [False, True], ids=["main-exits", "main-times-out"])
def test_setsid_and_double_forked_children_die_with_it(main_waits):
    token = "rlkit-attack-" + secrets.token_hex(6)
    code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 30; :', {token!r}])\n    os._exit(0)\n"
            f"time.sleep(0.3)\nprint('forked', flush=True)\n" + ("time.sleep(30)\n" if main_waits else ""))
    result = run_python(code, Limits(wall_s=1.5))
    assert result.stdout == "forked\n" and result.timed_out is main_waits
    assert _alive(token) == []


def test_busy_children_all_die_at_the_wall_clock_limit():
    token = "rlkit-attack-" + secrets.token_hex(6)
    code = (f"import os\nfor _ in range(3):\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sh', ['sh', '-c', 'while :; do :; done', {token!r}])\nwhile True:\n    pass\n")
    start = time.perf_counter()
    result = run_python(code, Limits(wall_s=1.5, cpu_s=30, processes=8))
    assert result.timed_out and time.perf_counter() - start < 4
    assert _alive(token) == []


# -- network -------------------------------------------------------------------------------
def test_no_connection_reaches_a_host_listener(tmp_path):
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "host.sock"))
    unix.listen()
    port = tcp.getsockname()[1]
    code = (f"import socket\nfor address in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n    try:\n"
            f"        socket.create_connection(address, timeout=1).sendall(b'hi')\n    except OSError as e:\n"
            f"        print(type(e).__name__)\ns = socket.socket(socket.AF_UNIX)\n"
            f"s.connect({str(tmp_path / 'host.sock')!r})")
    result = run_python(code, LIMITS)
    assert result.stdout == "ConnectionRefusedError\nOSError\n" and "FileNotFoundError" in result.stderr
    for listener in (tcp, unix):
        listener.settimeout(0.1)
        with pytest.raises(TimeoutError):
            listener.accept()
        listener.close()


# -- resources across processes ----------------------------------------------------------------
def test_a_fork_bomb_of_allocating_children_is_bounded():
    code = ("import os, time\nforked = 0\ntry:\n    for _ in range(100):\n        if os.fork() == 0:\n"
            "            block = bytearray(32 << 20)\n            time.sleep(2)\n            os._exit(0)\n"
            "        forked += 1\nexcept BlockingIOError:\n    pass\nprint(forked)")
    result = run_python(code, Limits(wall_s=3.0, memory_mb=128, processes=8))
    assert result.ok and 0 < int(result.stdout) < 8  # 8 processes of its uid, itself included


def test_memory_is_bounded_per_process():
    result = run_python("x = bytearray(10 * 1024 ** 3)", LIMITS)
    assert result.exit_code == 1 and "MemoryError" in result.stderr


def test_filling_its_folder_stops_at_disk_mb(tmp_path):
    code = ("import os\nwritten = 0\ntry:\n    for i in range(1000):\n        with open(f'f{i}', 'wb') as f:\n"
            "            f.write(b'x' * (512 << 10))\n        written += 512 << 10\nexcept OSError as e:\n"
            "    print(e.strerror, written >> 20)")
    result = run_python(code, LIMITS)
    reason, mib = result.stdout.rsplit(" ", 1)
    assert result.ok and reason == "No space left on device" and 0 < int(mib) <= LIMITS.disk_mb


# -- no root -------------------------------------------------------------------------------
def test_it_is_not_root_and_cannot_become_root():
    code = ("import os\nprint(os.getuid() != 0, os.geteuid() != 0)\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "for call in (lambda: os.setuid(0), lambda: os.chroot('/'), lambda: os.setgroups([0])):\n"
            "    try:\n        call()\n    except PermissionError:\n        print('refused')")
    result = run_python(code, LIMITS)
    assert result.stdout == "True True\n0000000000000000\nrefused\nrefused\nrefused\n"


def test_it_cannot_make_a_user_namespace_to_gain_capabilities_in():
    code = (LIBC + "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
            "import threading\nthreading.Thread(target=print, args=('threads still start',)).start()")
    result = run_python(code, LIMITS)
    assert result.stdout == "-1 1\nthreads still start\n"  # EPERM
