"""LoRA adapters (peft) on the policy: added before sharding, merged for the rollout engine.

With `model.lora.rank > 0` the policy is a peft model: every targeted linear layer keeps
its base weight W frozen and learns a low-rank update, y = x W^T + (alpha / r) x A^T B^T
(A: r x in, B: out x r, B starts at zero so training starts from the base model). The
reference policy is the same module with adapters off (`adapters_off`), so no second copy
of the model is held. Engines get plain weights under the base model's names:
W + (alpha / r) B A per layer, computed from full tensors gathered off the FSDP2 shards.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator

import torch
from torch.distributed.tensor import DTensor

from rlkit.errors import ConfigError
from rlkit.recipes.schema import LoraSettings

# Where peft puts the wrapped model's own names: base_model.model.<HF name>, base layers as
# <module>.base_layer.<param>, adapters as <module>.lora_A.<adapter>.weight.
PEFT_PREFIX = "base_model.model."
BASE_LAYER = ".base_layer"


def peft_config(settings: LoraSettings):
    """The peft LoraConfig of `settings` (also written next to an exported adapter)."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )


def add_lora(model: torch.nn.Module, settings: LoraSettings, seed: int) -> torch.nn.Module:
    """`model` wrapped by peft with fresh adapters; only the adapters require gradients.

    The adapters' random initialisation draws from `seed` in a forked RNG: every rank builds
    the same adapters before sharding them, and the training RNG streams are left as they were.
    """
    from peft import get_peft_model
    from peft.tuners.lora import Linear

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            wrapped = get_peft_model(model, peft_config(settings))
        except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
            raise ConfigError(f"model.lora.target_modules={settings.target_modules!r}: {exc}") from None
    others = sorted({type(m).__name__ for m in lora_layers(wrapped).values() if not isinstance(m, Linear)})
    if others:
        raise ConfigError(
            f"model.lora.target_modules={settings.target_modules!r} reaches {', '.join(others)} "
            "layers; rlkit merges adapters of linear layers only: name linear modules "
            "(e.g. [q_proj, k_proj, v_proj, o_proj]) or use all-linear"
        )
    for layer in lora_layers(wrapped).values():
        layer.forward = partial(_adapters_added_in_place, layer, layer.forward)
    return wrapped


def _adapters_added_in_place(layer: torch.nn.Module, peft_forward: Callable, x: torch.Tensor, *args, **kwargs):
    """A LoRA linear layer's output, each adapter's product added into the base layer's inside the matrix product:
    y = x W^T, then y += s (x A^T) B^T (addmm_, C += alpha A B). peft computes `y + lora_B(lora_A(x)) * s`, which
    writes three [tokens, out] tensors a layer (the product, its scaled copy, the sum) and reads them again in the
    forward and its backward (docs/architecture.md, LoRA).

    The base layer's output is not kept for its backward (a linear layer keeps its input and weight), so adding
    into it in place is safe for autograd. Anything else goes through peft's forward as it is: adapters off or
    merged, peft's keyword arguments (mixed adapter batches), a LoRA variant, a biased B, mismatched dtypes."""
    if layer.disable_adapters or layer.merged or args or kwargs or layer.lora_variant or layer.fan_in_fan_out:
        return peft_forward(x, *args, **kwargs)
    adapters = [name for name in layer.active_adapters if name in layer.lora_A]
    modules = [layer.base_layer, *(layer.lora_A[n] for n in adapters), *(layer.lora_B[n] for n in adapters)]
    if any(layer.lora_B[n].bias is not None for n in adapters) or any(m.weight.dtype != x.dtype for m in modules):
        return peft_forward(x)
    rows = x.reshape(-1, x.shape[-1])  # 2-D throughout: an in-place add into a view would cost a copy in backward
    result = layer.base_layer(rows)
    for name in adapters:
        low_rank = layer.lora_A[name](layer.lora_dropout[name](rows))
        result.addmm_(low_rank, layer.lora_B[name].weight.t(), alpha=layer.scaling[name])
    return result.view(*x.shape[:-1], result.shape[-1])


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name -> LoRA layer, for every layer that holds adapters."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` computing the base model exactly (every LoRA layer returns its base layer's output).

    Not peft's `disable_adapter()`: that also flips the adapters' requires_grad, and under
    FSDP2, which swaps sharded and unsharded parameter objects in and out of the modules,
    the flip lands on whichever set is registered at the time, leaving the other frozen
    (the next update then computed no gradient). Only peft's own per-layer switch is set here.
    """
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield model
    finally:
        for layer in layers:
            layer._disable_adapters = False


def engine_name(peft_name: str) -> str:
    """A peft parameter name as the base model (and so every engine) calls it."""
    return peft_name.removeprefix(PEFT_PREFIX).replace(f"{BASE_LAYER}.", ".")


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(base-model name, full tensor) per base parameter, LoRA layers merged: W + scaling * B @ A.

    Gathers every tensor from its shards, in the same order on every rank (a collective).
    """
    layers = lora_layers(model)
    for name, param in model.named_parameters():
        if ".lora_" in name:  # folded into their base layer's weight below
            continue
        tensor = _full(param)
        owner, _, leaf = name.rpartition(".")
        layer = layers.get(owner.removesuffix(BASE_LAYER)) if owner.endswith(BASE_LAYER) else None
        if layer is not None and leaf == "weight":
            tensor = tensor + _delta_weight(layer)
        yield engine_name(name), tensor


def _delta_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The active adapters' update of one linear layer's weight, from full tensors."""
    delta = None
    for adapter in layer.active_adapters:
        lora_a, lora_b = _full(layer.lora_A[adapter].weight), _full(layer.lora_B[adapter].weight)
        update = (lora_b @ lora_a) * layer.scaling[adapter]
        delta = update if delta is None else delta + update
    return delta.T if layer.fan_in_fan_out else delta


def _full(param: torch.Tensor) -> torch.Tensor:
    tensor = param.detach()
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
