"""The fast paths the benchmark proves (compile, CUDA graphs, a large micro-batch budget) are the
defaults on GPUs, stay switchable, and resolve as pinned here (device type and free memory simulated)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlkit.core.train import fast_paths
from rlkit.errors import ConfigError
from rlkit.recipes.checks import batch_arithmetic
from rlkit.recipes.loader import load_config

GiB = 1 << 30
# Qwen2.5-0.5B's shape (the benchmark's model)
QWEN_05B = SimpleNamespace(hidden_size=896, intermediate_size=4864, num_attention_heads=14, head_dim=64,
                           num_key_value_heads=2, num_hidden_layers=24, vocab_size=151936)


def test_defaults_are_auto_and_each_stays_a_switch():
    config = load_config("grpo", ["model.path=m", "data.synthetic_task=echo"])
    assert (config.model.compile, config.rollout.vllm.enforce_eager, config.actor.micro_batch_tokens) == ("auto", None, "auto")
    off = load_config("grpo", ["model.path=m", "data.synthetic_task=echo", "model.compile=false",
                               "rollout.vllm.enforce_eager=true", "actor.micro_batch_tokens=8192"])
    assert (off.model.compile, off.rollout.vllm.enforce_eager, off.actor.micro_batch_tokens) == (False, True, 8192)
    with pytest.raises(ConfigError, match="actor.micro_batch_tokens"):
        load_config("grpo", ["model.path=m", "data.synthetic_task=echo", "actor.micro_batch_tokens=0"])


@pytest.mark.parametrize("setting, device, expected", [
    ("auto", "cuda", True), ("auto", "cpu", False), (False, "cuda", False), (True, "cpu", True)])
def test_compile_is_on_with_cuda_unless_turned_off(setting, device, expected):
    assert fast_paths.compile_enabled(setting, device) is expected


@pytest.mark.parametrize("enforce_eager, device, expected", [
    (None, "cuda", True), (None, "cpu", False), (True, "cuda", False), (False, "cuda", True)])
def test_cuda_graphs_follow_enforce_eager(enforce_eager, device, expected):
    assert fast_paths.cuda_graphs_enabled(enforce_eager, device) is expected


def test_activation_bytes_per_token_of_the_benchmark_model():
    # per layer: 2 x (18 x 896 + 4 x 4864 + 6 x 128) + 16 x 896 = 87,040 bytes; x 24 layers = 2,088,960;
    # the head at a response position: logits and their gradient, 2 x 2 x 151,936 = 607,744
    assert fast_paths.activation_bytes_per_token(QWEN_05B, 2, gradient_checkpointing=False) == 2_696_704
    # checkpointed: each layer keeps its input (24 x 2 x 896 = 43,008), one layer is recomputed at a time
    assert fast_paths.activation_bytes_per_token(QWEN_05B, 2, gradient_checkpointing=True) == 737_792
    # fp32 compute: 4 x 36,352 + 14,336 = 159,744 per layer, x 24 = 3,833,856; head 2 x 4 x 151,936 = 1,215,488
    assert fast_paths.activation_bytes_per_token(QWEN_05B, 4, gradient_checkpointing=False) == 5_049_344
    # the fused head (actor.fused_lm_head) holds no logits: the layers' 2,088,960 alone
    assert fast_paths.activation_bytes_per_token(QWEN_05B, 2, gradient_checkpointing=False, fused_head=True) == 2_088_960


def test_auto_budget_from_free_memory_on_an_h200():
    """139 GiB free of 141 after loading: minus gradients + AdamW of 494M parameters (5.93 GB) and the
    reserve (10% of 141 GiB + 2 GiB = 17.29 GB) leaves 126.03 GB = 46,736 tokens, rounded down to 46,080."""
    budget = fast_paths.auto_micro_batch_tokens(free_bytes=139 * GiB, total_bytes=141 * GiB,
                                                trainable_params=494_032_768, critic_params=0,
                                                bytes_per_token=2_696_704, longest_sequence=768)
    assert budget == 46_080
    assert budget > 32_768  # at least the benchmark's setting


def test_auto_budget_limits():
    args = dict(total_bytes=80 * GiB, trainable_params=10**9, critic_params=0, bytes_per_token=10**6,
                longest_sequence=2048)
    assert fast_paths.auto_micro_batch_tokens(free_bytes=80 * GiB, **{**args, "bytes_per_token": 1000}) == 65_536
    assert fast_paths.auto_micro_batch_tokens(free_bytes=20 * GiB, **args) == 2048  # nothing left: one sequence
    with_critic = fast_paths.auto_micro_batch_tokens(free_bytes=70 * GiB, **{**args, "critic_params": 10**9})
    without = fast_paths.auto_micro_batch_tokens(free_bytes=70 * GiB, **args)
    assert (without - with_critic) == pytest.approx(16 * 10**9 / 10**6, abs=1024)  # 16 bytes per critic parameter


def test_resolution_and_the_start_up_line():
    demo = load_config("grpo-demo")  # micro_batch_tokens 4096, vLLM
    on_cpu = fast_paths.resolve(demo.model, demo.rollout, demo.actor, "cpu")
    assert (on_cpu.compile, on_cpu.cuda_graphs, on_cpu.micro_batch_tokens) == (False, False, 4096)
    assert on_cpu.describe() == ("fast paths: torch.compile off (model.compile=auto), vLLM CUDA graphs off "
                                 "(rollout.vllm.enforce_eager=auto), micro-batches of 4096 tokens "
                                 "(actor.micro_batch_tokens=4096)")
    auto = load_config("grpo", ["model.path=m", "data.synthetic_task=echo"])
    on_cpu_auto = fast_paths.resolve(auto.model, auto.rollout, auto.actor, "cpu")
    assert on_cpu_auto.micro_batch_tokens == fast_paths.CPU_MICRO_BATCH_TOKENS
    on_gpu = fast_paths.resolve(auto.model, auto.rollout, auto.actor, "cuda", sized=(46_080, 139.4))
    assert (on_gpu.compile, on_gpu.cuda_graphs, on_gpu.micro_batch_tokens) == (True, True, 46_080)
    assert on_gpu.describe() == ("fast paths: torch.compile on (model.compile=auto), vLLM CUDA graphs on "
                                 "(rollout.vllm.enforce_eager=auto), micro-batches of 46080 tokens "
                                 "(actor.micro_batch_tokens=auto, sized from 139 GiB free)")
    hf = load_config("grpo", ["model.path=m", "data.synthetic_task=echo", "rollout.name=hf", "model.compile=false"])
    assert "torch.compile off (model.compile=false), CUDA graphs n/a (rollout.name=hf)" in \
        fast_paths.resolve(hf.model, hf.rollout, hf.actor, "cuda", sized=(8192, 70.0)).describe()
    sft = load_config("sft", ["model.path=m", "data.train_files=[d.jsonl]"])  # trains on rows: no engine starts
    offline = fast_paths.resolve(sft.model, sft.rollout, sft.actor, "cpu", with_engine=not sft.offline)
    assert offline.cuda_graphs is None and ", no rollout engine, " in offline.describe()


def test_the_policy_worker_sizes_from_its_gpus_free_memory(monkeypatch):
    """PolicyWorker._size_micro_batches with a simulated GPU: the memory free when the worker started less what
    it holds now (its models: not what engines starting meanwhile took), the actor's shard and the config's
    lengths reach the budget; ranks agree on the smallest (MIN all-reduce)."""
    from rlkit.core.train import packing
    from rlkit.core.train.policy_worker import PolicyWorker

    model = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters, standing in for the actor's shard
    model.config = SimpleNamespace(**{**vars(QWEN_05B), "vocab_size": 1000})
    config = load_config("grpo", ["model.path=m", "data.synthetic_task=echo", "data.max_prompt_length=256",
                                  "data.max_response_length=512"])
    worker = SimpleNamespace(config=config, use_cuda=True, device=torch.device("cuda", 0), _free_at_start=48 * GiB)
    actor = SimpleNamespace(module=model)
    reductions = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (20 * GiB, 80 * GiB))  # engines took 20 GiB more
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 8 * GiB)  # the worker's models
    monkeypatch.setattr(packing, "collective_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, op: reductions.append(op))
    tokens, free_gib = PolicyWorker._size_micro_batches(worker, actor, "bfloat16")
    per_token = fast_paths.activation_bytes_per_token(model.config, 2, gradient_checkpointing=False)
    left = 40 * GiB - 12 * 1_001_000 - (8 * GiB + 2 * GiB)
    assert tokens == left // per_token // 1024 * 1024 and free_gib == 40.0
    assert reductions == [torch.distributed.ReduceOp.MIN]
    worker.use_cuda = False
    assert PolicyWorker._size_micro_batches(worker, actor, "bfloat16") is None  # CPU: the fixed default, nothing to size


def test_dry_run_arithmetic_says_the_budget_is_sized_at_start_up():
    config = load_config("grpo", ["model.path=m", "data.synthetic_task=echo"])
    assert any("micro-batches sized at start-up (actor.micro_batch_tokens=auto: from the free GPU memory, "
               "16384 tokens on CPU)" in line for line in batch_arithmetic(config))
