"""The bench scripts that reuse bench/rlkit_grpo.py's overrides see every setting it reads."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import pytest

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
        "rlkit-1gpu-start-replicas2-streaming": {"startup": {"launch_to_first_step_s": 40.0}},
        "rlkit-1gpu-start-replicas2-streaming-again": {"startup": {"launch_to_first_step_s": 44.0}},
        "trl-1gpu-vllm-bytecode-again": {"startup": {"launch_to_first_step_s": 43.5}},
    }}
    assert startup_lines(results)[2:] == [
        "- rlkit-1gpu-defaults: launch to first step 52.5 s (ray_init 4.0, workers_setup 30.0)",
        "- trl-1gpu-vllm: launch to first step 45.0 s (launch_to_train_begin 20.0)",
        "- rlkit-1gpu-defaults-again: launch to first step 30.0 s",
        "- rlkit-1gpu-start-replicas2-streaming: launch to first step 40.0 s",
        "- rlkit-1gpu-start-replicas2-streaming-again: launch to first step 44.0 s",
        "- trl-1gpu-vllm-bytecode-again: launch to first step 43.5 s",
        "- rlkit-1gpu-defaults vs trl-1gpu-vllm: rlkit 52.5 s, TRL 45.0 s to the end of the first step: "
        "rlkit slower by 7.5 s",
        "- rlkit-1gpu-start-replicas2-streaming vs trl-1gpu-vllm: rlkit 40.0 s, TRL 45.0 s to the end of the first "
        "step: rlkit faster by 5.0 s",
        "- rlkit-1gpu-start-replicas2-streaming-again vs trl-1gpu-vllm-bytecode-again: rlkit 44.0 s, TRL 43.5 s to "
        "the end of the first step: rlkit slower by 0.5 s",
    ]


LORA_7B_SHARED = ["--shape", "7b", "--prompts", "16", "--lora-rank", "64", "--grad-ckpt", "--micro-batch-tokens",
                  "12288", "--gpu-memory-utilization", "0.35"]


def test_the_7b_lora_lanes_run_both_scripts_on_one_workload_folder_with_the_same_arguments(tmp_path: Path) -> None:
    from bench.run_all import RLKIT, TRL, Runner

    runner = Runner(argparse.Namespace(workdir="/w", tiny=False, caches_per_config=None), tmp_path, gpus=1,
                    peak=None, results={}, deadline=0.0)
    ours = runner.command("rlkit-1gpu-7b-lora64", tmp_path / "r.json")
    theirs = runner.command("trl-1gpu-7b-lora64", tmp_path / "t.json")
    tail = ["--workdir", "/w/7b", "--out"]  # one 7B build shared by both, beside the 0.5B workload in /w
    assert ours == [sys.executable, RLKIT, "--cuda-graphs", "--rollout-is-cap", "2", *LORA_7B_SHARED, *tail,
                    str(tmp_path / "r.json"), "--label", "rlkit-1gpu-7b-lora64"]
    assert theirs == [sys.executable, TRL, "--vllm", *LORA_7B_SHARED, *tail, str(tmp_path / "t.json"),
                      "--label", "trl-1gpu-7b-lora64"]
    full = runner.command("trl-1gpu-1.5b-full", tmp_path / "f.json")
    assert full[full.index("--workdir") + 1] == "/w/1.5b" and "--lora-rank" not in full
    assert runner.command("trl-1gpu-vllm", tmp_path / "v.json")[3:5] == ["--workdir", "/w"]


def test_lora_rank_64_is_rank_64_alpha_128_on_every_linear_layer_on_both_sides() -> None:
    from bench.rlkit_grpo import build_parser
    from bench.trl_grpo import lora_settings
    from bench.workload import SHAPES
    from rlkit.recipes.loader import load_config

    args = build_parser().parse_args(["--workdir", "w", "--out", "o", "--cuda-graphs", *LORA_7B_SHARED])
    workload = replace(SHAPES[args.shape], prompts=args.prompts)
    config = load_config("grpo", overrides(args, workload, "p.parquet", "runs"), model="m", require_inputs=False)
    lora = config.model.lora
    assert (lora.rank, lora.alpha, lora.target_modules, lora.dropout) == (64, 128, "all-linear", 0.0)
    assert config.actor.micro_batch_tokens == 12288 and config.model.gradient_checkpointing
    assert (config.data.train_batch_size, config.rollout.n, config.actor.mini_batch_size) == (16, 8, 16)
    assert config.rollout.gpu_memory_utilization == 0.35 and config.actor.lr == 1e-6
    # TRL's LoraConfig arguments: rlkit's settings under peft's names (rlkit.core.train.adapters.peft_config)
    assert lora_settings(64) == {"r": 64, "lora_alpha": 128, "target_modules": "all-linear", "lora_dropout": 0.0,
                                 "task_type": "CAUSAL_LM"}
    assert lora_settings(0) is None  # full fine-tuning


def test_trl_takes_the_same_batch_micro_batch_and_engine_share() -> None:
    from bench.trl_grpo import build_parser as trl_parser
    from bench.trl_grpo import grpo_settings, sequences_per_micro_batch
    from bench.workload import FULL, SHAPES, TINY

    args = trl_parser().parse_args(["--workdir", "w", "--out", "o", "--vllm", *LORA_7B_SHARED])
    workload = replace(SHAPES["7b"], prompts=16)
    settings = grpo_settings(args, workload, "out", None)
    # 16 prompts x 8 samples = 128 sequences: 8 micro-batches of 16 x 768 = 12288 tokens, one optimizer step
    assert (settings["per_device_train_batch_size"], settings["gradient_accumulation_steps"]) == (16, 8)
    assert (settings["num_generations"], settings["max_completion_length"]) == (8, 512)
    assert settings["gradient_checkpointing"] and settings["vllm_gpu_memory_utilization"] == 0.35
    assert (settings["learning_rate"], settings["beta"], settings["vllm_mode"]) == (1e-6, 0.001, "colocate")
    assert settings["use_vllm"] and settings["generation_kwargs"] == {"ignore_eos": True}
    plain = grpo_settings(trl_parser().parse_args(["--workdir", "w", "--out", "o"]), FULL, "out", None)
    assert "vllm_gpu_memory_utilization" not in plain and not plain["gradient_checkpointing"]  # TRL's own 0.3
    assert plain["per_device_train_batch_size"] == 16 and plain["gradient_accumulation_steps"] == 32
    assert sequences_per_micro_batch(6144, FULL) == 8
    assert sequences_per_micro_batch(12288, TINY) == 16  # 512 sequences of 24 tokens, but a step has 16
    with pytest.raises(ValueError, match="multiple of 768"):
        sequences_per_micro_batch(8192, FULL)
    with pytest.raises(ValueError, match="512 sequences a step do not split into micro-batches of 3"):
        sequences_per_micro_batch(3 * 768, FULL)


def test_the_1p5b_shape_is_qwen25_1p5b_and_ratios_pair_each_rlkit_lane_with_trl_on_its_workload() -> None:
    from bench.run_all import shape_of, table, workdir_for
    from bench.workload import SHAPES

    shape = SHAPES["1.5b"]  # Qwen2.5-1.5B's config.json
    assert (shape.hidden, shape.intermediate, shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == \
        (1536, 8960, 28, 12, 2, 128)
    assert (shape.vocab, shape.tied, shape.prompts, shape.samples) == (151936, True, 64, 8)
    assert shape_of(["x.py", "--shape", "1.5b"]) == "1.5b" and shape_of(["x.py"]) == "0.5b"
    assert workdir_for("/w", "0.5b") == "/w" and workdir_for("/w", "1.5b") == "/w/1.5b"

    def rlkit(step_seconds: float) -> dict:
        return {"status": "ok", "summary": {"step_seconds": step_seconds, "phases": {},
                                            "rollout": {"seconds": 1.0, "tokens_per_s": 1.0},
                                            "sync_seconds": 0.1, "controller_overhead_seconds": 0.1}}

    results = {"machine": "CPU", "date": "d", "versions": {}, "peak_flops": None, "configs": {
        "rlkit-1gpu-7b-lora64": rlkit(20.0), "trl-1gpu-7b-lora64": {"status": "ok", "step_seconds": 50.0},
        "rlkit-1gpu-vllm": rlkit(10.0), "trl-1gpu-vllm": {"status": "ok", "step_seconds": 25.0}}}
    ratios = [line for line in table(results).splitlines() if " vs " in line]
    assert ratios == [
        "- rlkit-1gpu-7b-lora64 vs trl-1gpu-7b-lora64: rlkit 20.00 s/step, TRL 50.00 s/step: rlkit is 2.50x faster",
        "- rlkit-1gpu-vllm vs trl-1gpu-vllm: rlkit 10.00 s/step, TRL 25.00 s/step: rlkit is 2.50x faster",
    ]


def test_the_agent_loop_host_bench_runs_whole_episodes_against_an_instant_engine(tmp_path: Path, monkeypatch) -> None:
    """bench/agent_loop_host.py times rlkit's own work in a multi-turn rollout: every episode runs its 3 turns."""
    import json

    from bench import agent_loop_host

    out = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["agent_loop_host.py", "--out", str(out), "--episodes", "16", "--repeats", "1"])
    agent_loop_host.main()
    result = json.loads(out.read_text())
    assert result["episodes"] == 16 and len(result["seconds"]) == 1
    assert result["ms_per_turn"] == pytest.approx(result["best_seconds"] / 48 * 1e3)


