"""`rlkit plan`: hand-computed memory parts, the knob it proposes, the time model against the measured H200
benchmark, and the memory model against what a real CPU update holds.

What is measured (in a policy worker of one rank, in a fresh process, for fp32 and bf16 compute, with
and without gradient checkpointing): (1) the model state: bytes of the actor's (and reference's)
parameter storages, their gradients and AdamW's moments after an update; (2) the activations: the
distinct storages autograd saves for backward during the update of one micro-batch at the plan's
worst-case shape (saved-tensor hooks; parameters excluded), logits included. The plan's numbers for
the same config must be within 25% of each. Process memory (RSS) is not compared: for a 0.3M-parameter
model it is the libraries (~1 GB), not the training state.
"""

from __future__ import annotations

import multiprocessing
import re

import pytest
import torch
import torch.distributed as dist
from conftest import invoke

from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.cli.doctor_cmds import register
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.planning import memory, timing
from rlkit.core.planning.plan import build_plan, checkpoint_bytes
from rlkit.core.planning.shape import model_shape
from rlkit.recipes.loader import load_config

TINY_PARAMS = 337_280  # rlkit:tiny-qwen2
BENCH = ["data.train_batch_size=64", "data.max_prompt_length=256", "data.max_response_length=512", "rollout.n=8",
         "rollout.max_num_seqs=512", "rollout.gpu_memory_utilization=0.35", "actor.mini_batch_size=64",
         "actor.micro_batch_tokens=32768", "actor.use_kl_loss=true", "trainer.device=cuda"]
VARIANTS = [[], ["model.dtype=bfloat16"], ["model.gradient_checkpointing=true"],
            ["model.dtype=bfloat16", "model.gradient_checkpointing=true"]]
MEASURED = ["rollout.name=hf", "actor.use_kl_loss=true", "data.train_batch_size=4", "actor.mini_batch_size=4",
            "rollout.n=4", "data.max_prompt_length=40", "data.max_response_length=24", "actor.micro_batch_tokens=8192"]


@pytest.fixture
def qwen05(tmp_path):
    """A Qwen2.5-0.5B-shaped config.json (the benchmark's model): the plan reads nothing else."""
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True).save_pretrained(tmp_path)
    return str(tmp_path)


def test_the_shape_counts_every_parameter_once() -> None:
    shape = model_shape(resolve_model_path("rlkit:tiny-qwen2"))
    assert shape.params == TINY_PARAMS
    # a layer: q, k, v (with biases), o, gate, up, down, two norms; the root: embeddings (tied) and final norm
    assert shape.layer_params == 3 * (128 * 128 + 128) + 128 * 128 + 3 * 128 * 256 + 2 * 128
    assert shape.root_params == 64 * 128 + 128


def test_memory_parts_by_hand() -> None:
    config = load_config("grpo-demo", ["actor.use_kl_loss=true"])
    shape = model_shape(resolve_model_path("rlkit:tiny-qwen2"))
    batch = memory.micro_batch(config, config.actor.micro_batch_tokens)
    assert (batch.tokens, batch.response_tokens) == (16 * 8 * 17, 16 * 8)  # the whole mini-batch fits 4096 tokens
    mem = memory.training_device(config, shape, 8 * 2**30, on_gpu=False)
    assert mem.parts["actor weights (fp32)"] == mem.parts["actor gradients (fp32)"] == 4 * TINY_PARAMS
    assert mem.parts["AdamW moments (fp32)"] == 8 * TINY_PARAMS
    assert mem.parts["reference weights (fp32)"] == 4 * TINY_PARAMS
    # one rank gathers a copy of the whole model (fp32 compute too); the reference keeps its copy
    assert mem.parts["actor compute copy (fp32)"] == mem.parts["reference compute copy (fp32, kept with one rank)"] \
        == 4 * TINY_PARAMS
    # per token: 2 layers x (44*128 + 16*256 + 4*2 + 8) + 8*128 + 8*64 + 21, and 4*128 per response token
    assert mem.parts["activations (2176 tokens)"] == 2176 * (2 * 9744 + 1024 + 512 + 21) + 128 * 512
    assert mem.parts["logits (128 response tokens)"] == 128 * 64 * 4 + 8 * 128
    assert mem.parts["rollout engine (CPU: weights + KV cache)"] == 4 * TINY_PARAMS + 2**30
    two = memory.training_device(load_config("grpo-demo", ["trainer.n_gpus_per_node=2"]), shape, 2**33, on_gpu=True)
    assert two.parts["AdamW moments (fp32)"] == 4 * TINY_PARAMS  # sharded over 2
    assert two.parts["actor compute copy (bf16)"] == (2 * shape.layer_params + shape.root_params) * 2
    assert checkpoint_bytes(config) == 12 * TINY_PARAMS * 3  # keep_last 2 + the one being written


