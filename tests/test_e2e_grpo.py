"""End to end on the tiny world: the CLI path a user takes, and the multi-worker weight sync."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import run_cli_in_process

pytestmark = pytest.mark.slow


def _rewards(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "reward/mean" in row]  # not the validation before training (step 0)
    return rows, [row["reward/mean"] for row in rows]


def test_grpo_demo_learns_through_the_cli(tmp_path):
    """`rlkit train grpo-demo` (Ray controller, FSDP2 worker, vLLM rollout) really learns `echo`, and its
    validation on the task's test split (before training, every 20 steps, at the end) rises with it.
    On the path a user's first run takes: its own local Ray cluster (no shared_ray mark). 50 of the recipe's 120
    steps: on 2 cores (2026-12-06, in-process) the reward's first 5 steps averaged 0.028 and steps 46-50 0.474,
    validation 0.0 at step 0 and 0.633 at step 40. Step 2 runs under the profiler (trainer.profile_steps), armed in
    the Ray worker (tests/test_profiling.py shows in-process that a profiled step trains as without)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.cli.main", "train", "grpo-demo", "trainer.total_steps=50",
         f"trainer.runs_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.profile_steps=[2]", "--run-id", "learn"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "learn" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in records if "reward/mean" in r]
    rewards = [row["reward/mean"] for row in rows]
    assert [row["step"] for row in rows] == list(range(1, 51))
    for key in ("reward/mean", "timing/step", "perf/tokens_per_s", "timing/gen", "timing/sync",
                "actor/grad_norm", "rollout/log_prob_diff", "response/clip_frac"):
        assert key in rows[0], key
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last - first >= 0.4, (first, last, rewards)

    validated = {r["step"]: r for r in records if "val/reward/mean@1" in r}
    assert sorted(validated) == [0, 20, 40, 50]
    assert validated[50]["val/reward/mean@1"] - validated[0]["val/reward/mean@1"] >= 0.4, validated
    responses = (tmp_path / "learn" / "validation" / "step_00000050.jsonl").read_text().splitlines()
    assert len(responses) == 128 * (1 + 4)  # the test split, greedy + trainer.val_n=4 samples each
    assert "val/reward/mean@1 " in proc.stderr + proc.stdout  # the summary line: first -> last
    profiled = {p.name for p in (tmp_path / "learn" / "profile").iterdir()}
    assert profiled == {"step2"}
    assert {"rank0-generate.txt", "rank0-update_actor.txt", "rank0-update_actor.trace.json.gz"} <= {
        p.name for p in (tmp_path / "learn" / "profile" / "step2").iterdir()}
    assert "step 2 profiled" in proc.stderr and "rank 0 update_actor: " in proc.stderr
    run_cli_in_process("plot", "learn", "--runs-dir", str(tmp_path))
    assert (tmp_path / "learn" / "plot.png").is_file()


