"""A checkpoint's policy as a Hugging Face model directory (safetensors, config, tokenizer).

The base model is loaded first (architecture, config, buffers, generation config), then the
checkpoint's sharded weights are read into its tensors in place by DCP, so memory peaks at
one model. Needs no process group, no Ray and no GPU.

A LoRA run's checkpoint holds only its adapters: they are read into a peft model on the
base, then written as the merged model (W + alpha/r * B @ A, loadable anywhere), as the
peft adapter (adapter_config.json + adapter_model.safetensors, for peft or vLLM's LoRA
support), or both (`lora_format`).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from rlkit.core.state import checkpoint, safe_load
from rlkit.core.state.run_dir import RunDir, resolve_model_path
from rlkit.core.state.shards import MODEL_KEY, SHARDS_DIR, frozen_names
from rlkit.core.train import adapters
from rlkit.core.train.fsdp import DTYPES
from rlkit.errors import UserError
from rlkit.recipes.loader import load_config
from rlkit.recipes.schema import LoraSettings

EXPORT_INFO = "rlkit_export.json"
EXPORT_CONFIG = "rlkit_config.yaml"
ADAPTER_DIR = "adapter"  # where `lora_format=both` puts the peft adapter, next to the merged model
LORA_FORMATS = ("both", "merged", "adapter")


def export_hf(
    run: RunDir, out: str | Path, *, step: int | None = None, dtype: str = "auto", lora_format: str | None = None
) -> Path:
    """Write the policy of `run` at `step` (default: the latest complete checkpoint) to `out`.

    Next to the model: EXPORT_INFO (run, step, base model) and EXPORT_CONFIG (the config the
    checkpoint was trained with, which `rlkit eval` of the directory validates with).
    `lora_format` (LoRA runs only; default both): the merged model in `out`, the peft adapter
    in `out` (adapter), or the merged model in `out` and the adapter in `out/adapter` (both).
    """
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(
            f"--out {out} is an existing file, not a directory; pick a new directory "
            "(the export writes several files into it)"
        )
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} is not empty; pick a new directory")
    if dtype not in ("auto", *DTYPES):
        raise UserError(f"--dtype {dtype!r}: use auto (the base model's dtype), {', '.join(DTYPES)}")
    ckpt = checkpoint.checkpoint_at(run.path, step)
    config = load_config(str(ckpt.path / checkpoint.CONFIG_FILE))
    lora = config.model.lora if config.model.lora.rank > 0 else None
    if lora_format is not None and lora is None:
        raise UserError(
            f"--lora-format {lora_format}: run {run.run_id} trained every weight (model.lora.rank=0), "
            "so its export is the full model; leave --lora-format out"
        )
    lora_format = lora_format or "both"
    if lora_format not in LORA_FORMATS:
        raise UserError(f"--lora-format {lora_format!r}: use {', '.join(LORA_FORMATS)}")
    with _no_progress_bars():  # one line says what was exported; load/save bars would only clutter it
        save_dtype = _write_model(resolve_model_path(config.model.path), ckpt, out, dtype, lora_format=lora_format)
    info = {
        "run": run.run_id,
        "step": ckpt.step,
        "checkpoint": str(ckpt.path),
        "base_model": config.model.path,
        "dtype": str(save_dtype).removeprefix("torch."),
    }
    if lora is not None:
        info["lora"] = {"format": lora_format, **lora.model_dump(mode="json")}
    (out / EXPORT_INFO).write_text(json.dumps(info, indent=2))
    (out / EXPORT_CONFIG).write_text((ckpt.path / checkpoint.CONFIG_FILE).read_text())
    _default_permissions(out)
    return out


def _write_model(base: str, ckpt: checkpoint.Checkpoint, out: Path, dtype: str, *, lora_format: str) -> torch.dtype:
    """The base model with the checkpoint's weights, saved to `out` with its tokenizer; returns the dtype."""
    from transformers import AutoConfig, AutoTokenizer

    base_dtype = AutoConfig.from_pretrained(base).dtype  # before loading in fp32 overwrites it
    model, lora = load_policy(ckpt, base)
    save_dtype = DTYPES[dtype] if dtype != "auto" else _as_dtype(base_dtype)
    out.mkdir(parents=True, exist_ok=True)
    if lora is not None and lora_format != "merged":
        _save_adapter(model, out / ADAPTER_DIR if lora_format == "both" else out, save_dtype)
    if lora is None or lora_format != "adapter":
        merged = model.merge_and_unload() if lora is not None else model
        merged.to(save_dtype).save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return save_dtype


def _save_adapter(model: torch.nn.Module, out: Path, dtype: torch.dtype) -> None:
    """The peft adapter of `model` (adapter_config.json naming the base model, adapter weights in `dtype`)."""
    # peft picks the adapter's tensors out of this (keys as the model names them) and strips the adapter name.
    weights = {k: v.to(dtype) for k, v in model.state_dict().items() if ".lora_" in k}
    model.save_pretrained(out, state_dict=weights)


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _default_permissions(out: Path) -> None:
    """Files as the umask allows (usually 0644). transformers writes the weights through a
    private temporary file, which leaves them 0600: unreadable to the group that serves them."""
    umask = os.umask(0)
    os.umask(umask)
    for path in out.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def load_policy(ckpt: checkpoint.Checkpoint, base: str) -> tuple[torch.nn.Module, LoraSettings | None]:
    """The checkpoint's policy in float32 (the trainer's master weights) on the CPU, in the base model's
    architecture loaded from `base`; a LoRA run's with its adapters (and their settings), else None."""
    from transformers import AutoModelForCausalLM

    config = load_config(str(ckpt.path / checkpoint.CONFIG_FILE))
    lora = config.model.lora if config.model.lora.rank > 0 else None
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if lora is not None:  # the adapters' structure; their values come from the checkpoint
        model = adapters.add_lora(model, lora, seed=config.trainer.seed)
    frozen = frozen_names(model)  # not in a checkpoint: the base model's own
    target = {k: v for k, v in model.state_dict().items() if k not in frozen}
    shards = ckpt.path / "policy" / SHARDS_DIR
    _check_keys(target, shards)
    safe_load.load({MODEL_KEY: target}, shards, no_dist=True)
    return model, lora


def _check_keys(target: dict[str, torch.Tensor], shards: Path) -> None:
    """Every parameter of the base model must be in the checkpoint, with the same shape."""
    metadata = safe_load.read_metadata(shards / safe_load.METADATA_FILE).state_dict_metadata
    prefix = f"{MODEL_KEY}."
    saved = {k[len(prefix) :]: v for k, v in metadata.items() if k.startswith(prefix)}
    missing = [k for k in target if k not in saved]
    wrong = [
        f"{k} {tuple(saved[k].size)} vs {tuple(t.shape)}"
        for k, t in target.items()
        if k in saved and tuple(saved[k].size) != tuple(t.shape)
    ]
    if missing or wrong:
        raise UserError(
            f"checkpoint {shards.parent.parent} does not fit its base model: "
            f"missing {missing[:5]}, shape mismatches {wrong[:5]}"
        )


def _as_dtype(value: torch.dtype | str | None) -> torch.dtype:
    """A model config's dtype: a torch.dtype, its name, or None (= float32)."""
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else torch.float32
