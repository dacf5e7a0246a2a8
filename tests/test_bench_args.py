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
