"""`rlkit doctor`'s checks of the fabric between workers: NCCL settings and the Ray cluster a run would join."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

from rlkit.core import environment
from rlkit.core.cluster.ray_access import CLUSTER_OF_ONE_ENV, check_cluster, is_loopback, unauthenticated_warning
from rlkit.core.finding import Finding
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

RAY_TIMEOUT_S = 60.0
PORT_TIMEOUT_S = 5.0
# NCCL variables that make collectives slow or fail when set for no reason.
SLOW_NCCL = {
    "NCCL_P2P_DISABLE": "turns off GPU peer-to-peer copies (NVLink, PCIe): collectives go through host memory",
    "NCCL_SHM_DISABLE": "turns off shared-memory transport between processes of one host",
    "NCCL_IB_DISABLE": "turns off InfiniBand: multi-node collectives fall back to TCP sockets",
}


def fabric_states(smi_query: str) -> list[str]:
    """Each GPU's NVLink fabric 'State/Status' from `nvidia-smi -q` ('N/A' without NVSwitch)."""
    states = []
    for block in re.findall(r"^\s*Fabric\s*\n((?:\s{8,}.*\n?)+)", smi_query, flags=re.M):
        fields = dict(re.findall(r"^\s*(State|Status)\s*:\s*(.+?)\s*$", block, flags=re.M))
        states.append(f"{fields.get('State', 'N/A')}/{fields.get('Status', 'N/A')}")
    return states


def nvidia_smi_query() -> str:
    try:
        return subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def check_nccl(config: RLConfig, gpus: list[environment.GPU]) -> list[Finding]:
    if not gpus:
        return [Finding("ok", "NCCL", "no GPU: workers talk over gloo, no NCCL settings needed")]
    if environment.installed_version("ray") is None:
        return []  # reported above; the workers' environment is built with Ray
    from rlkit.core.cluster.worker_env import MULTICAST_OFF_ENV, worker_env

    findings = []
    env = worker_env(config)
    if not config.trainer.nvlink_multicast:
        settings = ", ".join(f"{k}={env[k]}" for k in MULTICAST_OFF_ENV)
        findings.append(
            Finding("ok", "NCCL multicast", f"off (trainer.nvlink_multicast=false): workers get {settings}")
        )
        for key, value in MULTICAST_OFF_ENV.items():
            if key in os.environ and os.environ[key] != value:
                findings.append(
                    Finding(
                        "info",
                        key,
                        f"{os.environ[key]} in this shell; rlkit's workers get {value}",
                        "trainer.nvlink_multicast=true if this host's NVLink multicast works",
                    )
                )
    else:
        states = fabric_states(nvidia_smi_query())
        broken = [s for s in states if s != "Completed/Success"]
        if not states or broken:
            findings.append(
                Finding(
                    "fail",
                    "NCCL multicast",
                    "trainer.nvlink_multicast=true, but the NVLink fabric is not ready "
                    f"(nvidia-smi -q Fabric State/Status: {', '.join(states) or 'none reported'}): "
                    "start-up fails or hangs",
                    "start nvidia-fabricmanager (and IMEX), or set trainer.nvlink_multicast=false",
                )
            )
        else:
            findings.append(Finding("ok", "NCCL multicast", f"on; fabric ready on {len(states)} GPU(s)"))
    for key, why in SLOW_NCCL.items():
        if os.environ.get(key, "0") not in ("0", ""):
            findings.append(
                Finding("warn", key, f"={os.environ[key]} {why}", f"unset {key} unless this machine needs it")
            )
    return findings


def probe_port(address: str) -> None:
    """A quick TCP connect to HOST:PORT (ray:// prefix allowed), so a dead address fails in seconds."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and the like: let Ray resolve it
    try:
        socket.create_connection((host, int(port)), timeout=PORT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(f"{host}:{port} does not accept connections ({exc.strerror or exc})") from None


def ray_nodes(address: str) -> list[dict]:
    """ray.nodes() of the cluster at `address`, read in a fresh process (a hung connect cannot hang doctor)."""
    probe_port(address)
    script = (
        "import json, sys, ray\nray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
        "print('RLKIT-NODES ' + json.dumps(ray.nodes(), default=str))\nray.shutdown()\n"
    )
    # A loopback address stays loopback in the fresh process, as in a run's (rlkit.core.cluster.ray_access).
    env = {**os.environ, CLUSTER_OF_ONE_ENV: "0"} if is_loopback(address) else None
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, address], capture_output=True, text=True, timeout=RAY_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise ConnectionError(f"no answer within {RAY_TIMEOUT_S:.0f} s") from None
    for line in done.stdout.splitlines():
        if line.startswith("RLKIT-NODES "):
            return json.loads(line[len("RLKIT-NODES ") :])
    errors = [line for line in done.stderr.strip().splitlines() if "Error" in line or "error" in line]
    raise ConnectionError((errors or done.stderr.strip().splitlines() or ["no output"])[-1][:400])


def check_ray(config: RLConfig) -> list[Finding]:
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        return [Finding("ok", "Ray", "RAY_ADDRESS unset: each run starts its own local Ray cluster")]
    if environment.installed_version("ray") is None:
        return []  # reported above
    try:
        nodes = ray_nodes(address)
    except ConnectionError as exc:
        return [
            Finding(
                "fail",
                "Ray",
                f"RAY_ADDRESS={address} cannot be reached: {exc}",
                "start the cluster (`ray start --head` on the head node, `ray start --address=HEAD:6379` on "
                "the others) with this machine's Ray and Python versions, or unset RAY_ADDRESS",
            )
        ]
    alive = [n for n in nodes if n.get("Alive")]
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
    findings = [Finding("ok", "Ray", f"RAY_ADDRESS={address}: {len(alive)} alive node(s), {gpus:g} GPU(s)")]
    if warning := unauthenticated_warning(address):
        findings.append(Finding("warn", "Ray authentication", *warning))
    try:
        check_cluster(config, nodes)
    except UserError as exc:
        findings.append(Finding("fail", "Ray cluster size", str(exc)))
    return findings
