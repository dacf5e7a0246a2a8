"""actor.fused_lm_head: the LM head and the log-softmax computed together a chunk of tokens at a time
(rlkit.core.train.logprobs.LinearSelectedLogProbs) give what the full logits and SelectedLogProbs give:
log-probs, entropy and the gradients of the head's input and weight."""

from __future__ import annotations

import math

import pytest
import torch
from test_packing import padded_batch

from rlkit.core.train import fsdp, logprobs, packed_attention, packing

LN2 = math.log(2)


def _unfused(hidden, weight, targets, temperature, with_entropy):
    logits = torch.nn.functional.linear(hidden, weight)  # what the head computes: [K, V]
    return logprobs.selected_log_probs(logits, targets, temperature, with_entropy=with_entropy)


def _fused(hidden, weight, targets, temperature, with_entropy):
    return logprobs.linear_selected_log_probs(hidden, weight, targets, temperature, with_entropy=with_entropy)


def _outputs_and_grads(compute, dtype, tied, temperature, with_entropy, entropy_in_loss):
    """log-probs, entropy and d(loss)/d(hidden source), d(loss)/d(weight) of one pass of `compute`."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(7, 4, generator=generator).to(dtype).requires_grad_()
    source = torch.randn(10, 4, generator=generator).to(dtype).requires_grad_()
    ids = torch.randint(0, 7, (10,), generator=generator)
    targets = torch.randint(0, 7, (10,), generator=generator)
    # A tied head: the same weight is also the embedding the hidden states come from, so its gradient has two parts.
    hidden = source + weight[ids] if tied else source * 1.0
    log_probs, entropy = compute(hidden, weight, targets, temperature, with_entropy)
    weights_lp = torch.randn(10, generator=generator)
    loss = (log_probs * weights_lp).sum()
    if entropy_in_loss:
        loss = loss + (entropy * torch.randn(10, generator=generator)).sum()
    grad_source, grad_weight = torch.autograd.grad(loss, (source, weight))
    return log_probs.detach(), entropy.detach(), grad_source, grad_weight


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy, entropy_in_loss", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("tied", [False, True])
def test_the_fused_head_gives_the_full_logits_numbers(
    monkeypatch, dtype, tolerance, temperature, with_entropy, entropy_in_loss, tied
):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 3 * 7)  # 3 tokens a chunk: 10 tokens are 4 chunks, one short
    case = (dtype, tied, temperature, with_entropy, entropy_in_loss)
    fused, unfused = _outputs_and_grads(_fused, *case), _outputs_and_grads(_unfused, *case)
    for name, got, want in zip(("log-probs", "entropy", "grad hidden", "grad weight"), fused, unfused):
        assert got.dtype == want.dtype, name
        # Relative to the largest value: bf16 rounds the weight's gradient once per chunk here, once in all there
        # (measured: log-probs, entropy and the hidden gradient bit-equal in bf16, the weight's within 2.1e-3).
        assert (got.float() - want.float()).abs().max() <= tolerance * want.float().abs().max(), name
    if not with_entropy:
        assert fused[1].eq(0).all()


def test_a_hand_computed_head():
    # One token, H = 2, V = 3. hidden h = [1, 2]; weight rows [0, 0], [2, -1], [ln 2, 0] give the logits
    # z = [0, 2 - 2, ln 2] = [0, 0, ln 2]: exp(z) = [1, 1, 2], p = [1/4, 1/4, 1/2].
    # Target 2: log p = ln(1/2) = -ln 2. Entropy = 2 x (1/4) ln 4 + (1/2) ln 2 = 1.5 ln 2.
    # d log p / dz = onehot - p = [-1/4, -1/4, 1/2];
    #   d/dh = weight^T (dz) = [0 - 2/4 + ln2/2, 0 + 1/4 + 0] = [(ln 2 - 1) / 2, 1/4];
    #   d/dweight = dz h^T = [[-1/4, -1/2], [-1/4, -1/2], [1/2, 1]].
    # dH / dz = -p (z - sum p z) with sum p z = ln2 / 2:
    #   -[1/4 (-ln2/2), 1/4 (-ln2/2), 1/2 (ln2/2)] = [ln2/8, ln2/8, -ln2/4];
    #   d/dh = [0 + 2 ln2/8 - ln2 x ln2/4, 0 - ln2/8 + 0]; d/dweight = dH/dz h^T.
    hidden = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[0.0, 0.0], [2.0, -1.0], [LN2, 0.0]], dtype=torch.float64, requires_grad=True)
    log_probs, entropy = logprobs.linear_selected_log_probs(hidden, weight, torch.tensor([2]), with_entropy=True)
    assert log_probs.item() == pytest.approx(-LN2, abs=1e-6)
    assert entropy.item() == pytest.approx(1.5 * LN2, abs=1e-6)
    grad_hidden, grad_weight = torch.autograd.grad(log_probs.sum(), (hidden, weight), retain_graph=True)
    assert grad_hidden.flatten().tolist() == pytest.approx([(LN2 - 1) / 2, 0.25], abs=1e-6)
    assert grad_weight.flatten().tolist() == pytest.approx([-0.25, -0.5, -0.25, -0.5, 0.5, 1.0], abs=1e-6)
    grad_hidden, grad_weight = torch.autograd.grad(entropy.sum(), (hidden, weight))
    assert grad_hidden.flatten().tolist() == pytest.approx([LN2 / 4 - LN2 * LN2 / 4, -LN2 / 8], abs=1e-6)
    dz = [LN2 / 8, LN2 / 8, -LN2 / 4]
    assert grad_weight.flatten().tolist() == pytest.approx([dz[0], 2 * dz[0], dz[1], 2 * dz[1], dz[2], 2 * dz[2]],
                                                           abs=1e-6)


def test_a_frozen_head_gets_no_gradient_and_no_pass_builds_a_graph():
    """LoRA (the head is not an adapter target) and the reference: the weight needs no gradient; log-prob passes
    run without gradients at all."""
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(7, 4)
    targets = torch.randint(0, 7, (5,))
    log_probs, _ = logprobs.linear_selected_log_probs(hidden, weight, targets)
    grad_hidden, = torch.autograd.grad(log_probs.sum(), hidden)
    want, = torch.autograd.grad(_unfused(hidden, weight, targets, 1.0, False)[0].sum(), hidden)
    torch.testing.assert_close(grad_hidden, want)
    with torch.no_grad():
        log_probs, entropy = logprobs.linear_selected_log_probs(hidden, weight, targets, 0.5, with_entropy=True)
    assert log_probs.grad_fn is None and entropy.grad_fn is None


def _tiny_model(tiny_model_dir, tied: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)  # an untied head is initialised fresh (the checkpoint ties it)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, tie_word_embeddings=tied,
                                                attn_implementation=packed_attention.register())


@pytest.mark.parametrize("tied", [True, False])
def test_a_model_pass_with_the_fused_head_gives_the_same_log_probs_and_gradients(monkeypatch, tiny_model_dir, tied):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 2 * 64)  # 2 tokens a chunk over the tiny vocabulary of 64
    model = _tiny_model(tiny_model_dir, tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    batch = padded_batch([[5, 6, 7, 8], [9, 10], [11, 12, 13]], [[14, 15, 16], [17], [18, 19]],
                         prompt_width=4, response_width=3)
    packed = packing.pack(batch)
    results = {}
    for fused in (False, True):
        model.zero_grad()
        log_probs, entropy = fsdp.packed_log_probs(model, packed, temperature=0.7, with_entropy=True, fused_head=fused,
                                                   entropy_grad=True)
        ((log_probs * torch.linspace(-1, 1, 6)).sum() + 0.1 * entropy.sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results[fused] = (log_probs.detach(), entropy.detach(), grads)
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-5, atol=1e-5)
    for name, grad in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # The head is the model's own again after the pass: plain forwards give logits.
    assert model(input_ids=packed.input_ids).logits.shape[-1] == 64


@pytest.mark.parametrize("fused", [False, True])
def test_an_entropy_the_loss_does_not_differentiate_costs_no_entropy_term(monkeypatch, tiny_model_dir, fused):
    """The update reads the entropy as a metric only (no entropy bonus): it comes back detached, and backward
    runs the chunk kernel without the entropy term (the fused head's stack would otherwise pass zeros)."""
    model = _tiny_model(tiny_model_dir, tied=True)
    calls = []
    grad_kernel = logprobs._kernels["grad"]
    monkeypatch.setitem(logprobs._kernels, "grad", lambda *args: calls.append(args[-2]) or grad_kernel(*args))
    packed = packing.pack(padded_batch([[5, 6]], [[7, 8]], prompt_width=2, response_width=2))
    log_probs, entropy = fsdp.packed_log_probs(model, packed, temperature=1.0, with_entropy=True, fused_head=fused)
    assert entropy.abs().sum() > 0 and not entropy.requires_grad
    log_probs.sum().backward()
    assert calls == [False]  # one chunk, with_entropy off


def test_heads_the_fused_path_cannot_stand_in_for(tiny_model_dir):
    model = _tiny_model(tiny_model_dir, tied=True)
    assert fsdp.fused_head_problem(model) is None
    model.config.final_logit_softcapping = 30.0
    assert fsdp.fused_head_problem(model) == "it changes its logits after the head (final_logit_softcapping=30.0)"
    model.config.final_logit_softcapping = None
    model.lm_head = torch.nn.Linear(128, 64, bias=True)
    assert fsdp.fused_head_problem(model) == "its output head has a bias"
    model.lm_head = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False))
    assert fsdp.fused_head_problem(model) == ("its output head is a torch.nn.modules.container.Sequential, not a plain "
                                              "torch.nn.Linear (LoRA on lm_head?)")