def test_the_time_model_by_hand_on_the_benchmark(qwen05) -> None:
    """The 0.5B bench (64 prompts x 8, 256 + 512 tokens, 32768-token micro-batches): every phase by hand."""
    config = load_config("grpo", BENCH, model=qwen05, require_inputs=False)
    shape = model_shape(qwen05)
    assert shape.forward_flops(256, 512) == 714_390_634_496  # docs/benchmarks.md's count: 714.5 GFLOP
    time = timing.step_time(config, shape, micro_batch_tokens=32768)
    rate = 800e12 * 0.74  # FLOP/s a pass's matrix products reach
    # 42 sequences of 768 tokens fit 32768: 13 micro-batches of 512 sequences, 41 ms each in a forward
    assert time.phases["ref"] == pytest.approx(512 * 714_390_634_496 / rate + 13 * 0.041)  # 1.151 s
    assert time.phases["update_actor"] == pytest.approx(3 * (512 * 714_390_634_496 / rate + 13 * 0.056))  # 4.038 s
    # a decode step of 512 sequences: 24 layers x 86 us + 512 x 11.7 us + reading the bf16 weights and the
    # KV cache of 512 sequences at 256 + 256 tokens (24 layers x 2 x 2 KV heads x 64 x 2 bytes = 12,288 a token),
    # which takes longer than computing 2 FLOPs a parameter for each (0.855 ms)
    read = (2 * 494_032_768 + 512 * 512 * 12_288) / 4.3e12  # 0.979 ms
    step = 24 * 86e-6 + 512 * 11.7e-6 + read  # 9.033 ms
    prefill = 512 * 256 * 2 * 494_032_768 / rate  # 0.219 s
    # one step in rollout.log_prob_check_freq=10 returns log-probs, from 32 of its 512 samples (one in 16, by seed),
    # which decode at 0.65x the speed
    share = 1 / 16 / 10
    assert time.phases["gen"] == pytest.approx((prefill + 512 * step) * (share / 0.65 + 1 - share))  # 4.860 s
    assert time.phases["sync"] == pytest.approx(0.28 + 4 * 494_032_768 / 47e9)  # 0.322 s
    assert time.phases["reward+adv"] == pytest.approx(0.19)
    assert time.step == pytest.approx(10.56, abs=0.01)
    assert 0.75 < 9.90 / time.step < 1.25  # measured on an H200 (docs/benchmarks.md, 2026-12-01)
    cost = timing.run_cost(config, time.step, 2.0)
    assert cost["gpu_hours"] == pytest.approx(time.step * 100 / 3600) and cost["usd"] == pytest.approx(2 * cost["gpu_hours"])


def test_decode_is_bound_by_compute_when_the_batch_is_large(qwen05) -> None:
    shape = model_shape(qwen05)
    rate = 800e12 * 0.74
    # 4096 sequences at 16 tokens of context: 2 FLOPs a parameter each (6.84 ms) outlasts the read (0.84 ms)
    expected = 24 * 86e-6 + 4096 * 11.7e-6 + 4096 * 2 * 494_032_768 / rate
    assert timing.decode_step_seconds(shape, 4096, 16, 2) == pytest.approx(expected)
    # 1000 sequences, 300 at a time: 4 rounds of 512 steps, the last of 100 sequences still paced as 300
    one = timing.decode_step_seconds(shape, 300, 256 + 256, 2)
    assert timing.generate_seconds(shape, 1000, 300, 256, 512) == pytest.approx(
        1000 * 256 * 2 * 494_032_768 / rate + 4 * 512 * one)


