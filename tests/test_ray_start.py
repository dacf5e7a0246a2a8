"""How the controller starts Ray (ray.init is replaced: no cluster is started)."""

from __future__ import annotations

import logging
import os

import ray
from ray._private.authentication import authentication_token_setup as ray_auth

from rlkit.core.cluster.worker_group import RAY_AUTH_LOGGER, init_ray
from rlkit.recipes.loader import load_config


def test_rays_token_auth_notice_is_dropped_and_its_setting_kept(monkeypatch, caplog) -> None:
    seen: dict = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs, auth_mode=os.environ.get("RAY_AUTH_MODE")))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    auth_logger = logging.getLogger(RAY_AUTH_LOGGER)
    monkeypatch.setattr(auth_logger, "filters", list(auth_logger.filters))  # the filter is gone after the test
    init_ray(load_config("grpo-demo"))
    assert seen["address"] == "local"
    assert seen["auth_mode"] == os.environ.get("RAY_AUTH_MODE")  # Ray decides the mode, as before
    with caplog.at_level(logging.WARNING, logger=RAY_AUTH_LOGGER):
        ray_auth._warn_token_auth_enabled()   # what ray.init says on every new local cluster
        ray_auth._warn_token_auth_disabled()  # a real warning: it stays
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("Token authentication is disabled for this Ray cluster")

