"""Run untrusted Python (a model's code) in a child process with limits.

Each program gets a fresh temporary directory (its cwd and HOME, removed afterwards) and:
- CPU time (RLIMIT_CPU), address space (RLIMIT_AS) and file size (RLIMIT_FSIZE) limits,
  set by the child on itself before the program runs;
- a wall-clock limit: past it the whole process group is killed;
- no network: a network namespace of its own (`unshare -rn`) where the host allows one, and
  always an audit hook that refuses sockets, new processes, signals to other processes, and
  writes or deletions outside its directory;
- stdout and stderr in files of at most RLIMIT_FSIZE bytes, of which only the head is read.

This stops a program that loops, allocates without bound, floods its output, or opens a
connection by mistake. It is not a boundary against code that sets out to escape (ctypes,
reading files outside its directory); run rollouts on machines you can afford to lose.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# The child's first code: limits, then the audit hook (it cannot be removed), then the program.
_BOOTSTRAP = r"""
import os, resource, sys
cpu_s, memory, file_bytes, home, program = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
home = os.path.realpath(home)
DENIED = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn")
PATHS = {"os.remove": 0, "os.rename": 0, "os.rmdir": 0, "os.mkdir": 0, "shutil.rmtree": 0, "os.chmod": 0,
         "os.chown": 0, "os.truncate": 0, "os.symlink": 1, "os.link": 1, "os.utime": 0}
def inside(path):
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(home + os.sep)
    except (TypeError, ValueError):
        return isinstance(path, int)  # a file descriptor it already holds
def writes(mode, flags):
    if mode is not None:
        return any(c in str(mode) for c in "wax+")
    return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
def hook(event, args):
    if event.startswith("socket.") or event.startswith(DENIED):
        raise PermissionError(f"{event}: not allowed in the rlkit sandbox (no network, no new processes)")
    if event == "open" and writes(args[1], args[2]) and not inside(args[0]):
        raise PermissionError(f"writing {args[0]!r}: the rlkit sandbox writes only inside its directory")
    if event in PATHS and not inside(args[PATHS[event]]):
        raise PermissionError(f"{event} {args[PATHS[event]]!r}: outside the rlkit sandbox's directory")
sys.addaudithook(hook)
sys.argv = [program]
sys.path.insert(0, home)
with open(program) as f:
    source = f.read()
exec(compile(source, program, "exec"), {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__})
"""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 1024
    output_bytes: int = 1 << 20  # the most stdout (or stderr) a program may write


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
        return f"exit code {self.exit_code}"


class SandboxedProcess:
    """A sandboxed program that is still running: its stdin and stdout are pipes to the caller.

    The program's stderr goes to a file of at most `output_bytes`. `kill()` ends the whole
    process tree; `finish()` waits (up to the wall-clock limit from the start) and returns
    the Result. Use it as a context manager: leaving the block kills what is left and removes
    the program's directory.
    """

    def __init__(self, code: str, limits: Limits, files: dict[str, str] | None) -> None:
        self.limits = limits
        self._directory = tempfile.TemporaryDirectory(prefix="rlkit-sandbox-")
        home = self._directory.name
        program = Path(home) / "program.py"
        program.write_text(code)
        for name, text in (files or {}).items():
            (Path(home) / name).write_text(text)
        command = [*_network_isolation(), sys.executable, "-I", "-B", "-c", _BOOTSTRAP, str(limits.cpu_s),
                   str(limits.memory_mb << 20), str(limits.output_bytes), home, str(program)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        self._stderr = open(Path(home) / ".stderr", "wb+")
        self._start = time.perf_counter()
        self.process = subprocess.Popen(command, cwd=home, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, start_new_session=True)
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.timed_out = False

    def remaining_s(self) -> float:
        """Seconds left of the wall-clock limit."""
        return max(0.0, self.limits.wall_s - (time.perf_counter() - self._start))

    def kill(self) -> None:
        """End the program and everything it started."""
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
        seconds = time.perf_counter() - self._start
        return Result(exit_code, stdout, _head(self._stderr, self.limits.output_bytes), self.timed_out, seconds)

    def close(self) -> None:
        self.kill()
        for stream in (self.stdin, self.stdout, self._stderr):
            with contextlib.suppress(OSError):
                stream.close()
        self._directory.cleanup()

    def __enter__(self) -> SandboxedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_python(code: str, limits: Limits = Limits(), files: dict[str, str] | None = None) -> SandboxedProcess:
    """Start `code` as a script in a fresh directory (with `files` next to it); talk to it over its stdin/stdout."""
    return SandboxedProcess(code, limits, files)


def run_python(code: str, limits: Limits = Limits(), files: dict[str, str] | None = None) -> Result:
    """Run `code` as a script in a fresh directory (with `files` written next to it) and wait for its end."""
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


def _head(file, limit: int) -> str:
    file.seek(0)
    return file.read(limit).decode("utf-8", errors="replace")


@functools.cache
def _network_isolation() -> tuple[str, ...]:
    """`unshare -rn` (a network namespace with only a loopback that is down) where this host allows it."""
    try:
        probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("unshare", "-rn") if probe.returncode == 0 else ()