def test_lora_and_checkpointing_change_the_passes_of_the_update(qwen05) -> None:
    shape = model_shape(qwen05)

    def update(*extra: str) -> float:
        config = load_config("grpo", [*BENCH, *extra], model=qwen05, require_inputs=False)
        return timing.step_time(config, shape, micro_batch_tokens=8192).phases["update_actor"]

    # 8192 tokens: 10 sequences a micro-batch, 52 micro-batches of 512 sequences
    one_pass = 512 * 714_390_634_496 / (800e12 * 0.74) + 52 * 0.056
    assert update() == pytest.approx(3 * one_pass)  # forward + backward (2)
    assert update("model.gradient_checkpointing=true") == pytest.approx(4 * one_pass)  # + the recompute
    assert update("model.lora.rank=16") == pytest.approx(2 * one_pass)  # no gradient for the frozen weights
    assert update("model.lora.rank=16", "model.gradient_checkpointing=true") == pytest.approx(3 * one_pass)
    assert update("actor.mini_batch_size=16") == pytest.approx(3 * one_pass)  # 4 x 13 micro-batches, 4 steps
    # the fused head computes the head's logits again in backward: 512 sequences x 512 response tokens x 2 x 896 x
    # 151,936 FLOPs more (the ref and old-log-prob passes, forward only, cost what they cost)
    head_again = 512 * 512 * 2 * 896 * 151_936 / (800e12 * 0.74)  # 0.120 s
    assert update("actor.fused_lm_head=true") == pytest.approx(3 * one_pass + head_again)


def test_a_short_kv_cache_generates_in_rounds(qwen05) -> None:
    config = load_config("grpo", [*BENCH, "rollout.log_prob_check_freq=0"], model=qwen05, require_inputs=False)
    shape = model_shape(qwen05)
    full = timing.step_time(config, shape, micro_batch_tokens=32768)
    short = timing.step_time(config, shape, micro_batch_tokens=32768, kv_tokens=100 * 768 + 5)
    assert full.phases["gen"] == pytest.approx(timing.generate_seconds(shape, 512, 512, 256, 512))
    assert short.phases["gen"] == pytest.approx(timing.generate_seconds(shape, 512, 100, 256, 512))  # 6 rounds
    assert any("holds 100 full-length sequences" in note for note in short.notes)


def test_vllm_replicas_split_the_devices_share_and_each_holds_the_weights(qwen05) -> None:
    shape = model_shape(qwen05)
    gib = 1024**3
    one, two = (
        memory.kv_cache(load_config("grpo", [*BENCH, "rollout.max_num_seqs=256", f"rollout.vllm.replicas={n}"], model=qwen05,
                                    require_inputs=False), shape, 100 * gib, True)
        for n in (1, 2)
    )
    weights = shape.params * 2  # bf16
    assert one["bytes"] == pytest.approx(0.35 * 100 * gib - weights - gib)  # rollout.gpu_memory_utilization 0.35
    assert two["bytes"] == pytest.approx(0.35 * 100 * gib - 2 * (weights + gib))
    assert (one["sequences"], two["sequences"]) == (256, 512)  # rollout.max_num_seqs each; 512 samples a step


def test_the_calibration_is_the_fit_of_the_measured_runs() -> None:
    """bench/plan_time_fit.py refits the constants on the four H200 runs: the table holds them, rounded."""
    import tempfile
    from pathlib import Path

    from bench.plan_time_fit import FITTED, MEASURED, fit, planned

    with tempfile.TemporaryDirectory() as folder:
        items = [planned(run, Path(folder)) for run in MEASURED]
    fitted = fit(items, MEASURED)
    for key in (k for group in FITTED.values() for k in group):
        assert timing.CALIBRATION[key] == pytest.approx(fitted[key], rel=0.02), key


def test_the_benchmark_page_shows_the_calibration_the_code_reads() -> None:
    from conftest import REPO

    text = (REPO / "docs" / "benchmarks.md").read_text().split("## Calibration of `rlkit plan`")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, flags=re.M))
    assert set(rows) == set(timing.CALIBRATION)
    for key, value in timing.CALIBRATION.items():
        if isinstance(value, str):
            assert rows[key] == value
        else:
            numerator, _, denominator = rows[key].partition(" / ")
            assert float(numerator) / float(denominator or 1) == pytest.approx(value), key


