"""Sequence packing, packed attention and chunked log-probs: same numbers as the padded path."""

from __future__ import annotations

import pytest
import torch

from rlkit.core.batch import Batch
from rlkit.core.train import fsdp, logprobs, packed_attention, packing


def padded_batch(prompts: list[list[int]], responses: list[list[int]], prompt_width: int,
                 response_width: int) -> Batch:
    """The rollout layout: prompts left-padded, responses right-padded (pad id 0)."""
    n = len(prompts)
    ids = torch.zeros((n, prompt_width + response_width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, prompt_width - len(p):prompt_width + len(r)] = torch.tensor(p + r)
        mask[i, prompt_width - len(p):prompt_width + len(r)] = 1
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                  "responses": ids[:, prompt_width:].clone(), "response_mask": mask[:, prompt_width:].float()})


def test_plan_balances_tokens_within_the_budget():
    # 18 tokens, budget 10 -> 2 bins; longest first into the lightest: 8 | 5, 3 | then 2 joins the 8.
    assert packing.plan_micro_batches([5, 3, 8, 2], 10) == [[2, 3], [0, 1]]
    # A sequence longer than the budget gets a micro-batch of its own.
    assert packing.plan_micro_batches([12, 3, 4], 10) == [[0], [1, 2]]
    assert packing.plan_micro_batches([4, 4, 4], 100) == [[0, 1, 2]]


def test_split_to_count_halves_the_fullest_bin():
    lengths = [6, 5, 1, 1]
    # bins {0, 2} (7 tokens) and {1, 3} (6 tokens); reaching 3 bins splits the 7-token one.
    split = packing.split_to_count([[0, 2], [1, 3]], lengths, 3)
    assert sorted(sorted(m) for m in split) == [[0], [1, 3], [2]]


