"""The bench scripts that reuse bench/rlkit_grpo.py's overrides see every setting it reads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rlkit_grpo import overrides, with_defaults  # noqa: E402
from bench.workload import Workload  # noqa: E402


def test_a_scripts_own_arguments_win_and_the_rest_take_the_benchmarks_defaults() -> None:
    # What bench/agent_grpo.py parses: no --defaults, --lora-rank, --mode (the run that failed on a GPU).
    args = with_defaults(argparse.Namespace(workdir="w", out="o", compile=True, cuda_graphs=False,
                                            micro_batch_tokens=4096, gpus=1, rollout="vllm"))
    workload = Workload(prompts=4, samples=2, prompt_tokens=8, response_tokens=16)
    keys = dict(item.split("=", 1) for item in overrides(args, workload, "p.parquet", "runs"))
    assert keys["model.compile"] == "true" and keys["actor.micro_batch_tokens"] == "4096"
    assert keys["model.lora.rank"] == "0" and keys["rollout.mode"] == "sync"
    assert keys["rollout.placement"] == "colocated" and keys["model.gradient_checkpointing"] == "false"


def test_run_all_caches_per_config_and_the_start_up_lines() -> None:
    from bench.run_all import cache_env, startup_lines

    assert cache_env(None, "rlkit-1gpu-defaults") == {}  # the libraries' own caches
    cold, warm = cache_env("/c", "rlkit-1gpu-defaults"), cache_env("/c", "rlkit-1gpu-defaults-again")
    assert cold == warm == {"TORCHINDUCTOR_CACHE_DIR": "/c/rlkit-1gpu-defaults/inductor",
                            "TRITON_CACHE_DIR": "/c/rlkit-1gpu-defaults/triton",
                            "VLLM_CACHE_ROOT": "/c/rlkit-1gpu-defaults/vllm"}
    results = {"configs": {
        "rlkit-1gpu-defaults": {"startup": {"ray_init_s": 4.0, "workers_setup_s": 30.0,
                                            "launch_to_first_step_s": 52.5}},
        "trl-1gpu-vllm": {"startup": {"launch_to_train_begin_s": 20.0, "launch_to_first_step_s": 45.0}},
        "rlkit-1gpu-defaults-again": {"startup": {"launch_to_first_step_s": 30.0}},
        "trl-1gpu-vllm-again": {"status": "timed out"},
    }}
    assert startup_lines(results)[2:] == [
        "- rlkit-1gpu-defaults: launch to first step 52.5 s (ray_init 4.0, workers_setup 30.0)",
        "- trl-1gpu-vllm: launch to first step 45.0 s (launch_to_train_begin 20.0)",
        "- rlkit-1gpu-defaults-again: launch to first step 30.0 s",
        "- rlkit-1gpu-defaults vs trl-1gpu-vllm: rlkit 52.5 s, TRL 45.0 s to the end of the first step: "
        "rlkit slower by 7.5 s",
    ]