def test_a_config_that_does_not_fit_gets_the_knob_that_makes_it_fit(qwen05) -> None:
    config = load_config("grpo", BENCH, model=qwen05, require_inputs=False)  # update: ~70 GiB at 32768 tokens
    plan = build_plan(config, gpu_memory_gib=50)
    assert not plan.fits and plan.memory.peak_phase == "update"
    assert plan.knobs[0] == "model.gradient_checkpointing=true"
    assert plan.knobs[1].startswith("actor.micro_batch_tokens=")
    budget = int(plan.knobs[1].split("=")[1].split()[0])
    assert build_plan(load_config("grpo", [*BENCH, f"actor.micro_batch_tokens={budget}"], model=qwen05,
                                  require_inputs=False), gpu_memory_gib=50).fits
    assert build_plan(load_config("grpo", [*BENCH, "model.gradient_checkpointing=true"], model=qwen05,
                                  require_inputs=False), gpu_memory_gib=50).fits
    squeezed = build_plan(load_config("grpo", [*BENCH, "rollout.gpu_memory_utilization=0.95"], model=qwen05,
                                      require_inputs=False), gpu_memory_gib=80)
    # The sync holds the engine's share and one gathered fp32 tensor: the 151936 x 896 embedding, 0.51 GiB.
    assert not squeezed.fits and squeezed.memory.peak_phase == "sync"
    # state: 16 + 4 (reference) + 2 (its bf16 copy) bytes x 494.0M = 10.12 GiB, + 0.51 GiB;
    # (80 - 1.5 - 10.63) / 80 = 0.848, less a 0.01 margin
    assert squeezed.knobs[0] == "rollout.gpu_memory_utilization=0.84 (now 0.95)"


def test_the_plan_command_prints_verdict_time_and_cost(qwen05) -> None:
    result = invoke(register, "plan", "grpo", *BENCH, "--model", qwen05, "--usd-per-gpu-hour", "3",
                    "--gpu-memory-gib", "140")
    assert result.exit_code == 0, result.output
    assert "494.0M parameters (24 layers, hidden 896, vocabulary 151936)" in result.output
    assert "-> fits: update needs" in result.output
    assert "trainer.total_steps=100: ~0.29 h on 1 device(s) = 0.29 GPU-hours, ~$0.88 at $3/GPU-hour" in result.output
    too_small = invoke(register, "plan", "grpo", *BENCH, "--model", qwen05, "--gpu-memory-gib", "40")
    assert too_small.exit_code == 1 and "does not fit" in too_small.output and "turn: " in too_small.output


def test_a_cpu_run_is_not_priced_as_gpu_time(qwen05) -> None:
    """The time model's constants are an H200's: a CPU run gets its memory verdict and no time or cost."""
    result = invoke(register, "plan", "grpo", *BENCH, "--model", qwen05, "trainer.device=cpu", "--usd-per-gpu-hour",
                    "3")
    assert result.exit_code in (0, 1), result.output
    assert "time: not predicted for a CPU run (the time model is calibrated on" in result.output
    assert "time per step" not in result.output and "GPU-hours" not in result.output and "$" not in result.output


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _storages(tensors) -> dict[int, int]:
    """Distinct storages (address -> bytes) behind `tensors` (a DTensor's local shard)."""
    return {_local(t).untyped_storage().data_ptr(): _local(t).untyped_storage().nbytes() for t in tensors}


def _measure_all(folder: str) -> None:
    """In a fresh process (no process group yet): every variant in turn."""
    torch.save({tuple(overrides): _measure(overrides) for overrides in VARIANTS}, f"{folder}/measured.pt")


