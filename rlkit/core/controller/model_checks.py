"""Checks of a model before any worker loads it: where it is, its config, its weights, its tokenizer.

Each problem is one sentence naming the key (model.path, reward_model.path), the file and the
fix, so a damaged download or a wrong folder costs seconds instead of a worker's stack trace.
They read only small things: config.json, the weights' index and each safetensors header (a
few KiB at the start of each file), the tokenizer files.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

from rlkit.core.state.run_dir import TINY_PREFIX, resolve_model_path
from rlkit.errors import UserError

HUB_TIMEOUT_S = 10.0
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = ("model.safetensors", SAFETENSORS_INDEX, "pytorch_model.bin", BIN_INDEX)
# config.json keys that bound the positions a model was trained for (vLLM reads the same ones).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def locate_model(spec: str, key: str = "model.path") -> str:
    """A built-in, local or hub model that exists; returns what to load it from."""
    if not spec.startswith(TINY_PREFIX) and not Path(spec).expanduser().exists():
        check_hub_model(spec, key)
    return resolve_model_path(spec, key)


def check_hub_model(spec: str, key: str = "model.path") -> None:
    """`spec` is not a local path: it must be a hub id that is cached or that the hub knows."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise UserError(
            f"{key}={spec}: no such directory (and not a hub id); pass an existing "
            "model directory or a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
        ) from None
    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return
    prefix = f"{key}={spec!r} is not a local directory and not found on the hub"
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise UserError(
            f"{prefix}: HF_HUB_OFFLINE is set and it is not in the local hub cache; "
            "check the spelling, or pass the model's local directory"
        )
    try:
        HfApi().model_info(spec, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise UserError(
            f"{key}={spec!r} is a gated hub model: accept its licence on huggingface.co, "
            "then log in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise UserError(f"{prefix} (check the spelling; a private model needs HF_TOKEN)") from None
    except Exception as exc:  # noqa: BLE001 - any network failure means the same thing here
        raise UserError(
            f"{prefix}: the hub could not be reached ({type(exc).__name__}: {exc}); download the "
            f"model where there is network (`hf download {spec} --local-dir DIR`) and pass "
            "--model DIR"
        ) from None


def load_model_config(model_path: str, spec: str, key: str, *, head: str = "causal_lm") -> Any:
    """The model's transformers config; config.json must be JSON that names a model type this
    transformers knows, and `head` (causal_lm, or sequence_classification for a reward model)
    must exist for it."""
    import transformers
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
    )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_file = Path(model_path) / "config.json"
    if config_file.is_file():  # a local directory: read it ourselves, for a precise message
        try:
            raw = json.loads(config_file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(
                f"{key}={spec}: {config_file} is not valid JSON ({exc}); restore it from the model's source"
            ) from None
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if not model_type:
            raise UserError(f"{key}={spec}: {config_file} has no 'model_type'; restore it from the model's source")
        if model_type not in CONFIG_MAPPING:
            raise UserError(
                f"{key}={spec}: config.json has model_type {model_type!r}, which transformers "
                f"{transformers.__version__} does not know (a typo, or a model that needs a newer "
                "transformers; models with custom code are not supported)"
            )
    try:
        config = AutoConfig.from_pretrained(model_path)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for an unusable config
        raise UserError(f"{key}={spec}: its config.json does not load ({_first_line(exc)})") from None
    auto = AutoModelForSequenceClassification if head == "sequence_classification" else AutoModelForCausalLM
    if type(config) not in auto._model_mapping:
        kind = auto.__name__.removeprefix("AutoModelFor")
        raise UserError(
            f"{key}={spec}: model_type {config.model_type!r} has no {kind} "
            f"model in transformers, so {auto.__name__} cannot load it"
        )
    return config


def check_weights(model_path: str, spec: str, key: str) -> str:
    """A local model directory's weights are there and whole; returns what was found, in words.

    Safetensors files are checked against their own header (the file must be as long as the
    tensors it lists); an index must name only files that exist. A hub model's weights are
    checked when they are downloaded.
    """
    folder = Path(model_path)
    if not (folder / "config.json").is_file():
        return "weights: downloaded by the workers (a hub model)"
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        if (folder / index_name).is_file():
            files = _index_files(folder / index_name, spec, key)
            break
    else:
        files = [name for name in ("model.safetensors", "pytorch_model.bin") if (folder / name).is_file()][:1]
    if not files:
        raise UserError(
            f"{key}={spec}: no weights in {folder} (expected model.safetensors, sharded "
            f"*.safetensors with {SAFETENSORS_INDEX}, or pytorch_model.bin next to config.json); "
            "copy or download them there"
        )
    for name in files:
        file = folder / name
        if not file.is_file():
            raise UserError(
                f"{key}={spec}: the weights index lists {name}, which is missing from {folder} "
                "(an incomplete download or copy); download the model again"
            )
        problem = safetensors_problem(file) if name.endswith(".safetensors") else _torch_file_problem(file)
        if problem:
            raise UserError(f"{key}={spec}: {name} {problem}; download or copy the model again")
    return f"weights: {len(files)} file(s), complete"


def _index_files(index: Path, spec: str, key: str) -> list[str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(
            f"{key}={spec}: {index.name} is not a weights index (a JSON object with a "
            f"'weight_map'): {type(exc).__name__}: {exc}; download the model again"
        ) from None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file (header unreadable, file shorter or longer than its
    tensors), or None. Reads only the header."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return f"is truncated ({size} bytes: not even a safetensors header)"
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > size - 8:
            return f"is truncated ({size} bytes, but its header alone claims {header_len})"
        try:
            header = json.loads(handle.read(header_len))
            end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError):
            return "has an unreadable header (not a safetensors file, or damaged)"
    expected = 8 + header_len + end
    if size != expected:
        return f"is {'truncated' if size < expected else 'damaged'} ({size} bytes, its header describes {expected})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """A torch.save file is a zip archive, whose directory sits at its end: a cut file has none."""
    return None if zipfile.is_zipfile(path) else "is damaged or truncated (not a readable torch checkpoint)"


def load_tokenizer(model_path: str, spec: str, key: str = "model.path") -> Any:
    from transformers import AutoTokenizer

    fix = (
        "the model directory needs the tokenizer files (tokenizer.json or tokenizer.model, "
        "tokenizer_config.json) saved next to the weights"
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for an unusable tokenizer
        raise UserError(f"{key}={spec}: cannot load its tokenizer ({_first_line(exc)}); {fix}") from None
    # Without its files, transformers 5 builds an empty tokenizer that encodes any text as nothing.
    if not tokenizer("0 a", add_special_tokens=False)["input_ids"]:
        raise UserError(
            f"{key}={spec}: cannot load its tokenizer (it loads with {len(tokenizer)} token(s) and "
            f"encodes text as nothing); {fix}"
        )
    return tokenizer


def context_length(config: Any) -> int | None:
    """Positions the model supports per sequence (with a RoPE scaling factor applied), or None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [getattr(text, k) for k in CONTEXT_KEYS if isinstance(getattr(text, k, None), int)]
    if not found:
        return None
    rope = getattr(text, "rope_scaling", None) or getattr(text, "rope_parameters", None) or {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    return int(min(found) * (factor if isinstance(factor, (int, float)) and factor > 1 else 1))


def check_context(config: Any, spec: str, max_prompt_length: int, max_response_length: int) -> str:
    """Prompt + response must fit the model's positions (the rollout engine refuses more)."""
    limit = context_length(config)
    total = max_prompt_length + max_response_length
    if limit is not None and total > limit:
        raise UserError(
            f"data.max_prompt_length={max_prompt_length} + data.max_response_length="
            f"{max_response_length} = {total} tokens, but model.path={spec} handles at most {limit} "
            f"(its config.json); lower the two so that they add up to at most {limit}"
        )
    return f"context: {total} of {limit if limit is not None else 'unknown'} tokens"


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding-window attention layers, where it has any, or None. transformers marks
    them in `layer_types` (Gemma 2/3, Qwen2/3 with use_sliding_window); a config without `layer_types` (Mistral)
    slides on every layer when it sets `sliding_window`."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if not isinstance(window, int):
        return None
    layer_types = getattr(text, "layer_types", None)
    return window if not layer_types or "sliding_attention" in layer_types else None


def check_attention(config: Any, spec: str, max_prompt_length: int, max_response_length: int) -> str | None:
    """Attention rlkit's packed training attention (rlkit.core.train.packed_attention) does not compute: capped
    logits, and a sliding window shorter than a sequence (it attends to the whole sequence). The rollout engine
    keeps to the model's, so the trainer's log-probs would be another model's."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    softcap = getattr(text, "attn_logit_softcapping", None)
    if softcap is not None:
        raise UserError(
            f"model.path={spec} caps its attention logits (its config.json: attn_logit_softcapping={softcap}), "
            "which rlkit's packed training attention does not implement: the trainer would compute another "
            "model's log-probs than the rollout engine samples from; use a model without it"
        )
    window = sliding_window(config)
    if window is None:
        return None
    total = max_prompt_length + max_response_length
    if total > window:
        raise UserError(
            f"model.path={spec} attends within a sliding window of {window} tokens on some of its layers (its "
            f"config.json: sliding_window), which rlkit's packed training attention does not implement: with "
            f"data.max_prompt_length={max_prompt_length} + data.max_response_length={max_response_length} = "
            f"{total} tokens the trainer would let every token see the whole sequence, not the model's window (the "
            f"rollout engine keeps to it); lower the two so that they add up to at most {window}"
        )
    return f"sliding window {window} >= {total} tokens"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
