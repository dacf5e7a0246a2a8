"""One Ray head for the slow tests marked `shared_ray`: their runs attach to it through RAY_ADDRESS
(rlkit's cluster path, as on a user's cluster) instead of each starting a local cluster, which costs
~4 s a run on 2 cores. Tests of what a run does to the local cluster it starts itself (Ctrl-C to the
process group, a killed process tree, the demo a user runs first) leave the mark off.

Between tests the head must be idle: a run's actors die with its driver (also a SIGKILLed one, in
well under a second), so an actor still alive after a test is a leak; it is killed and the test fails.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Enough for the largest shared test (2 CPU workers) with room to spare; every run reserves its own.
HEAD_CPUS = 4
START_TIMEOUT_S = 120
IDLE_TIMEOUT_S = 30
# Ray's own processes under a node, and its pooled workers that run nothing (process titles).
RAY_SERVICES = {"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name ([0] the state, [19] the start time); [] once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def is_zombie(pid: int) -> bool:
    return _stat(pid)[:1] == ["Z"]


def _kill(pid: int, started: str | None = None) -> None:
    """SIGKILL `pid`, unless it exited already or (with `started`) its number now names a newer process."""
    fields = _stat(pid)
    if fields and fields[0] != "Z" and (started is None or fields[19] == started):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_started: list[RayHead] = []  # this session's head, once started


def wait_until_idle() -> None:
    """For a test attached to the shared head that kills a run: return once that run's actors are gone
    too (killing the process tree of a run with its own local cluster takes the cluster with it)."""
    for head in _started:
        if os.environ.get("RAY_ADDRESS") == head.env["RAY_ADDRESS"]:
            head.wait_idle()


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
    except OSError:
        return ""


def _die_with_parent() -> None:
    """In the head's `ray start` process: SIGTERM when pytest ends, however it ends (Linux)."""
    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def use_session_token() -> None:
    """Token authentication (Ray's default for a new local cluster) with a token of this test session,
    for the head and every cluster a test starts. Call before Ray is imported: a process reads these
    settings once, and pytest's own process attaches to the head too (tests that run a controller)."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))


class RayHead:
    """`ray start --head --block` in a temporary directory, stopped (and its directory removed) by `stop`.
    Its authentication settings are the environment's (`use_session_token`)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rlkit-ray-"))  # short: Ray's socket paths have a length limit
        # The workers are the head's children: they get its environment (this repo's code first),
        # plus each run's runtime_env (rlkit's worker env, RLKIT_*/VLLM_* of the run's caller).
        # It listens on 127.0.0.1 only: Ray keeps that address (not the machine's outward one) when it takes
        # the machine for a cluster of one; the runs attaching to it do so too (rlkit.core.cluster.ray_access).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "HF_HUB_OFFLINE": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        env.pop("RAY_ADDRESS", None)
        self.log = self.dir / "head.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port=0",
             "--node-ip-address=127.0.0.1", f"--num-cpus={HEAD_CPUS}", "--include-dashboard=false",
             "--dashboard-agent-listen-port=0", "--disable-usage-stats", f"--temp-dir={self.dir}"],
            env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            self.env = {"RAY_ADDRESS": self._wait_for_address()}
        except BaseException:
            self.stop()
            raise
        _started.append(self)

    def _wait_for_address(self) -> str:
        """The head's GCS address, which `ray start` writes once the node is up."""
        written = self.dir / "ray_current_cluster"
        deadline = time.monotonic() + START_TIMEOUT_S
        while ":" not in (address := written.read_text().strip() if written.exists() else ""):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the tests' Ray head did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        return address

    def check_alive(self) -> None:
        """Fail at once if the head is gone (something killed pytest's child processes): a run attaching
        to a dead head would wait for it until its timeout, and every later shared test with it."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"the tests' Ray head exited (code {self.proc.returncode}) before this test; "
                               f"its log ends:\n{self.log.read_text()[-2000:]}")

    def busy_workers(self) -> dict[int, str]:
        """Worker processes of the head that run an actor or a task (by Ray's process titles)."""
        titles = {pid: _title(pid) for pid in descendants(self.proc.pid) if not is_zombie(pid)}
        return {pid: title for pid, title in titles.items()
                if title.startswith("ray::") and title.split(".")[0] not in RAY_SERVICES}

    def wait_idle(self, timeout: float = IDLE_TIMEOUT_S) -> None:
        """Every actor of the runs so far has exited; one that outlives `timeout` is killed, then reported."""
        deadline = time.monotonic() + timeout
        while (busy := self.busy_workers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in busy:  # still the head's descendants: their numbers are not reused
            _kill(pid)
        assert not busy, f"Ray workers outlived their runs by {timeout:g} s: {busy}"

    def stop(self) -> None:
        """SIGTERM to `ray start --block` stops the node's processes; what is left is SIGKILLed."""
        tree = {pid: fields[19] for pid in descendants(self.proc.pid) if (fields := _stat(pid))}
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid, started in tree.items():
            _kill(pid, started)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in _started:
            _started.remove(self)