def test_pack_lays_real_tokens_end_to_end():
    batch = padded_batch([[11, 12], [13, 14, 15]], [[21, 22, 23], [24]], prompt_width=3, response_width=3)
    packed = packing.pack(batch)
    assert packed.input_ids.tolist() == [[11, 12, 21, 22, 23, 13, 14, 15, 24]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert packed.cu_seq_lens.tolist() == [0, 5, 9]
    assert packed.max_len == 5
    # Outputs at 1, 2, 3 predict 21, 22, 23; the output at 7 (token 15) predicts 24.
    assert packed.predict_index.tolist() == [1, 2, 3, 7]
    assert packed.targets.tolist() == [21, 22, 23, 24]
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert packed.scatter(values).tolist() == [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]
    assert packed.gather(packed.scatter(values)).tolist() == values.tolist()


def _block_diagonal_causal(q, k, v, segment):
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("path", ["per_sequence", "padded"])
def test_cpu_attention_paths_match_a_block_diagonal_causal_mask_values_and_gradients(path):
    torch.manual_seed(0)
    leaves = [torch.randn(7, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)  # sequences of 3 and 4 tokens: the first is padded to 4
    if path == "padded":
        got = packed_attention.padded_attention(*leaves, cu, 4, None)
    else:
        got = packed_attention.per_sequence_attention(*leaves, cu, None)
    want = _block_diagonal_causal(*leaves, torch.tensor([0, 0, 0, 1, 1, 1, 1]))
    assert torch.allclose(got, want, atol=1e-12)
    weights = torch.randn(7, 2, 8, dtype=torch.float64)
    grads = torch.autograd.grad((got * weights).sum(), leaves)
    want_grads = torch.autograd.grad((want * weights).sum(), leaves)
    assert all(torch.allclose(g, w, atol=1e-12) for g, w in zip(grads, want_grads))


def test_grouped_query_attention_attends_each_query_head_to_its_groups_kv_head():
    """K/V with fewer heads (Qwen2.5-0.5B: 14 query heads, 2 kv heads) through the packed forward: query head h
    attends with kv head h // (H / Hkv), as transformers' repeat_kv lays them out; values and gradients."""
    torch.manual_seed(0)
    q = torch.randn(1, 4, 7, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    got = packed_attention.packed_attention_forward(None, q, k, v, None, cu_seq_lens_q=cu, max_length_q=4)[0][0]
    heads = [_block_diagonal_causal(q[0].transpose(0, 1)[:, [h]], k[0].transpose(0, 1)[:, [h // 2]],
                                    v[0].transpose(0, 1)[:, [h // 2]], torch.tensor([0, 0, 0, 1, 1, 1, 1]))
             for h in range(4)]
    want = torch.cat(heads, dim=1)
    assert torch.allclose(got, want, atol=1e-12)
    weights = torch.randn(7, 4, 8, dtype=torch.float64)
    grads = torch.autograd.grad((got * weights).sum(), [q, k, v])
    want_grads = torch.autograd.grad((want * weights).sum(), [q, k, v])
    assert all(torch.allclose(g, w, atol=1e-12) for g, w in zip(grads, want_grads))


def _gqa_kernel(q, k, v, cu, max_len, scale):  # a kernel that reads each kv head for its group of query heads
    return packed_attention.per_sequence_attention(q, *packed_attention._repeat_kv(k, v, q.shape[1]), cu, scale)


def _equal_heads_kernel(q, k, v, cu, max_len, scale):  # torch 2.11's front end, were it to refuse fewer kv heads
    if k.shape[1] != q.shape[1]:
        raise RuntimeError("number of heads in key/value must equal the query's")
    return packed_attention.per_sequence_attention(q, k, v, cu, scale)


def _interleaved_kernel(q, k, v, cu, max_len, scale):  # a wrong grouping: query head h with kv head h % Hkv
    groups = q.shape[1] // k.shape[1]
    return packed_attention.per_sequence_attention(q, k.repeat(1, groups, 1), v.repeat(1, groups, 1), cu, scale)


@pytest.mark.parametrize("kernel, takes", [(_gqa_kernel, True), (_equal_heads_kernel, False),
                                           (_interleaved_kernel, False)])
def test_the_kernel_gets_kv_with_fewer_heads_only_where_its_self_check_passes(monkeypatch, kernel, takes):
    """The varlen kernel's grouped-query self-check (once per device and head counts): a kernel that computes the
    reference's result from unrepeated K/V gets them; one that refuses them, or groups the heads otherwise, gets
    K/V repeated. (On a CPU the check runs the stand-in kernels; on a GPU the real one.)"""
    monkeypatch.setattr(packed_attention, "_varlen_kernel", kernel)
    monkeypatch.setattr(packed_attention, "_gqa_ok", {})
    monkeypatch.setattr(packed_attention, "_kernel_ok", {})
    cpu = torch.device("cpu")
    packed_attention._check_kernel(cpu, torch.float32, 4, 2, 8)
    assert packed_attention._kernel_ok == {cpu: True}  # with equal heads every stand-in agrees
    assert packed_attention._gqa_ok == {(cpu, 4, 2): takes}
    monkeypatch.setattr(packed_attention, "_kernel_error", lambda *a: pytest.fail("checked again"))
    packed_attention._check_kernel(cpu, torch.float32, 4, 2, 8)  # remembered: checked once


def test_attention_the_packed_kernel_does_not_compute_is_refused():
    """A sliding window shorter than a packed sequence (sequences of 3 and 4 tokens: a window of 3 is too short,
    one of 4 changes nothing) and capped logits (Gemma 2) raise instead of computing another model's attention."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    packed = dict(cu_seq_lens_q=cu, max_length_q=4)
    plain = packed_attention.packed_attention_forward(None, q, k, v, None, **packed)[0]
    windowed = packed_attention.packed_attention_forward(None, q, k, v, None, sliding_window=4, **packed)[0]
    assert torch.equal(windowed, plain)
    with pytest.raises(ValueError, match="a sequence of 4 tokens is longer than the layer's sliding window of 3"):
        packed_attention.packed_attention_forward(None, q, k, v, None, sliding_window=3, **packed)
    with pytest.raises(ValueError, match="a sequence of 7 tokens is longer than the layer's sliding window of 4"):
        packed_attention.packed_attention_forward(None, q, k, v, None, sliding_window=4)  # unpacked: one row
    with pytest.raises(ValueError, match=r"does not cap attention logits \(softcap=50.0"):
        packed_attention.packed_attention_forward(None, q, k, v, None, softcap=50.0, **packed)


def test_cpu_attention_pads_a_small_batch_and_loops_over_a_large_one(monkeypatch):
    calls = []
    monkeypatch.setattr(packed_attention, "padded_attention", lambda *a: calls.append("padded"))
    monkeypatch.setattr(packed_attention, "per_sequence_attention", lambda *a: calls.append("per_sequence"))
    q = torch.zeros(7, 2, 8)
    cu = torch.tensor([0, 3, 7])
    # 2 sequences x 2 heads x 4^2 scores x 4 bytes = 256 bytes.
    monkeypatch.setattr(packed_attention, "PADDED_SCORES_MAX_BYTES", 256)
    packed_attention.attend(q, q, q, cu, 4, None)
    monkeypatch.setattr(packed_attention, "PADDED_SCORES_MAX_BYTES", 255)
    packed_attention.attend(q, q, q, cu, 4, None)
    assert calls == ["padded", "per_sequence"]


def test_packed_forward_gives_the_padded_forward_log_probs(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    padded_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                        attn_implementation="sdpa")
    packed_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                        attn_implementation=packed_attention.register())
    batch = padded_batch([[5, 6, 7, 8], [9, 10], [11, 12, 13]], [[14, 15, 16], [17], []],
                         prompt_width=4, response_width=3)
    with torch.no_grad():
        logits = padded_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              position_ids=batch["position_ids"]).logits[:, 3:6]
        want = logits.log_softmax(-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
        packed = packing.pack(batch)
        got, _ = logprobs.selected_log_probs(fsdp.packed_outputs(packed_model, packed), packed.targets)
    mask = batch["response_mask"].bool()
    assert torch.allclose(packed.scatter(got)[mask], want[mask], atol=1e-5)


def test_selected_log_probs_and_their_gradients_match_log_softmax(monkeypatch):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 3 * 7)  # 3 tokens a chunk: exercises the chunking
    torch.manual_seed(0)
    logits = torch.randn(8, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (8,))
    weights_lp, weights_ent = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    log_probs, entropy = logprobs.selected_log_probs(logits, targets, temperature=0.7, with_entropy=True)
    grad, = torch.autograd.grad((log_probs * weights_lp).sum() + (entropy * weights_ent).sum(), logits)

    reference = (logits / 0.7).log_softmax(-1)
    want_lp = reference.gather(-1, targets[:, None]).squeeze(-1)
    want_ent = -(reference.exp() * reference).sum(-1)
    want_grad, = torch.autograd.grad((want_lp * weights_lp).sum() + (want_ent * weights_ent).sum(), logits)
    # The chunks are computed in fp32 (as on a GPU), hence the tolerance.
    assert torch.allclose(log_probs.double(), want_lp, atol=1e-5)
    assert torch.allclose(entropy.double(), want_ent, atol=1e-5)
    assert torch.allclose(grad, want_grad, atol=1e-5)


def test_fp32_logits_at_a_temperature_are_not_divided_in_place(monkeypatch):
    """fp32 logits (the CPU's compute dtype): `.float()` is the same tensor, so dividing it by T in place changed
    the logits the backward reads, which divided them again (gradients off by orders of magnitude)."""
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 3 * 7)
    torch.manual_seed(0)
    leaf = torch.randn(8, 7, requires_grad=True)
    logits = leaf * 1.0  # a head's output: not a leaf, fp32
    before = logits.detach().clone()
    targets = torch.randint(0, 7, (8,))
    log_probs, entropy = logprobs.selected_log_probs(logits, targets, temperature=0.5, with_entropy=True)
    assert torch.equal(logits.detach(), before)
    grad, = torch.autograd.grad(log_probs.sum() + entropy.sum(), leaf)
    reference = (leaf / 0.5).log_softmax(-1)
    want = reference.gather(-1, targets[:, None]).sum() - (reference.exp() * reference).sum()
    want_grad, = torch.autograd.grad(want, leaf)
    assert torch.allclose(grad, want_grad, atol=1e-5)


def test_an_entropy_left_out_of_the_loss_adds_nothing_to_the_gradient(monkeypatch):
    """The update asks for the entropy as a metric only: its gradient must be the log-probs' alone."""
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 3 * 7)
    torch.manual_seed(0)
    logits = torch.randn(8, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (8,))
    weights = torch.randn(8, dtype=torch.float64)
    log_probs, entropy = logprobs.selected_log_probs(logits, targets, with_entropy=True)
    grad, = torch.autograd.grad((log_probs * weights).sum(), logits)
    want_lp = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    want_grad, = torch.autograd.grad((want_lp * weights).sum(), logits)
    assert entropy.abs().sum() > 0
    assert torch.allclose(grad, want_grad, atol=1e-5)


def test_compiled_chunk_kernels_match_eager_and_write_into_the_whole_gradient(monkeypatch):
    """The compiled kernels (rlkit.core.train.compiled, dynamic shapes) give the eager values on bf16 logits over
    chunks of unequal length, and each chunk's gradient is stored into its rows of the one gradient tensor (no
    chunk buffer and copy, which cost an H100 a third of the log-prob pass)."""
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 4 * 50)  # 4 tokens a chunk: chunks of 4, 4 and 2
    torch.manual_seed(0)
    logits = (torch.randn(10, 50) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 50, (10,))
    weights_lp, weights_ent = torch.randn(10), torch.randn(10)
    results, stored_in = [], []
    for compiled in (False, True):
        if compiled:
            monkeypatch.setitem(logprobs._kernels, "stats", logprobs._kernels["stats"])
            monkeypatch.setitem(logprobs._kernels, "grad", logprobs._kernels["grad"])
            logprobs.use_compiled_kernels()
            kernel = logprobs._kernels["grad"]
            monkeypatch.setitem(logprobs._kernels, "grad", lambda *args: stored_in.append(args[-1]) or kernel(*args))
        leaf = logits.clone().requires_grad_()
        log_probs, entropy = logprobs.selected_log_probs(leaf, targets, temperature=0.7, with_entropy=True)
        ((log_probs * weights_lp).sum() + (entropy * weights_ent).sum()).backward()
        results.append((log_probs, entropy, leaf.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled.float(), eager.float(), rtol=1e-2, atol=1e-4)
    assert [out.shape[0] for out in stored_in] == [4, 4, 2]
    # views of one [10, 50] tensor, the gradient backward returns
    assert len({out.untyped_storage().data_ptr() for out in stored_in}) == 1
    assert all(out._base is not None and out._base.shape == logits.shape for out in stored_in)
    torch.testing.assert_close(torch.cat(stored_in), results[1][2])


def _layer(q, k, v, cu, max_len):
    return packed_attention.packed_attention_forward(None, q * 2, k, v, None, cu_seq_lens_q=cu,
                                                     max_length_q=max_len)[0]


def test_without_the_kernel_the_packed_attention_stays_out_of_compiled_graphs():
    """After `register` (what a training worker calls), where the varlen kernel is not used (a CPU) compiling a
    layer breaks the graph at the fallback (data-dependent shapes) and still gives the eager result."""
    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 7, 8) for _ in range(3)] + [torch.tensor([0, 3, 7], dtype=torch.int32), 4]
    packed_attention.register()
    explained = torch._dynamo.explain(_layer)(*inputs)
    reasons = [str(b.reason) for b in explained.break_reasons]
    assert reasons and all("torch.compiler.disable()`d function" in r and "_fallback" in r for r in reasons), reasons
    assert torch.allclose(torch.compile(_layer, backend="eager")(*inputs), _layer(*inputs))


def _masked_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, is_causal=False, enable_gqa=False):
    """A stand-in for varlen_attn that a trace can follow: one SDPA over all tokens, masked to each sequence."""
    sequence = (torch.arange(q.shape[0])[:, None] >= cu_q[None, 1:]).sum(-1)  # [T]: each token's sequence
    mask = (sequence[:, None] == sequence[None, :]).tril()
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return out.transpose(0, 1)


def test_with_the_kernel_a_compiled_layer_is_one_graph_for_every_batch(monkeypatch):
    """Where the kernel's self-checks passed (before the compile, as `prepare` runs them on a GPU), the kernel is a
    node of the layer's graph: no break, the reference's result, and one compile for packed rows of other lengths
    and longest sequences (the longest is a symbolic size of the graph, not a constant)."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(packed_attention, "KERNEL_DEVICES", {"cpu"})
    monkeypatch.setattr(packed_attention, "_varlen", (_masked_varlen, frozenset({"scale", "is_causal", "enable_gqa"})))
    monkeypatch.setattr(packed_attention, "_kernel_ok", {cpu: True})
    monkeypatch.setattr(packed_attention, "_gqa_ok", {(cpu, 4, 2): True})
    monkeypatch.setattr(packed_attention, "_check_kernel", lambda *a: pytest.fail("checked in the trace"))
    packed_attention.register()
    torch.manual_seed(0)
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(_layer, backend=counter, dynamic=True)
    for bounds in ([0, 3, 7], [0, 5, 9], [0, 2, 6, 8]):
        q, k, v = torch.randn(1, 4, bounds[-1], 8), torch.randn(1, 2, bounds[-1], 8), torch.randn(1, 2, bounds[-1], 8)
        cu, longest = torch.tensor(bounds, dtype=torch.int32), max(b - a for a, b in zip(bounds, bounds[1:]))
        want = packed_attention.per_sequence_attention(
            q[0].transpose(0, 1) * 2, *packed_attention._repeat_kv(k[0].transpose(0, 1), v[0].transpose(0, 1), 4),
            cu, None)
        torch.testing.assert_close(compiled(q, k, v, cu, longest)[0], want)
    assert counter.frame_count == 1
    assert torch._dynamo.explain(_layer)(q, k, v, cu, longest).graph_break_count == 0


def test_torchs_varlen_kernel_traces_into_one_graph_forward_and_backward(monkeypatch):
    """The real op (torch.nn.attention.varlen), not a stand-in: traced on meta tensors (its registered shapes, no
    flash attention needed), forward and backward, one compile for three rows' lengths and longest sequences."""
    meta = torch.device("meta")
    monkeypatch.setattr(packed_attention, "KERNEL_DEVICES", {"meta"})
    monkeypatch.setattr(packed_attention, "_kernel_ok", {meta: True})
    monkeypatch.setattr(packed_attention, "_gqa_ok", {(meta, 14, 2): True})
    packed_attention._find_varlen()
    packed_attention.register()
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_layer, backend=counter, dynamic=True)
    for tokens, longest in ((768, 300), (1500, 700), (999, 999)):
        q, k, v = (torch.empty(1, heads, tokens, 64, device=meta, dtype=torch.bfloat16, requires_grad=True)
                   for heads in (14, 2, 2))
        out = compiled(q, k, v, torch.empty(3, dtype=torch.int32, device=meta), longest)
        out.float().sum().backward()
        assert out.shape == (1, tokens, 14, 64) and k.grad.shape == k.shape
    assert counter.frame_count == 1


def test_prepare_runs_the_kernels_checks_for_the_models_heads_before_a_compile(monkeypatch):
    """`prepare` (shard_model calls it when it compiles) checks the kernel once with the model's head counts and head
    dimension, only on a device the kernel runs on; a config without head counts leaves the check to the first call."""
    from transformers import Qwen2Config, Qwen3Config

    calls = []
    monkeypatch.setattr(packed_attention, "_check_kernel", lambda *args: calls.append(args))
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    packed_attention.prepare(Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2), cuda,
                             torch.bfloat16)
    packed_attention.prepare(Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=128),
                             cuda, torch.bfloat16)
    packed_attention.prepare(Qwen2Config(hidden_size=896, num_attention_heads=14), cpu, torch.float32)
    packed_attention.prepare(object(), cuda, torch.bfloat16)
    assert calls == [(cuda, torch.bfloat16, 14, 2, 64), (cuda, torch.bfloat16, 4, 4, 128)]


def test_without_a_working_kernel_no_grouped_query_check_runs(monkeypatch):
    """Where the kernel fails its first check (a missing op, an old GPU), the grouped-query check is not run: every
    call takes the fallback, which repeats K/V itself."""
    checked = []
    monkeypatch.setattr(packed_attention, "_kernel_error", lambda *args: checked.append(args) or "RuntimeError: no")
    monkeypatch.setattr(packed_attention, "_kernel_ok", {})
    monkeypatch.setattr(packed_attention, "_gqa_ok", {})
    gpu = torch.device("cuda", 0)
    packed_attention._check_kernel(gpu, torch.bfloat16, 14, 2, 64)
    assert len(checked) == 1 and packed_attention._kernel_ok == {gpu: False}
    assert packed_attention._gqa_ok == {(gpu, 14, 2): False}
