"""Run untrusted Python (a model's code) behind an operating-system boundary, with limits.

The boundary (isolation "namespaces", the default; rlkit.core.sandbox.isolation builds it): each
program runs under bubblewrap in new pid, network, ipc, uts, mount (and cgroup) namespaces, as an
unprivileged uid with no capabilities and no_new_privs, under a seccomp filter that refuses new
user namespaces (and foreign syscall ABIs), in its own session (no TIOCSTI), and dies with its
caller. Its filesystem is a fresh root holding only read-only /usr (with /bin, /lib links), the
dynamic linker's cache and the base interpreter's folder (sys.base_prefix; run with -I -S -B, so
no site-packages), a /proc of its own pid namespace, a minimal /dev, and its working folder
/sandbox: a private tmpfs of `disk_mb` into which the program and `files` are copied. So it
cannot read $HOME, /work, the runs directory, /tmp/ray or another process's /proc entries, cannot
write anything on the host's disk, signal any process outside its namespace (nor kill
bubblewrap's init inside it: the kernel ignores that from within), reach any network (loopback
only) or a host unix socket. Its environment is PATH, HOME, TMPDIR and LANG only.

Limits, per process (rlimits set before the program runs; it cannot raise them): CPU seconds,
address space, file size (stderr and each file), open files, no core dumps, no raising its CPU priority, and
optionally a lower one (`nice`); for the whole tree:
`processes` (RLIMIT_NPROC: threads count too; its uid is its own, see isolation), the tmpfs's
size, and the wall clock: at `wall_s` the namespace's init is killed (and when the program's first
process ends the init exits); then the kernel kills every process in it, setsid or double-forked.
Memory of the whole tree is bounded only by processes x memory_mb + disk_mb: no cgroup is used
(not built yet: a cgroup v2 memory/pids/cpu group per sandbox would bound the tree; docs/security.md).

Isolation "weak" (rollout.agent.sandbox.isolation=weak, for machines without bubblewrap or user
namespaces) is only a child process in a temporary folder with the same rlimits (no process count)
and its process group killed at the wall clock: no boundary at all. Where the default cannot be
built, starting a sandbox raises SandboxUnavailable instead of falling back.

stdout is a pipe to the caller; stderr a memory file of at most `output_bytes`, of which only the
head is read.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlkit.core.sandbox.isolation import (
    bwrap_command,
    interpreter,
    isolation_mode,
    memory_file,
    require_isolation,
    seccomp_program,
)

# The interpreter's first code: the limits (hard too, so they stay), then the program as __main__.
_BOOTSTRAP = r"""
import os, resource, sys, types
*limits, program = sys.argv[1:]
for limit in limits:
    name, value = limit.split("=")
    if name == "nice":
        os.nice(int(value))
    else:
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))
main = types.ModuleType("__main__")
main.__file__ = program
sys.modules["__main__"] = main
sys.argv = [program]
sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
with open(program) as f:
    source = f.read()