def test_every_rlkit_lane_of_run_all_is_a_config_the_grpo_recipe_accepts() -> None:
    """A lane whose overrides name a key that does not exist fails at once here, not after a GPU machine's start
    (one call of 2026-12-04 lost 100 s to a typo in a lane's overrides)."""
    from bench.rlkit_grpo import build_parser
    from bench.run_all import CONFIGS, RLKIT
    from bench.workload import SHAPES
    from rlkit.core.state.run_dir import resolve_model_path
    from rlkit.recipes.loader import load_config

    model = str(resolve_model_path("rlkit:tiny-qwen2"))
    lanes = {name: script_args[1:] for name, (script_args, _, _) in CONFIGS.items() if script_args[0] == RLKIT}
    assert {"rlkit-1gpu-sglang-logprobs-streaming", "rlkit-1gpu-7b-lora64-compile"} <= set(lanes)
    for name, lane_args in lanes.items():
        args = build_parser().parse_args([*lane_args, "--workdir", "w", "--out", "o"])
        workload = replace(SHAPES[args.shape], prompts=args.prompts or SHAPES[args.shape].prompts)
        config = load_config("grpo", overrides(args, workload, "p.parquet", "runs"), model=model, require_inputs=False)
        assert config.data.train_batch_size == workload.prompts, name


