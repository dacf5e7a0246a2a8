"""Who can reach the Ray cluster of a run.

A local cluster that rlkit starts is its user's alone: every Ray process of it listens on 127.0.0.1
only, and token authentication is on, with a token made for the run (RAY_AUTH_TOKEN) that lives in
the environment of the processes it starts, never on disk (Ray's own default writes ~/.ray/auth_token).
Attaching to a cluster on another machine (RAY_ADDRESS) without token authentication gets a warning:
if that cluster runs without it, whoever reaches its ports can run code there.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipes.schema import RLConfig

LOOPBACK = "127.0.0.1"
CLUSTER_OF_ONE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray keeps loopback addresses (see keep_loopback)
logger = logging.getLogger("rlkit")
_warned: set[str] = set()  # addresses warned about in this process


def host_of(address: str) -> str:
    """The host of HOST:PORT, [V6]:PORT or ray://HOST:PORT."""
    host = address.split("://", 1)[-1].rpartition(":")[0] or address
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    host = host_of(address)
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keep_loopback() -> None:
    """Ray replaces a loopback node or cluster address with the machine's outward one unless it takes the
    machine for a cluster of one, as on a laptop (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0). Ray reads that
    once, at import: it is set for the processes this one starts, and in this one's copy."""
    from ray._private import ray_constants

    os.environ[CLUSTER_OF_ONE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def reload_auth_settings() -> None:
    """Ray reads RAY_AUTH_MODE and the token once per process (at import); read them again."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def local_cluster_options() -> dict[str, Any]:
    """ray.init arguments of a new local cluster that only this user on this machine can use."""
    keep_loopback()
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))  # the caller's own, if it has one
    reload_auth_settings()
    return {"_node_ip_address": LOOPBACK}


def unauthenticated_warning(address: str) -> tuple[str, str] | None:
    """(what is wrong, what to do) about attaching to `address` without token authentication; None: nothing."""
    if address == "auto" or is_loopback(address) or os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return None
    return (
        f"RAY_ADDRESS={address} is a Ray cluster on another machine and RAY_AUTH_MODE is not 'token' here: if "
        "the cluster runs without token authentication, whoever reaches its ports can run code on it",
        "start it with RAY_AUTH_MODE=token (a token: `ray get-auth-token --generate`) and set RAY_AUTH_MODE=token "
        "and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the same token here",
    )


def prepare_attach(address: str) -> None:
    """Before ray.init(address): a loopback address stays loopback; an unauthenticated remote one is warned
    about, once per process."""
    if is_loopback(address):
        keep_loopback()
    warning = unauthenticated_warning(address)
    if warning and address not in _warned:
        _warned.add(address)
        logger.warning("%s; %s", *warning)


def check_cluster(config: RLConfig, nodes: list[dict[str, Any]]) -> None:
    """`nodes` (ray.nodes()) has trainer.nnodes alive nodes with n_gpus_per_node devices each."""
    trainer = config.trainer
    total_gpus = sum(node["Resources"].get("GPU", 0) for node in nodes if node["Alive"])
    kind = "GPU" if trainer.device == "cuda" or (trainer.device == "auto" and total_gpus > 0) else "CPU"
    sizes = sorted((int(node["Resources"].get(kind, 0)) for node in nodes if node["Alive"]), reverse=True)
    if sum(size >= trainer.n_gpus_per_node for size in sizes) < trainer.nnodes:
        raise UserError(
            f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node} "
            f"needs {trainer.nnodes} node(s) with {trainer.n_gpus_per_node} {kind}(s) each, but the Ray "
            f"cluster at RAY_ADDRESS has {len(sizes)} alive node(s) with {sizes} {kind}(s); lower "
            "them or add nodes"
        )