exec(compile(source, program, "exec"), main.__dict__)
"""
_OPEN_FILES = 256
_KILL_GRACE_S = 5.0  # how long the namespace's teardown may take before its monitor is killed too


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 5  # CPU seconds, per process
    memory_mb: int = 1024  # address space, per process
    output_bytes: int = 1 << 20  # the most stdout (or stderr) a program may write; also any one file's size
    processes: int = 16  # processes and threads of the whole tree at once (isolation=namespaces)
    disk_mb: int = 64  # the working folder's size (isolation=namespaces)
    # added to the caller's nice value: a program that spins then yields most of a contended core to the caller's
    # other processes (a reward's judge, the trainer; ~9:1 at 10); RLIMIT_NICE 0 keeps it from lowering it again
    nice: int = 0

    def settings(self, isolated: bool) -> list[str]:
        """What the bootstrap sets before the program runs: its rlimits, then its nice value."""
        limits = {
            "RLIMIT_CPU": self.cpu_s,
            "RLIMIT_AS": self.memory_mb << 20,
            "RLIMIT_FSIZE": self.output_bytes,
            "RLIMIT_NOFILE": _OPEN_FILES,
            "RLIMIT_CORE": 0,
            "RLIMIT_NICE": 0,
        }
        if isolated:  # outside the sandbox's own uid the count would be every process of the caller's user
            limits["RLIMIT_NPROC"] = self.processes
        return [f"{name}={value}" for name, value in limits.items()] + ([f"nice={self.nice}"] if self.nice else [])


@dataclass
class Result:
    exit_code: int | None  # None when the wall clock killed it; -N when signal N ended it
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def describe(self) -> str:
        """Why it ended, in words (for a tool's answer or a log line)."""
        if self.timed_out:
            return "killed: wall-clock limit"
        if self.exit_code == -signal.SIGXCPU or self.exit_code == -signal.SIGKILL:
            return "killed: CPU-time limit"
        if self.exit_code == -signal.SIGXFSZ:
            return "killed: output size limit"
        if self.exit_code is not None and self.exit_code < 0:
            return f"killed by signal {_signal_name(-self.exit_code)}"
        return f"exit code {self.exit_code}"

    @property
    def kind(self) -> str:
        """describe()'s cause as one word or two: timeout, cpu limit, output limit, signal or exit."""
        if self.timed_out:
            return "timeout"
        return {-signal.SIGXCPU: "cpu limit", -signal.SIGKILL: "cpu limit", -signal.SIGXFSZ: "output limit"}.get(
            self.exit_code or 0, "signal" if (self.exit_code or 0) < 0 else "exit"
        )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class SandboxedProcess:
    """A sandboxed program that is still running: its stdin and stdout are pipes to the caller.

    The program's stderr goes to a memory file of at most `output_bytes`. `kill()` ends the whole
    process tree; `finish()` waits (up to the wall-clock limit from the start) and returns
    the Result. Use it as a context manager: leaving the block kills what is left and frees the
    program's folder.
    """

    def __init__(self, code: str, limits: Limits, files: dict[str, str] | None) -> None:
        self.limits = limits
        self.isolated = isolation_mode() == "namespaces"
        if self.isolated:
            require_isolation()
        sources = {"program.py": code, **(files or {})}
        python = [interpreter()[0], "-I", "-S", "-B", "-c", _BOOTSTRAP, *limits.settings(self.isolated), "program.py"]
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        descriptors: list[int] = []
        if self.isolated:
            descriptors = [memory_file(text.encode()) for text in sources.values()]
            seccomp = memory_file(seccomp_program())
            command = bwrap_command(limits.disk_mb << 20, list(zip(descriptors, sources)), seccomp, python)
            descriptors.append(seccomp)
            cwd, env = None, {}
        else:
            self._directory = tempfile.TemporaryDirectory(prefix="rlkit-sandbox-")
            cwd = self._directory.name
            for name, text in sources.items():
                (Path(cwd) / name).write_text(text)
            command, env = python, {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
        self._stderr = os.memfd_create("rlkit-sandbox-stderr")
        self._start = time.perf_counter()
        try:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                pass_fds=descriptors,
                start_new_session=True,
            )
        finally:
            for descriptor in descriptors:  # bwrap has its own copies
                os.close(descriptor)
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.timed_out = False

    def remaining_s(self) -> float:
        """Seconds left of the wall-clock limit."""
        return max(0.0, self.limits.wall_s - (time.perf_counter() - self._start))

    def kill(self) -> None:
        """End the program and everything it started; when it returns, no process of it is left."""
        if self.process.poll() is None and self.isolated:
            _kill_namespace_init(self.process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_KILL_GRACE_S)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def finish(self, stdout: str = "") -> Result:
        """Wait for the end (killing it at the wall-clock limit); `stdout` is what the caller read of it."""
        try:
            exit_code = self.process.wait(timeout=self.remaining_s())
        except subprocess.TimeoutExpired:
            self.kill()
            exit_code, self.timed_out = None, True
        if self.isolated and exit_code is not None and exit_code > 128:  # bwrap reports signal N as 128 + N
            exit_code = 128 - exit_code
        seconds = time.perf_counter() - self._start
        return Result(exit_code, stdout, _head(self._stderr, self.limits.output_bytes), self.timed_out, seconds)

    def close(self) -> None:
        self.kill()
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(OSError):
            os.close(self._stderr)
        if self._directory is not None:
            self._directory.cleanup()

    def __enter__(self) -> SandboxedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_python(code: str, limits: Limits = Limits(), files: dict[str, str] | None = None) -> SandboxedProcess:
    """Start `code` as a script in a fresh folder (with `files` next to it); talk to it over its stdin/stdout.

    Raises SandboxUnavailable when isolation is asked for and this machine cannot provide it."""
    return SandboxedProcess(code, limits, files)


def run_python(code: str, limits: Limits = Limits(), files: dict[str, str] | None = None) -> Result:
    """Run `code` as a script in a fresh folder (with `files` written next to it) and wait for its end."""
    with start_python(code, limits, files) as program:
        program.stdin.close()
        stdout = _read_head(program, limits.output_bytes)
        return program.finish(stdout)


def _read_head(program: SandboxedProcess, limit: int) -> str:
    """At most `limit` bytes of the program's stdout, read until it closes it or the wall clock runs out."""
    chunks, size = [], 0
    descriptor = program.stdout.fileno()
    while size < limit:
        ready, _, _ = select.select([descriptor], [], [], program.remaining_s())
        if not ready:
            break
        chunk = os.read(descriptor, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _head(descriptor: int, limit: int) -> str:
    return os.pread(descriptor, limit, 0).decode("utf-8", errors="replace")


def _kill_namespace_init(monitor: int) -> None:
    """SIGKILL bwrap's init in the program's pid namespace (the monitor's only child): the kernel then
    kills every process in the namespace, and the monitor exits only once they are all gone."""
    children = Path(f"/proc/{monitor}/task/{monitor}/children")
    with contextlib.suppress(OSError):
        for pid in map(int, children.read_text().split()):
            descriptor = os.pidfd_open(pid)
            try:
                if str(pid) in children.read_text().split():  # still the monitor's child: not a reused pid
                    signal.pidfd_send_signal(descriptor, signal.SIGKILL)
            finally:
                os.close(descriptor)
