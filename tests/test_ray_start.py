"""How the controller starts Ray (ray.init is replaced: no cluster is started)."""

from __future__ import annotations

import logging
import os

import pytest
import ray
from ray._private import ray_constants
from ray._raylet import AuthenticationMode, get_authentication_mode

from rlkit.core.cluster import ray_access
from rlkit.core.cluster import worker_group
from rlkit.core.cluster.worker_group import init_ray
from rlkit.core.controller import preflight
from rlkit.recipes.loader import load_config

REMOTE = "10.1.2.3:6379"


@pytest.fixture
def fake_init(monkeypatch):
    """ray.init replaced by a recorder of its arguments and of this process's Ray settings at the call;
    afterwards the settings the test changed are put back, in the environment and in Ray's copy."""
    seen: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(
        {**kwargs, "env": {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")},
         "auth_mode": get_authentication_mode(), "cluster_of_one": not ray_constants.ENABLE_RAY_CLUSTER}))
    monkeypatch.setattr(worker_group, "check_cluster", lambda config, nodes: None)
    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setenv(ray_access.CLUSTER_OF_ONE_ENV, "1")
    monkeypatch.setattr(ray_access, "_warned", set())
    yield seen
    monkeypatch.undo()
    ray_access.reload_auth_settings()  # the session's token again, for the tests attaching to the shared head


def test_a_local_cluster_listens_on_loopback_with_token_auth_and_a_token_of_its_own(fake_init, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # rlkit's own cluster is never open
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    init_ray(load_config("grpo-demo"))
    [seen] = fake_init
    assert (seen["address"], seen["_node_ip_address"], seen["include_dashboard"]) == ("local", "127.0.0.1", False)
    assert seen["env"]["RAY_AUTH_MODE"] == "token" and len(seen["env"]["RAY_AUTH_TOKEN"]) == 64
    assert seen["auth_mode"] == AuthenticationMode.TOKEN  # read again by Ray in this process, too
    # Ray keeps 127.0.0.1 (it would swap in the outward address otherwise), here and in the processes it starts.
    assert seen["cluster_of_one"] and os.environ[ray_access.CLUSTER_OF_ONE_ENV] == "0"
    assert ray_access.CLUSTER_OF_ONE_ENV == ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR  # the name this Ray reads


def test_a_local_cluster_keeps_the_callers_token(fake_init, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a" * 64)
    init_ray(load_config("grpo-demo"))
    assert fake_init[0]["env"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a" * 64}


def test_attaching_to_another_machine_without_token_auth_warns_once(fake_init, monkeypatch, caplog):
    monkeypatch.setenv("RAY_ADDRESS", REMOTE)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        init_ray(load_config("grpo-demo"))
        init_ray(load_config("grpo-demo"))
    assert [r.getMessage() for r in caplog.records] == [
        f"RAY_ADDRESS={REMOTE} is a Ray cluster on another machine and RAY_AUTH_MODE is not 'token' here: if the "
        "cluster runs without token authentication, whoever reaches its ports can run code on it; start it with "
        "RAY_AUTH_MODE=token (a token: `ray get-auth-token --generate`) and set RAY_AUTH_MODE=token and "
        "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the same token here"]
    assert [seen["address"] for seen in fake_init] == [REMOTE, REMOTE] and "_node_ip_address" not in fake_init[0]
    assert not fake_init[0]["cluster_of_one"]  # another machine's addresses are left alone


@pytest.mark.parametrize("address, mode", [(REMOTE, "token"), ("ray://10.1.2.3:10001", "TOKEN"),
                                           ("127.0.0.1:6379", None), ("localhost:6379", None), ("auto", None)])
def test_attaching_with_token_auth_or_on_this_machine_is_quiet(fake_init, monkeypatch, caplog, address, mode):
    monkeypatch.setenv("RAY_ADDRESS", address)
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        init_ray(load_config("grpo-demo"))
    assert caplog.records == []
    # A loopback address stays loopback (Ray would swap in the machine's outward address).
    assert fake_init[0]["cluster_of_one"] == ray_access.is_loopback(address)


@pytest.mark.parametrize("address, loopback", [("127.0.0.1:6379", True), ("[::1]:6379", True),
                                               ("ray://localhost:10001", True), ("127.0.0.2:1", True),
                                               ("10.0.0.1:6379", False), ("head.example.org:6379", False),
                                               ("auto", False)])
def test_loopback_addresses(address, loopback):
    assert ray_access.is_loopback(address) is loopback