def _updates_with_and_without(folder: str) -> None:
    """In a fresh process (a world of one, gloo): for the full and a LoRA actor, the reference's and the actor's
    log-probs and one update, with actor.fused_lm_head off and on, each from the same start."""
    import torch.distributed as dist
    from test_old_log_probs import WITH_PASS, _batch, _parameters, _update

    from rlkit.core.cluster.device_worker import free_port
    from rlkit.core.state.run_dir import resolve_model_path
    from rlkit.core.train.policy_worker import PolicyWorker
    from rlkit.recipes.loader import load_config

    logprobs.CHUNK_ELEMENTS = 3 * 64  # 3 tokens a chunk of the tiny vocabulary: several chunks a micro-batch
    common = ["rollout.name=hf", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1", "actor.entropy_coeff=0.01",
              "rollout.temperature=0.7", "data.train_batch_size=4", "actor.mini_batch_size=4", "rollout.n=2",
              "actor.micro_batch_tokens=32", "actor.lr=1e-3"]
    model_path, out = str(resolve_model_path("rlkit:tiny-qwen2")), {}
    for lora in (False, True):
        for fused in (False, True):
            overrides = common + [f"actor.fused_lm_head={str(fused).lower()}"]
            overrides += ["model.lora.rank=4"] if lora else []
            worker = PolicyWorker(load_config("grpo-demo", overrides), model_path, 0, 1)
            worker.setup("127.0.0.1", free_port(), with_engine=False)
            try:
                batch = _batch()
                batch["ref_log_probs"] = worker.reference_log_probs(batch)["log_probs"]
                old = worker.actor_log_probs(batch)
                batch["old_log_probs"] = old["log_probs"]
                before = _parameters(worker)
                metrics = _update(worker, batch, WITH_PASS)
                grads = {name: p.grad.clone() for name, p in worker.actor.model.module.named_parameters()
                         if p.grad is not None}  # the mini-batch's (clipped) gradient, left after the step
                step = {name: value - before[name] for name, value in _parameters(worker).items()}
                out[lora, fused] = dict(ref=batch["ref_log_probs"], old=old, metrics=metrics, grads=grads, step=step)
            finally:
                dist.destroy_process_group()
    torch.save(out, f"{folder}/out.pt")


