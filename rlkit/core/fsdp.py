"""An FSDP2-sharded transformers model and the passes the workers run on it.

Every rank holds 1/world of each parameter (DTensor shards); forward all-gathers a layer
at a time. Because each forward/backward is a collective, all ranks must run the same
number of micro-batches: `split_micro_batches` agrees on that number across ranks.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlkit.core.batch import Batch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_sharded_model(path: str, *, device: torch.device, compute_dtype: str, value_head: bool = False,
                       gradient_checkpointing: bool = False) -> torch.nn.Module:
    """Load in fp32 (master weights), shard each decoder layer and the root over all ranks."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    if value_head:  # a critic: the same trunk with a 1-output head; no dropout (transformers' default is 0.1)
        config = AutoConfig.from_pretrained(path, num_labels=1, classifier_dropout=0.0)
        model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[compute_dtype], reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: expected a decoder stack at model.layers")
    return list(layers)


def full_state_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) per parameter; gathers one at a time (a collective on every rank)."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def shard_numels(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """name -> (elements held on this rank, elements of the full parameter)."""
    out = {}
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        out[name] = (local.numel(), param.numel())
    return out


def split_micro_batches(batch: Batch, token_budget: int) -> list[Batch]:
    """Micro-batches of at most `token_budget` padded tokens, the same count on every rank."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    count, used, widest = 1, 0, 0
    for length in lengths:  # greedy, in order: the count a budget needs on this rank
        widest = max(widest, length)
        used += 1
        if widest * used > token_budget and used > 1:
            count, used, widest = count + 1, 1, length
    agreed = torch.tensor([count], dtype=torch.long)
    if dist.is_initialized():
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    # Every rank holds the same number of sequences (checked at config time), so `agreed`
    # parts are always possible; near-equal parts keep ranks in step.
    parts = min(int(agreed.item()), len(batch))
    return [batch.select(chunk.tolist()) for chunk in torch.arange(len(batch)).tensor_split(parts)]


def trim_padding(mb: Batch) -> tuple[Batch, int]:
    """Drop columns that are padding in every row; returns the batch and its prompt width."""
    prompt_width = mb["input_ids"].shape[1] - mb["responses"].shape[1]
    left = int((mb["attention_mask"][:, :prompt_width].sum(-1)).max().item())
    right = int(mb["response_mask"].sum(-1).max().item())
    start, end = prompt_width - left, prompt_width + max(right, 1)
    cols = {k: v[:, start:end] for k, v in mb.tensors.items() if k in ("input_ids", "attention_mask", "position_ids")}
    resp = {k: v[:, :max(right, 1)] for k, v in mb.tensors.items()
            if k not in cols and v.dim() == 2 and v.shape[1] == mb["responses"].shape[1]}
    rest = {k: v for k, v in mb.tensors.items() if k not in cols and k not in resp}
    return Batch({**cols, **resp, **rest}, mb.meta), left


def response_logits(model: torch.nn.Module, mb: Batch, prompt_width: int) -> torch.Tensor:
    """Logits that predict each response token: [b, R, V] (or [b, R, 1] for a value head)."""
    out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
                use_cache=False)
    logits = out.logits
    response_len = mb["responses"].shape[1]
    return logits[:, prompt_width - 1: prompt_width - 1 + response_len]


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                    chunk: int = 1024) -> torch.Tensor:
    """log softmax(logits / T)[token], in chunks of positions so fp32 [b, R, V] never exists at once."""
    out = []
    for start in range(0, logits.shape[1], chunk):
        piece = logits[:, start:start + chunk].float() / temperature
        picked = piece.gather(-1, tokens[:, start:start + chunk].unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(piece, dim=-1))
    return torch.cat(out, dim=1)


def lr_lambda(warmup: int, total: int, schedule: str):
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0
    return factor
