"""The Ray clusters of rlkit and of its tests listen on 127.0.0.1 only: every listening TCP socket
of their processes, read from /proc/net/tcp{,6} and the processes' file descriptors."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray_head import REPO, descendants

pytestmark = pytest.mark.slow

# In a fresh process, as the controller does: start the local cluster, run a task (a worker with the
# run's runtime_env), then wait until told to stop.
START = """
import sys, ray
from rlkit.core.cluster.worker_group import init_ray
from rlkit.recipes.loader import load_config
init_ray(load_config("grpo-demo"))
assert ray.get(ray.remote(lambda: 1).remote(), timeout=120) == 1
print("READY", flush=True)
sys.stdin.readline()
ray.shutdown()
"""


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp's address: 4 or 16 bytes, in 32-bit words of the host's byte order (little-endian)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening(pids: set[int]) -> dict[tuple[str, int], set[str]]:
    """(address, port) -> the names of those processes that listen there."""
    sockets = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                address, port = fields[1].split(":")
                sockets[fields[9]] = (str(_address(address)), int(port, 16))
    found: dict[tuple[str, int], set[str]] = {}
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:  # exited meanwhile
            continue
        for link in links:
            inode = link[len("socket:["):-1] if link.startswith("socket:[") else None
            if inode in sockets:
                found.setdefault(sockets[inode], set()).add(name)
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
                              and ip.ipv4_mapped.is_loopback)


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def test_a_local_cluster_rlkit_starts_listens_on_loopback_only_with_a_token_never_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    run = subprocess.Popen([sys.executable, "-c", START], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline().strip() == "READY", run.communicate(timeout=30)[1][-3000:]
        tree = descendants(run.pid) | {run.pid}
        sockets = listening(tree)
        gcs = [pid for pid in tree if Path(f"/proc/{pid}/comm").read_text().strip() == "gcs_server"]
        gcs_env = _environ(gcs[0])
    finally:
        run.communicate("stop\n", timeout=60)
    names = set().union(*sockets.values())
    assert {"gcs_server", "raylet"} <= names, sockets  # the cluster's own servers were seen
    assert [where for where in sockets if not _loopback(where[0])] == [], sockets
    assert b"RAY_AUTH_MODE=token" in gcs_env and any(v.startswith(b"RAY_AUTH_TOKEN=") for v in gcs_env)
    assert not (tmp_path / ".ray" / "auth_token").exists()  # Ray's default would write it there


def test_the_tests_shared_ray_head_listens_on_loopback_only(ray_head):
    ray_head.check_alive()
    sockets = listening(descendants(ray_head.proc.pid) | {ray_head.proc.pid})
    assert {"gcs_server", "raylet"} <= set().union(*sockets.values()), sockets
    assert [where for where in sockets if not _loopback(where[0])] == [], sockets
    assert ray_head.env["RAY_ADDRESS"].startswith("127.0.0.1:")