@pytest.mark.slow
def test_an_actor_update_with_the_fused_head_is_the_same_update(tmp_path):
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(target=_updates_with_and_without, args=(str(tmp_path),))
    process.start()
    process.join(timeout=300)
    assert process.exitcode == 0
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    for lora in (False, True):
        plain, fused = out[lora, False], out[lora, True]
        torch.testing.assert_close(fused["ref"], plain["ref"], rtol=0, atol=1e-5)
        for key in ("log_probs", "entropy"):
            torch.testing.assert_close(fused["old"][key], plain["old"][key], rtol=0, atol=1e-5)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/pg_clipfrac"):
            assert abs(fused["metrics"][key] - plain["metrics"][key]) < 1e-5, (lora, key)
        assert plain["metrics"]["actor/grad_norm"] > 0
        assert plain["grads"].keys() == fused["grads"].keys() and any(".lora_" in k for k in plain["grads"]) == lora
        for name, grad in plain["grads"].items():
            assert (fused["grads"][name] - grad).abs().max() <= 1e-5 * grad.abs().max(), (lora, name)
        # AdamW's first step is about lr x sign(gradient): an element whose gradient is near 0 moves by a fraction of
        # lr that rounding decides. Measured: within 0.7% of lr = 1e-3 (element-wise), both ways.
        for name, step in plain["step"].items():
            assert (fused["step"][name] - step).abs().max() <= 0.02 * 1e-3, (lora, name)


