"""Placement end to end on CPU: split rollout/training devices, and a two-node Ray cluster."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from rlkit.core.train.policy_worker import PolicyWorker
from rlkit.core.controller.controller import Controller
from rlkit.core.state.run_dir import RunDir
from rlkit.recipes.loader import load_config

TINY_RUN = ["trainer.total_steps=2", "trainer.logger=[jsonl]", "rollout.name=hf", "reward.num_workers=1"]


def run_steps(overrides: list[str], tmp_path, steps: int = 2) -> tuple[list[dict], list[dict]]:
    config = load_config("grpo-demo", TINY_RUN + [f"trainer.runs_dir={tmp_path}"] + overrides)
    controller = Controller(config, RunDir.create(config))
    try:
        nodes = controller.workers.call(PolicyWorker.node_info)
        return [controller.step(step) for step in range(1, steps + 1)], nodes
    finally:
        controller.close()


@pytest.mark.slow
@pytest.mark.shared_ray
def test_split_placement_sends_the_updated_weights_to_the_rollout_worker(tmp_path):
    metrics, _ = run_steps(["trainer.n_gpus_per_node=2", "rollout.placement=split", "rollout.devices=1"], tmp_path)
    assert metrics[1]["actor/grad_norm"] > 0
    # Step 2 samples with the weights updated in step 1: the rollout worker's log-probs of
    # its own samples equal the trainer's only if the sync reached it.
    assert metrics[1]["rollout/log_prob_diff"] < 1e-5
    assert metrics[1]["sync/bytes"] > 0


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """A simulated two-node Ray cluster (one CPU each), started once for this module's tests; its address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_two_nodes_of_a_ray_cluster_train_together(tmp_path, monkeypatch, two_nodes):
    monkeypatch.setitem(os.environ, "RAY_ADDRESS", two_nodes)
    metrics, nodes = run_steps(["trainer.nnodes=2", "trainer.n_gpus_per_node=1"], tmp_path, steps=1)
    assert len({info["node_id"] for info in nodes}) == 2
    assert metrics[0]["rollout/log_prob_diff"] < 1e-5
    assert metrics[0]["actor/grad_norm"] > 0


@pytest.mark.slow
def test_one_step_off_rollout_on_its_own_node_gets_the_weights_over_the_transfer_group(
    tmp_path, monkeypatch, two_nodes
) -> None:
    """Training on node 0, rollout on node 1 (two simulated nodes): the broadcast group spans them."""
    monkeypatch.setitem(os.environ, "RAY_ADDRESS", two_nodes)
    split = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "rollout.placement=split", "rollout.devices=1",
             "rollout.mode=one_step_off"]
    config = load_config("grpo-demo", TINY_RUN + [f"trainer.runs_dir={tmp_path}", "trainer.total_steps=3"] + split)
    controller = Controller(config, RunDir.create(config))
    try:
        from ray.util import placement_group_table

        assert (controller.workers.slots, controller.placement.rollout.slots) == ([(0, 0)], [(1, 0)])
        groups = controller.backend.reservation.groups
        nodes = [placement_group_table(group)["bundles_to_node_id"][0] for group in groups]
        metrics = [controller.step(step) for step in (1, 2, 3)]
    finally:
        controller.close()
    assert nodes[0] != nodes[1]  # node 0's devices train, node 1's generate
    assert [m["rollout/staleness_max"] for m in metrics] == [0, 1, 1]
    assert metrics[2]["sync/bytes"] > 0  # the batch of step 3 was generated after the first transfer
