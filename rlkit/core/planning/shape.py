"""A model's shape for planning: parameter counts and the dimensions the memory and time models use.

Read from the model's config.json alone: the model is built on the meta device, so counting a
70B model's parameters takes no memory and no weights download.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.errors import UserError


@dataclass(frozen=True)
class ModelShape:
    params: int  # every parameter, tied embeddings counted once
    layer_params: int  # one decoder layer's
    root_params: int  # embeddings, final norm, untied head: what is not in a decoder layer
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def linear_params_per_layer(self) -> int:
        """Parameters of a layer's matrix products (q, k, v, o, gate, up, down): 2 FLOPs each per token."""
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each matrix product in a decoder layer, by its Qwen2/Llama module name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def lora_params(self, rank: int, target_modules: str | list[str]) -> int:
        """Parameters of rank-`rank` adapters (A: in x r, B: r x out) on the targeted layers' matrix products;
        'all-linear' targets all seven (peft leaves the output head out)."""
        shapes = self.linear_shapes()
        names = list(shapes) if target_modules == "all-linear" else [n for n in target_modules if n in shapes]
        return self.layers * sum(rank * sum(shapes[n]) for n in names)

    def forward_flops(self, prompt_tokens: int, response_tokens: int) -> float:
        """Matrix-multiply FLOPs of one forward over one sequence, counted as docs/benchmarks.md counts them:
        2 x linear params x every token, the vocabulary head at response positions only, causal attention."""
        length = prompt_tokens + response_tokens
        linear = 2 * self.linear_params_per_layer * self.layers * length
        head = 2 * self.hidden * self.vocab * response_tokens
        attention = 2 * length * length * self.heads * self.head_dim * self.layers
        return float(linear + head + attention)


def model_shape(model_path: str, *, value_head: bool = False) -> ModelShape:
    """The shape of the model at `model_path` (a directory or a cached hub id); UserError if unreadable."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForTokenClassification,
    )

    try:
        config = AutoConfig.from_pretrained(model_path, **({"num_labels": 1} if value_head else {}))
    except Exception as exc:  # noqa: BLE001 - hub, network and parsing errors all mean "no config here"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"cannot read the config.json of {model_path} ({first[:200]}); pass a local model "
            "directory or a hub id in the local cache"
        ) from None
    factory = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    with torch.device("meta"):
        model = factory.from_config(config)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise UserError(
            f"{model_path}: {type(model).__name__} has no decoder stack at model.layers; "
            "the plan's memory model covers decoder-only transformers"
        )
    params = sum(p.numel() for p in model.parameters())
    layer_params = sum(p.numel() for p in layers[0].parameters())
    heads = config.num_attention_heads
    return ModelShape(
        params=params,
        layer_params=layer_params,
        root_params=params - layer_params * len(layers),
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        layers=len(layers),
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab=config.vocab_size,
    )
