"""The trainer's compile warm-up (rlkit.core.train.warmup): its batch, what it may hold, that it changes nothing of
the run, and that with model.compile the step's passes after it compile nothing new."""

from __future__ import annotations

import json

import pytest
import torch
from test_checkpoint_shards import process_group  # noqa: F401 (a fixture)
from test_packing import padded_batch

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.train import compiled, fsdp, logprobs, packing, warmup
from rlkit.core.train.model import TrainableModel, build_policy
from rlkit.recipes.loader import load_config

# KL in the loss (a reference pass), an entropy bonus (the update differentiates the entropy), weight decay (the
# still optimizer step multiplies each weight by exactly 1)
OVERRIDES = ["actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "actor.weight_decay=0.1"]


def test_the_warm_up_batch_is_two_sequences_laid_end_to_end():
    packed = packing.pack(warmup.dummy_batch(vocab_size=64))
    # (prompt, response) = (7, 16) and (9, 21): 23 + 30 = 53 tokens, 16 + 21 = 37 response tokens
    assert packed.input_ids.shape == (1, 53) and packed.cu_seq_lens.tolist() == [0, 23, 53] and packed.max_len == 30
    assert packed.targets.shape == (37,) and packed.shape == (2, 21)
    assert packed.position_ids[0, :3].tolist() == [0, 1, 2] and packed.position_ids[0, 23].item() == 0
    assert 1 <= packed.input_ids.min() and packed.input_ids.max() < 64  # real tokens, never the pad id 0
    assert packed.predict_index[:2].tolist() == [6, 7]  # the first response token follows a 7-token prompt


def test_the_warm_up_holds_the_gradients_the_gathered_layers_its_activations_and_the_compiles_headroom():
    # gradients of 32 bytes of trainable fp32 shard, AdamW's two moments 64; 12 elements gathered in bf16: 24;
    # 53 tokens x 10 = 530
    expected = 32 + 64 + 24 + 530 + warmup.COMPILE_HEADROOM_BYTES
    assert warmup.warm_up_bytes(32, 12, activation_bytes_per_token=10, compute_dtype_bytes=2) == expected


def test_the_models_parameters_are_counted_without_building_them(tmp_path):
    """The load's bytes are known before the load (it may run beside the engine's start): each parameter's
    elements from the model built on the meta device, a tied head counted once, as the loaded model holds it."""
    path = str(resolve_model_path("rlkit:tiny-qwen2"))
    numels = warmup.meta_numels(path)
    loaded = fsdp.load_model(path)
    assert numels == {name: p.numel() for name, p in loaded.named_parameters()}


def _policy(overrides: list[str]):
    config = load_config("grpo-demo", overrides)
    algorithm = Algorithm.from_config(config)
    path = str(resolve_model_path("rlkit:tiny-qwen2"))
    torch.manual_seed(0)
    model = build_policy(config.model, config.actor, algorithm, path, torch.device("cpu"), seed=0, total_updates=2)
    return model, algorithm


def _warm_up(model, algorithm) -> None:
    warmup.warm_up_passes(
        model,
        torch.device("cpu"),
        temperature=0.7,
        fused_head=False,
        old_log_probs=not algorithm.old_log_probs_from_update,
        reference=algorithm.reference,
        entropy_grad="entropy" in algorithm.loss_terms,
    )


def test_the_warm_up_leaves_out_the_old_log_prob_pass_where_the_run_has_none(process_group, monkeypatch):  # noqa: F811
    """Each pass compiles graphs of its own: one the run never makes only lengthens the start it runs beside."""
    model, algorithm = _policy(OVERRIDES)
    passes: list[tuple[str, bool]] = []
    real = fsdp.packed_log_probs

    def noted(module, packed, **options):
        passes.append(("actor" if module is model.module else "reference", torch.is_grad_enabled()))
        return real(module, packed, **options)

    monkeypatch.setattr(fsdp, "packed_log_probs", noted)
    for old_log_probs in (False, True):
        warmup.warm_up_passes(model, torch.device("cpu"), temperature=0.7, fused_head=False,
                              old_log_probs=old_log_probs, reference=True, entropy_grad=True)
    assert passes == [("reference", False), ("actor", True), ("actor", False), ("reference", False), ("actor", True)]


def _step(model, batch=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One update on a real batch: its log-probs, then the weights after the optimizer step. Its loss weighs each
    token, as a policy loss does (advantages): the gradients reach the log-prob kernels as dense tensors."""
    if batch is None:
        batch = padded_batch([[5, 6, 7, 8, 9], [9, 10, 11]], [[14, 15, 16, 17], [17, 18]], prompt_width=5,
                             response_width=4)
    model.module.train()
    log_probs, entropy = fsdp.packed_log_probs(
        model.module, packing.pack(batch), temperature=0.7, with_entropy=True, fused_head=False, entropy_grad=True
    )
    advantages = torch.linspace(-1.0, 1.0, log_probs.numel()).view_as(log_probs)
    (-(advantages * log_probs).sum() - 0.01 * (entropy * torch.ones_like(entropy)).sum()).backward()
    model.optimizer.step()
    return log_probs.detach(), {name: p.detach().clone() for name, p in model.module.named_parameters()}


def test_the_warm_up_changes_nothing_a_run_computes(process_group):  # noqa: F811
    """No optimizer step, no gradient left, the RNG streams and the module's mode as they were: the next update
    is bit for bit the one a model that never warmed up makes."""
    model, algorithm = _policy(OVERRIDES)
    assert algorithm.reference and "entropy" in algorithm.loss_terms
    weights = {name: p.detach().clone() for name, p in model.module.named_parameters()}
    model.module.eval()
    rng = torch.get_rng_state()
    rates = [group["lr"] for group in model.optimizer.param_groups]
    assert rates[0] > 0 and model.optimizer.param_groups[0]["weight_decay"] > 0  # a step at rate 0 moves nothing
    _warm_up(model, algorithm)
    assert torch.equal(torch.get_rng_state(), rng) and not model.module.training
    assert all(p.grad is None for p in model.module.parameters()) and not model.optimizer.state
    assert [group["lr"] for group in model.optimizer.param_groups] == rates
    assert all(torch.equal(p, weights[name]) for name, p in model.module.named_parameters())
    warmed = _step(model)
    fresh = _step(_policy(OVERRIDES)[0])
    assert torch.equal(warmed[0], fresh[0])
    assert all(torch.equal(warmed[1][name], fresh[1][name]) for name in fresh[1])


@pytest.mark.slow
@pytest.mark.parametrize("old_log_probs", ["auto", "recompute"])  # auto: the update's own (one optimizer step)
def test_with_compiled_layers_the_passes_after_the_warm_up_compile_nothing_new(
    process_group,  # noqa: F811
    monkeypatch,
    old_log_probs,
):
    """model.compile=true compiles each decoder layer and the log-prob kernels with dynamic shapes: after the warm-up
    on its two short sequences, a step's passes on other lengths (three sequences) find every graph compiled, the
    log-prob kernels' backward included, whose gradients come dense from a loss that weighs tokens (a warm-up that
    summed them left that backward to step 1: 21 graphs against 20). The step's 9 response tokens are cut in chunks
    of 2 (2 + 2 + 2 + 2 + 1), as a real vocabulary cuts a real batch: a warm-up whose tokens were one chunk left the
    kernels to compile again at the first batch of several (its chunk was as long as the logits it was cut from).
    dynamo's eager backend keeps the test quick: what is checked is dynamo's tracing and guards, whatever compiles
    the graphs after. The actor's no-grad pass (old log-probs) runs, and is warmed, only where the algorithm has
    that pass (actor.old_log_probs=recompute); the reference's always here (a KL loss). (16 s on the 2-core
    machine, each.)"""
    from torch._dynamo.utils import counters

    compile_with, calls = torch.compile, []

    def eager_compile(fn, **options):
        calls.append(options)
        return compile_with(fn, backend="eager", **options)

    monkeypatch.setattr(torch, "compile", eager_compile)
    torch._dynamo.reset()
    model, algorithm = _policy(OVERRIDES + ["model.compile=true", f"actor.old_log_probs={old_log_probs}"])
    # every layer (the actor's and the reference's) and both log-prob kernels through rlkit.core.train.compiled:
    # dynamic, without the mix-order reduction's size guards
    assert len(calls) >= model.module.config.num_hidden_layers + 2
    assert all(c == {"dynamic": True, "options": compiled.inductor_options()} for c in calls)
    assert algorithm.old_log_probs_from_update == (old_log_probs == "auto")
    _warm_up(model, algorithm)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0  # the warm-up compiled
    batch = padded_batch(
        [[5, 6, 7, 8, 9, 10], [9, 10, 11], [3, 4, 5, 6]],
        [[14, 15, 16, 17, 18], [17, 18], [20, 21]],
        prompt_width=6,
        response_width=5,
    )
    packed = packing.pack(batch)
    vocab = model.module.config.get_text_config().vocab_size
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 2 * vocab)
    with torch.no_grad():
        model.module.eval()
        if not algorithm.old_log_probs_from_update:
            fsdp.packed_log_probs(model.module, packed, temperature=0.7, with_entropy=True, fused_head=False)
        with model.reference() as base:
            fsdp.packed_log_probs(base, packed, temperature=0.7, with_entropy=False, fused_head=False)
    _step(model, batch)
    assert counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()


def test_a_run_with_compiled_layers_warms_its_passes_up_once_during_set_up(tmp_path, monkeypatch):
    """model.compile=true: the policy worker hands the model's load and the warm-up to the engine's start (the HF
    engine runs them before its start), and step 1's start-up metrics carry their times. torch.compile is left
    out (the test is the wiring)."""
    from test_recipes_e2e import IN_PROCESS, TINY_WORLD

    from rlkit.core.controller.loop import train_run
    from rlkit.core.rollout import generator

    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    calls: list[dict] = []
    warm_up = warmup.warm_up_passes
    monkeypatch.setattr(warmup, "warm_up_passes", lambda *a, **k: calls.append(k) or warm_up(*a, **k))
    make_engine = generator.make_engine
    handed: list = []
    monkeypatch.setattr(
        generator, "make_engine", lambda *a, **k: handed.append(k["beside_start"]) or make_engine(*a, **k)
    )
    config = load_config(
        "grpo-demo",
        [
            *TINY_WORLD,
            *IN_PROCESS,
            "model.compile=true",
            "trainer.total_steps=1",
            f"trainer.runs_dir={tmp_path}",
            *OVERRIDES,
        ],
    )
    lines = (train_run(config, run_id="warm") / "metrics.jsonl").read_text().splitlines()
    first_step = next(row for row in map(json.loads, lines) if row["step"] == 1)
    assert calls == [
        dict(temperature=config.log_prob_temperature, fused_head=False,
             old_log_probs=not Algorithm.from_config(config).old_log_probs_from_update, reference=True,
             entropy_grad=True)
    ]
    assert handed[0].what == "the trainer's model load and compile warm-up" and handed[0].ran_beside is False
    assert 0 < first_step["startup/compile_warmup_s"] < first_step["startup/workers_setup_s"]
    assert 0 < first_step["startup/model_load_s"] < first_step["startup/workers_setup_s"]
