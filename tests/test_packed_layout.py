"""rlkit.core.train.packed_layout: Llama, Qwen2 and Qwen3 attention kept [tokens, heads, dim] on a packed row gives
transformers' own values, forward and backward, and leaves every other call to the module's own forward."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_packing import padded_batch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from rlkit.core.cluster.device_worker import free_port
from rlkit.core.train import fsdp, packed_attention, packed_layout, packing

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _model(family: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    families = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    config = families[family](**SHAPE)  # Mistral's sliding window: 4096 tokens, longer than every sequence here
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=packed_attention.register())
    for name, param in model.named_parameters():  # non-trivial norms and biases: every term of the forward counts
        if name.endswith(("norm.weight", "bias")):
            torch.nn.init.uniform_(param, 0.5, 1.5)
    return model


def _packed() -> packing.PackedBatch:
    return packing.pack(padded_batch([[5, 6, 7], [8], [9, 10]], [[11, 12], [13, 14, 15], [16]], prompt_width=3,
                                     response_width=3))


def _logits_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits = fsdp.packed_outputs(model, _packed())
    (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_the_packed_layout_gives_transformers_values_bit_for_bit(family: str, monkeypatch) -> None:
    own = _model(family)
    packed = copy.deepcopy(own)
    assert packed_layout.convert(packed) == 2
    assert type(packed.model.layers[0].self_attn).__name__.startswith("Packed")
    want_logits, want_grads = _logits_and_grads(own)
    calls = []
    attend = packed_attention.attend
    monkeypatch.setattr(packed_attention, "attend", lambda q, *rest: calls.append(tuple(q.shape)) or attend(q, *rest))
    got_logits, got_grads = _logits_and_grads(packed)
    head_dim = packed.model.layers[0].self_attn.head_dim  # 16; Qwen3's config sets its own (128)
    assert calls == [(12, 4, head_dim)] * 2  # each layer's query came [tokens, heads, dim] through the packed forward
    assert torch.equal(got_logits, want_logits)
    for name, grad in want_grads.items():
        if name.endswith(("q_norm.weight", "k_norm.weight")):  # a sum over tokens and heads, added in another order
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
        else:
            assert torch.equal(got_grads[name], grad), name
    assert [n for n, _ in packed.named_parameters()] == list(want_grads)  # the checkpoint's names unchanged


def test_a_call_that_is_not_one_packed_row_runs_the_modules_own_forward() -> None:
    """A batch of rows without boundaries (an unpacked debugging forward): each row one causal sequence."""
    own = _model("qwen2")
    packed = copy.deepcopy(own)
    packed_layout.convert(packed)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    assert torch.equal(packed(input_ids=ids).logits, own(input_ids=ids).logits)


def test_models_load_converted_and_lora_adapters_run_inside_the_packed_forward(tiny_model_dir) -> None:
    from peft import LoraConfig, get_peft_model

    model = fsdp.load_model(tiny_model_dir)
    attention = [m for m in model.modules() if packed_layout.supported(m) or type(m).__name__.startswith("Packed")]
    assert attention and all(type(m).__name__.startswith("Packed") for m in attention)
    settings = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(1)
    with_adapters = get_peft_model(copy.deepcopy(model), settings)
    logits = fsdp.packed_outputs(with_adapters, _packed())
    with with_adapters.disable_adapter():
        base = fsdp.packed_outputs(with_adapters, _packed())
    assert not torch.allclose(logits, base)  # the adapters changed q and v through the packed forward
    assert torch.equal(base, fsdp.packed_outputs(model, _packed()))


def test_a_compiled_layer_traces_the_packed_forward() -> None:
    """As the trainer compiles each decoder layer (dynamic shapes): the packed forward inside the graph (on a CPU the
    attention's fallback outside it), the eager values."""
    from rlkit.core.train.compiled import compiled

    model = _model("qwen2")
    packed_layout.convert(model)
    want, _ = _logits_and_grads(model)
    for layer in model.model.layers:
        layer.forward = compiled(layer.forward)
    got, _ = _logits_and_grads(model)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_under_fsdp_the_compiled_layer_sees_the_head_dim_as_a_constant() -> None:
    """Dynamo makes an int attribute of a module under FSDP2 a symbolic input (dynamic shapes): a head_dim read from the
    module made the rotary kernels divide every index by it at run time (3x slower on an H100). The packed forward
    reads it from its class's table: the graph's inputs hold no int but the token counts, and cos/sin are
    [1, tokens, head_dim] with head_dim a number."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = _model("qwen2")
        packed_layout.convert(model)
        fsdp.shard_model(model, device=torch.device("cpu"), compute_dtype="float32", compile=False)
        graphs: list[dict[str, Any]] = []

        def recording(gm: torch.fx.GraphModule, example_inputs: list) -> object:
            graphs.append({n.name: n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"})
            return gm.forward

        layer = model.model.layers[0]
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=recording)
        fsdp.packed_outputs(model, _packed())
    finally:
        dist.destroy_process_group()
    attention = next(inputs for inputs in graphs if "l_position_embeddings_0_" in inputs)
    cos = attention["l_position_embeddings_0_"]
    assert is_concrete_int(cos.shape[-1]) and cos.shape[-1] == 16
    assert not is_concrete_int(cos.shape[1])  # the tokens stay dynamic
    int_inputs = [name for name, value in attention.items() if isinstance(value, torch.SymInt)]
    assert all("head_dim" not in name for name in int_inputs), int_inputs


def test_a_sliding_window_layer_refuses_a_sequence_longer_than_its_window() -> None:
    """Qwen2 with use_sliding_window: its sliding layers' packed forward raises on a packed row whose longest
    sequence (here 5 tokens) passes the window, and computes as before where the window holds them all; Mistral's
    layers keep to its config's window."""
    from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

    def model(window: int) -> torch.nn.Module:
        config = Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=window, max_window_layers=1)
        torch.manual_seed(0)
        built = AutoModelForCausalLM.from_config(config, attn_implementation=packed_attention.register())
        packed_layout.convert(built)
        return built

    assert [layer.self_attn.sliding_window for layer in model(4).model.layers] == [None, 4]
    with pytest.raises(ValueError, match="a sequence of 5 tokens is longer than the layer's sliding window of 4"):
        fsdp.packed_outputs(model(4), _packed())
    mistral = AutoModelForCausalLM.from_config(MistralConfig(**SHAPE, sliding_window=4),
                                               attn_implementation=packed_attention.register())
    assert packed_layout.convert(mistral) == 2  # its config's window, on every layer
    with pytest.raises(ValueError, match="a sequence of 5 tokens is longer than the layer's sliding window of 4"):
        fsdp.packed_outputs(mistral, _packed())
    torch.manual_seed(0)
    full = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE), attn_implementation=packed_attention.register())
    packed_layout.convert(full)
    torch.testing.assert_close(fsdp.packed_outputs(model(5), _packed()), fsdp.packed_outputs(full, _packed()))