def _measure(overrides: list[str]) -> dict[str, int]:
    """One update at the plan's worst-case micro-batch: state and saved-activation bytes."""
    from rlkit.core.batch import Batch, build_batch
    from rlkit.core.cluster.device_worker import free_port
    from rlkit.core.data.dataset import PromptRow
    from rlkit.core.rollout.base import RolloutSample
    from rlkit.core.rollout.trajectory import Trajectory
    from rlkit.core.train.policy_worker import PolicyWorker

    config = load_config("grpo-demo", [*MEASURED, *overrides])
    data = config.data
    worker = PolicyWorker(config, str(resolve_model_path("rlkit:tiny-qwen2")), 0, 1)
    worker.setup("127.0.0.1", free_port(), False)
    try:
        samples = [Trajectory.single_turn(PromptRow(i, [5 + i % 40] * data.max_prompt_length, "x", "y"), i // 4,
                                          RolloutSample(i, [6] * data.max_response_length, [], finished=False))
                   for i in range(16)]
        batch = build_batch(samples, pad_id=0)
        batch["advantages"] = torch.linspace(-1, 1, 16)[:, None] * batch["response_mask"]
        sharded = {m: _storages(m.parameters()) for m in (worker.actor.model.module, worker.actor.model.base)}  # before any forward
        batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
        worker.actor_log_probs(batch)  # as a step's old-log-prob pass: the actor gathers its copy
        # With one rank a module keeps its gathered compute-dtype parameters after forward (until its backward).
        copies = {m: {k: v for k, v in _storages(m.parameters()).items() if k not in sharded[m]}
                  for m in (worker.actor.model.module, worker.actor.model.base)}
        keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages",
                "ref_log_probs"]
        weights = set().union(*sharded.values(), *copies.values())
        saved: dict[int, int] = {}

        def keep(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        mask = batch["response_mask"]
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            worker.update_actor([Batch({k: batch[k] for k in keys})],
                                [{"num_tokens": float(mask.sum()), "num_seqs": float(len(batch))}],
                                UpdateInputs(old_log_probs_from_update=True, rollout_log_probs=False,
                                             rollout_correction=None, reference=True))
        actor, reference = worker.actor.model.module, worker.actor.model.base
        moments = [v for state in worker.actor.model.optimizer.state.values() for v in state.values() if v.dim() > 0]
        state = {"weights": sum(sharded[actor].values()),
                 "gradients": sum(_storages(p.grad for p in actor.parameters()).values()),
                 "moments": sum(_storages(moments).values()), "actor_copy": sum(copies[actor].values()),
                 "reference": sum(sharded[reference].values()) + sum(copies[reference].values()),
                 "saved": sum(saved.values())}
    finally:
        dist.destroy_process_group()
    return state


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[tuple[str, ...], dict[str, int]]:
    folder = tmp_path_factory.mktemp("measured")
    process = multiprocessing.get_context("spawn").Process(target=_measure_all, args=(str(folder),))
    process.start()
    process.join(timeout=300)
    assert process.exitcode == 0
    return torch.load(folder / "measured.pt")


@pytest.mark.parametrize("overrides", VARIANTS)
def test_plan_matches_a_measured_cpu_update_within_25_percent(measured, overrides) -> None:
    measured = measured[tuple(overrides)]
    print(overrides, measured)
    config = load_config("grpo-demo", [*MEASURED, *overrides])
    shape = model_shape(resolve_model_path("rlkit:tiny-qwen2"))
    mem = memory.training_device(config, shape, 8 * 2**30, on_gpu=False)
    parts = mem.parts
    batch = memory.micro_batch(config, config.actor.micro_batch_tokens)
    assert (batch.tokens, batch.response_tokens) == (16 * 64, 16 * 24)  # the worst-case batch measured
    planned_state = parts["actor weights (fp32)"] + parts["actor gradients (fp32)"] + parts["AdamW moments (fp32)"]
    got_state = measured["weights"] + measured["gradients"] + measured["moments"]
    assert abs(got_state - planned_state) <= 0.25 * got_state, (got_state, planned_state)
    planned_reference = sum(v for k, v in parts.items() if k.startswith("reference"))
    assert abs(measured["reference"] - planned_reference) <= 0.25 * measured["reference"]
    assert measured["actor_copy"] == parts[f"actor compute copy ({'bf16' if 'model.dtype=bfloat16' in overrides else 'fp32'})"]
    compute = memory.compute_bytes(config, on_gpu=False)
    planned = memory.activation_bytes(shape, batch, compute, config.model.gradient_checkpointing)["saved"] \
        + memory.logits_bytes(shape, batch, compute)["logits"]
    assert abs(measured["saved"] - planned) <= 0.25 * measured["saved"], (measured["saved"], planned)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_the_lora_count_is_what_peft_trains(targets) -> None:
    from rlkit.core.train import adapters, fsdp
    from rlkit.recipes.schema import LoraSettings

    path = resolve_model_path("rlkit:tiny-qwen2")
    model = adapters.add_lora(fsdp.load_model(path), LoraSettings(rank=4, target_modules=targets), seed=0)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert model_shape(path).lora_params(4, targets) == trained


def test_with_lora_the_base_is_frozen_and_is_the_reference(qwen05) -> None:
    config = load_config("grpo", [*BENCH, "model.lora.rank=16"], model=qwen05, require_inputs=False)
    parts = build_plan(config, gpu_memory_gib=140).memory.parts
    # per layer r x (in + out): q and o 16 x (896 + 896), k and v 16 x (896 + 128), gate/up/down 16 x (896 + 4864)
    adapters = 24 * (2 * 28_672 + 2 * 16_384 + 3 * 92_160)
    assert adapters == 8_798_208
    assert parts["base weights (fp32, frozen; also the reference)"] == 4 * 494_032_768
    assert parts["LoRA adapters, gradients, AdamW (fp32, 8.8M)"] == 16 * adapters
    assert not any(k.startswith(("reference", "actor weights", "AdamW")) for k in parts)


def test_an_auto_token_budget_is_sized_as_a_gpu_worker_sizes_it(qwen05) -> None:
    config = load_config("grpo", [*BENCH, "actor.micro_batch_tokens=auto"], model=qwen05, require_inputs=False)
    parts = build_plan(config, gpu_memory_gib=140).memory.parts
    # free once the fp32 actor and reference are loaded: 140 - 1.5 GiB - 8P; less 12P (gradients, AdamW) and the
    # reserve (10% + 2 GiB = 16 GiB): 121,652,718,080 bytes. Per token (bf16): 24 layers x (2 x (18 x 896 + 4 x 4864
    # + 6 x 128) + 16 x 896) + 2 x 2 x 151936 = 2,696,704 bytes -> 45,111 tokens, in 1024s: 45,056.
    # (An H200 worker with 134 GiB free sized 44,032, docs/benchmarks.md.)
    assert "activations (45056 tokens)" in parts


def test_the_fused_head_holds_a_chunk_of_logits_and_a_larger_auto_budget(qwen05) -> None:
    config = load_config("grpo-demo", ["actor.use_kl_loss=true", "actor.fused_lm_head=true"])
    mem = memory.training_device(config, model_shape(resolve_model_path("rlkit:tiny-qwen2")), 8 * 2**30, on_gpu=False)
    # 128 response tokens of a 64-token vocabulary, fp32: one chunk (all 128) of logits (4 bytes) and its two fp32
    # buffers (8), 8 bytes of statistics a token; the tied head's gradient (64 x 128) in fp32 beside a chunk's fp32
    # product. No logits part.
    assert mem.parts["fused head chunks (128 response tokens)"] == 128 * 64 * 12 + 8 * 128
    assert mem.parts["head weight gradient, summed in fp32 (128 response tokens)"] == 64 * 128 * 8
    assert not any(name.startswith("logits") for name in mem.parts)
    # The benchmark's auto budget without the head's 607,744 bytes a token: 121,652,718,080 / 2,088,960 = 58,236
    # tokens, in 1024s: 57,344 (45,056 unfused).
    config = load_config("grpo", [*BENCH, "actor.micro_batch_tokens=auto", "actor.fused_lm_head=true"], model=qwen05,
                         require_inputs=False)
    assert "activations (57344 tokens)" in build_plan(config, gpu_memory_gib=140).memory.parts


def test_an_auto_budget_counts_the_critic_once(qwen05) -> None:
    # PPO's critic (same shape, 16 bytes a parameter) is taken off the free memory once, as the worker does:
    # 121,652,718,080 - 16 x 494,032,768 = 113,748,193,792 bytes / 2,696,704 per token = 42,180 -> 41,984.
    # Counted twice (as the plan did by matching "weights" in its part names) it would be 38,912.
    config = load_config("ppo", [*BENCH, "actor.micro_batch_tokens=auto"], model=qwen05, require_inputs=False)
    assert "activations (41984 tokens)" in build_plan(config, gpu_memory_gib=140).memory.parts