def test_hf_rollout_with_kl_loss_runs_through_the_cli(tmp_path):
    """The transformers fallback engine, the reference policy loaded for a KL loss, and TIS weights; the
    worker is an object in the CLI's process (trainer.workers=in_process: no Ray, no worker processes), and
    the CLI runs in the test's process (conftest.run_cli_in_process)."""
    # A reward with spread in every group, so step 1 has a gradient whatever the samples (echo's
    # 0/1 reward is 0 for all 128 samples about one time in eight, and then nothing moves).
    (tmp_path / "spread.py").write_text("def spread(data_source, response, ground_truth, extra_info):\n"
                                        "    return sum(map(ord, response)) % 10 / 10\n")
    run_cli_in_process(
        "train", "grpo-demo", "trainer.total_steps=2", "rollout.name=hf", "actor.use_kl_loss=true",
        "actor.rollout_is_cap=2.0", "rollout.log_prob_check_freq=0", f"reward.function={tmp_path / 'spread.py'}:spread",
        "trainer.workers=in_process", "trainer.device=cpu", f"trainer.runs_dir={tmp_path}", "trainer.logger=[jsonl]",
        "--run-id", "hf")
    rows, _ = _rewards(tmp_path / "hf")
    assert len(rows) == 2
    assert rows[0]["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)   # step 1: policy == reference
    assert rows[1]["actor/kl_ref"] > 0                                  # after one update it moved
    assert rows[1]["rollout/log_prob_diff"] < 1e-4                      # HF engine synced exactly
    # TIS asks for the engine's log-probs every step; an exact engine gives weights of 1.
    assert rows[1]["actor/rollout_is_weight"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.bench  # ~1 min; make test keeps SGLang's engine contract (test_rollout_engines.py), weight loads included
def test_sglang_rollout_runs_through_the_cli(tmp_path, sglang_env):
    """rollout.name=sglang in the worker: generation, a bucketed weight sync after each update, exact on CPU.

    The worker is an object in the CLI's process (trainer.workers=in_process), the CLI a subprocess: SGLang's
    engine and its scheduler process must see the run's PYTHONPATH, which carries the torchvision stand-in
    where there is no torchvision (tests/conftest.py: `sglang_env`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.cli.main", "train", "grpo-demo", "trainer.total_steps=3", "rollout.name=sglang",
         "rollout.log_prob_check_freq=1", "trainer.workers=in_process", "trainer.device=cpu",
         f"trainer.runs_dir={tmp_path}", "trainer.logger=[jsonl]", "--run-id", "sglang"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CUDA graphs n/a (rollout.name=sglang)" in proc.stderr
    rows, _ = _rewards(tmp_path / "sglang")
    assert [row["step"] for row in rows] == [1, 2, 3]
    # Steps 2 and 3 generate with weights synced after an update: the engine scores as the trainer does.
    assert all(row["rollout/log_prob_diff"] < 1e-4 for row in rows), [row["rollout/log_prob_diff"] for row in rows]


@pytest.mark.shared_ray
def test_two_workers_hold_shards_generate_and_stay_in_sync(tmp_path):
    """n_gpus_per_node=2: sharded policy, one vLLM engine per worker, exact sync after an update."""
    from rlkit.core.batch import build_batch
    from rlkit.core.controller.controller import Controller
    from rlkit.core.state.run_dir import RunDir
    from rlkit.core.rollout.base import RolloutSample
    from rlkit.core.rollout.trajectory import Trajectory
    from rlkit.core.train.policy_worker import PolicyWorker
    from rlkit.recipes.loader import load_config

    config = load_config("grpo-demo", ["trainer.n_gpus_per_node=2", f"trainer.runs_dir={tmp_path}",
                                       "data.max_response_length=3", "trainer.logger=[jsonl]"])
    controller = Controller(config, RunDir.create(config, "sync"))
    try:
        for rank, info in enumerate(controller.setup_info):
            local, full = info["shards"]["model.embed_tokens.weight"]
            assert full == 64 * 128 and local == full // 2, (rank, local, full)
        metrics = controller.step(1)
        assert metrics["timing/sync"] > 0

        prompts = [row.prompt_token_ids for row in controller.rows[:2]]
        from rlkit.core.rollout.base import Sampling
        per_rank = [([p], Sampling(n=2, max_tokens=3, seed=rank)) for rank, p in enumerate(prompts)]
        outputs = controller.workers.call(PolicyWorker.generate, per_rank=per_rank)
        pids = {info["pid"] for info in controller.workers.call(PolicyWorker.node_info)}
        assert len(pids) == 2 and all(len(out) == 2 for out in outputs)

        # The policy after one update vs each worker's engine, on one fixed sequence.
        row = controller.rows[0]
        response = [5, 6, 7]
        batch = build_batch([Trajectory.single_turn(row, 0, RolloutSample(0, response, [0.0] * 3, False))] * 2,
                            pad_id=controller.tokenizer.pad_token_id)
        policy = controller.log_probs(batch, "actor")["log_probs"][0]
        engines = controller.workers.call(PolicyWorker.engine_log_probs, [row.prompt_token_ids + response],
                                          len(row.prompt_token_ids))
        for engine in engines:
            assert torch.allclose(torch.tensor(engine[0]), policy, atol=1e-4), (engine, policy)
    finally:
        controller.close()
