"""How the controller starts Ray (Ray itself is replaced: no cluster is started)."""

from __future__ import annotations

import logging
import os

import pytest
import ray
from ray._private.authentication.authentication_token_setup import enable_token_auth_by_default

from rlkit.core.cluster.worker_group import init_ray
from rlkit.recipes.loader import load_config


@pytest.fixture
def fake_ray_init(monkeypatch) -> dict:
    """ray.init replaced by a recorder of its arguments and of RAY_AUTH_MODE at that moment."""
    seen: dict = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs, auth_mode=os.environ.get("RAY_AUTH_MODE")))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "placeholder")  # so that monkeypatch restores the variable after the test
    monkeypatch.delenv("RAY_AUTH_MODE")
    return seen


def test_a_new_local_cluster_keeps_token_auth_without_rays_warning(fake_ray_init, caplog) -> None:
    init_ray(load_config("grpo-demo"))
    assert fake_ray_init["address"] == "local" and fake_ray_init["auth_mode"] == "token"
    # What ray.init does first for a new local cluster: with the mode set, it says nothing.
    with caplog.at_level(logging.WARNING):
        assert enable_token_auth_by_default() is True
    assert "Token authentication" not in caplog.text


def test_a_users_own_auth_mode_is_kept(fake_ray_init, monkeypatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    init_ray(load_config("grpo-demo"))
    assert fake_ray_init["auth_mode"] == "disabled"