def test_torch_profile_names_its_step_to_the_recipe() -> None:
    from bench.rlkit_grpo import build_parser
    from bench.workload import FULL
    from rlkit.core.state.run_dir import resolve_model_path
    from rlkit.recipes.loader import load_config

    model = str(resolve_model_path("rlkit:tiny-qwen2"))
    for extra, profiled in (([], []), (["--torch-profile", "tp"], [3]), (["--torch-profile", "tp", "--torch-profile-step",
                                                                          "2"], [2])):
        args = build_parser().parse_args(["--workdir", "w", "--out", "o", *extra])
        config = load_config("grpo", overrides(args, FULL, "p.parquet", "runs"), model=model, require_inputs=False)
        assert config.trainer.profile_steps == profiled


def test_the_rollouts_gpu_busy_share_is_the_mean_of_the_samples_inside_each_steps_rollout() -> None:
    from datetime import datetime

    from bench.host_time import busy_within, parse_nvml_line
    from bench.rlkit_grpo import rollout_windows

    at = datetime(2026, 12, 6, 17, 0, 0).timestamp()
    assert parse_nvml_line("2026/12/06 17:00:00.250, 87") == (at + 0.25, 87.0)
    assert parse_nvml_line("[N/A]") is None and parse_nvml_line("2026/12/06 17:00:00.250, [N/A]") is None
    # step 1 began at `at` and generated for 2 s, step 2 began 5 s later and generated for 1 s
    windows = rollout_windows([at, at + 5.0], [{"timing/gen": 2.0}, {"rollout/generate_seconds": 1.0}])
    assert windows == [(at, at + 2.0), (at + 5.0, at + 6.0)]
    samples = [(at + 0.5, 40.0), (at + 1.5, 80.0), (at + 3.0, 0.0), (at + 5.5, 90.0), (at + 7.0, 10.0)]
    assert busy_within(samples, windows[:1]) == {"nvml_busy_fraction": 0.6, "nvml_samples": 2}
    assert busy_within(samples, windows) == {"nvml_busy_fraction": 0.7, "nvml_samples": 3}  # (40 + 80 + 90) / 3
    assert busy_within(samples, [(at + 8.0, at + 9.0)]) == {}  # none inside: nothing, not 0


def test_the_updates_window_ends_where_the_weight_sync_begins() -> None:
    from bench.rlkit_grpo import update_windows

    # a 10 s step whose last 0.5 s are the sync, after a 4 s update; a step without an update has no window
    steps = [{"timing/step": 10.0, "timing/update_actor": 4.0, "timing/sync": 0.5}, {"timing/step": 3.0}]
    assert update_windows([100.0, 200.0], steps) == [(105.5, 109.5)]
