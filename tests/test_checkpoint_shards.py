"""A worker's shards round-trip exactly: FSDP2 model, AdamW state, LR schedule and RNG streams."""

from __future__ import annotations

import random
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.state.shards import load_shards, rng_state, save_shards, set_rng_state
from rlkit.core.train import fsdp


@pytest.fixture
def process_group(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_trainer(path: str):
    model = fsdp.shard_model(fsdp.load_model(path), device=torch.device("cpu"), compute_dtype="float32")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, fsdp.lr_lambda(2, 10, "cosine"))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler) -> float:
    ids = torch.randint(3, 40, (2, 6))  # draws from the torch RNG: a restored stream repeats it
    loss = model(input_ids=ids, labels=ids).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


def test_rng_state_round_trips_python_numpy_and_torch() -> None:
    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_resumed_shards_continue_exactly_like_the_uninterrupted_model(tmp_path, process_group) -> None:
    path = resolve_model_path("rlkit:tiny-qwen2")
    torch.manual_seed(0)
    model, optimizer, scheduler = make_trainer(path)
    for _ in range(3):
        train_step(model, optimizer, scheduler)
    save_shards(tmp_path / "policy", 0, model=model, optimizer=optimizer, scheduler=scheduler)
    uninterrupted = [train_step(model, optimizer, scheduler) for _ in range(3)]

    torch.manual_seed(123)  # a fresh process: other weights' RNG, a fresh optimizer and schedule
    resumed_model, resumed_opt, resumed_sched = make_trainer(path)
    load_shards(tmp_path / "policy", 0, model=resumed_model, optimizer=resumed_opt, scheduler=resumed_sched)
    assert resumed_sched.last_epoch == 3
    assert [train_step(resumed_model, resumed_opt, resumed_sched) for _ in range(3)] == uninterrupted
    for (name, a), (_, b) in zip(model.named_parameters(), resumed_model.named_parameters()):
        assert torch.equal(a.full_tensor(), b.full_tensor()), name