def test_sft_with_the_fused_head_is_refused(tmp_path):
    from typer.testing import CliRunner

    from rlkit.cli.main import app

    result = CliRunner().invoke(app, ["train", "sft", "--model", "rlkit:tiny-qwen2", "actor.fused_lm_head=true",
                                      f"data.train_files=[{tmp_path / 'x.parquet'}]"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert ("actor.fused_lm_head (command line): objective sft reports its token accuracy from the full logits, "
            "which the fused head never forms; set actor.fused_lm_head=false") in " ".join(result.output.split())


def test_an_adapter_on_the_head_is_refused_before_the_model_is_sharded():
    from rlkit.core.algos.algorithm import Algorithm
    from rlkit.core.state.run_dir import resolve_model_path
    from rlkit.core.train.model import build_policy
    from rlkit.errors import ConfigError
    from rlkit.recipes.loader import load_config

    config = load_config("grpo-demo", ["actor.fused_lm_head=true", "model.lora.rank=4",
                                       "model.lora.target_modules=[q_proj, lm_head]"])
    path = str(resolve_model_path("rlkit:tiny-qwen2"))
    with pytest.raises(ConfigError, match=r"actor.fused_lm_head=true does not fit the model at .*: its output head is "
                                          r"a peft.tuners.lora.layer.Linear, not a plain torch.nn.Linear \(LoRA on "
                                          r"lm_head\?\); set actor.fused_lm_head=false"):
        build_policy(config.model, config.actor, Algorithm.from_config(config), path, torch.device("cpu"), seed=0,
                     total_updates=1)


def _two_ranks(rank: int, port: int, model_path: str, folder: str) -> None:
    """One of 2 gloo ranks: the tiny model sharded (FSDP2, the root's weights resharded after forward, so the fused
    head's backward reads a weight FSDP2 gathered again), a pass with the plain and one with the fused head."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        logprobs.CHUNK_ELEMENTS = 3 * 64
        model = fsdp.shard_model(fsdp.load_model(model_path), device=torch.device("cpu"), compute_dtype="float32")
        batch = padded_batch([[5, 6, 7, 8], [9, 10]], [[14 + rank, 15, 16], [17, 18 + rank]], prompt_width=4,
                             response_width=3)  # each rank its own rows
        packed = packing.pack(batch)
        out = {}
        for fused in (False, True):
            model.zero_grad(set_to_none=True)
            log_probs, entropy = fsdp.packed_log_probs(model, packed, temperature=0.7, with_entropy=True,
                                                       fused_head=fused, entropy_grad=True)
            (log_probs.sum() + 0.1 * entropy.sum()).backward()
            grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
            out[fused] = (log_probs.detach(), entropy.detach(), grads)
        torch.save(out, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_fused_head_under_fsdp2_on_two_ranks(tmp_path):
    import multiprocessing

    from rlkit.core.cluster.device_worker import free_port
    from rlkit.core.state.run_dir import resolve_model_path

    model_path = str(resolve_model_path("rlkit:tiny-qwen2"))  # built here once, not by both ranks at a time
    port, context = free_port(), multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_two_ranks, args=(rank, port, model_path, str(tmp_path))) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
    assert [process.exitcode for process in ranks] == [0, 0]
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        plain, fused = out[False], out[True]
        torch.testing.assert_close(fused[0], plain[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(fused[1], plain[1], rtol=0, atol=1e-5)
        assert fused[2]["model.embed_tokens.weight"].abs().sum() > 0  # tied: the embedding's and the head's gradient
        for name, grad in plain[2].items():
            assert (fused[2][name] - grad).abs().max() <= 1e-5 * grad.abs().max(), (rank, name)
