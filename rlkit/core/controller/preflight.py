"""Checks of a run's inputs before anything starts: each bad input is one sentence and exit code 2.

They run before the run directory, Ray or any worker exists, so a typo costs seconds instead
of a cluster start-up, and a fixed command can reuse the same --run-id. They open only what
they must (a model's config and tokenizer, a parquet footer and first row); the controller
loads the inputs for real afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlkit.core.agents.preflight import check_agent
from rlkit.core.controller.run_dir import TINY_PREFIX, resolve_model_path
from rlkit.core.data.dataset import open_parquet
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

HUB_TIMEOUT_S = 10.0


def check_inputs(config: RLConfig) -> None:
    """Model, tokenizer, data files, agent code (rollout.agent) and devices; raises UserError naming the key and the fix."""
    spec = config.model.path
    tokenizer = load_tokenizer(check_model(spec), spec)
    if config.reward_model.path:
        check_model(config.reward_model.path, key="reward_model.path")
    for key, files in (("data.train_files", config.data.train_files), ("data.val_files", config.data.val_files)):
        for file in files:
            check_data_file(file, key, tokenizer, spec)
    check_agent(config, tokenizer)
    check_devices(config)


def check_model(spec: str, key: str = "model.path") -> str:
    """A built-in, local or hub model that exists; returns what to load it from."""
    if not spec.startswith(TINY_PREFIX) and not Path(spec).expanduser().exists():
        check_hub_model(spec, key)
    return resolve_model_path(spec)


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
        raise UserError(f"{key}={spec}: no such directory (and not a hub id); pass an existing "
                        "model directory or a hub id such as Qwen/Qwen2.5-0.5B-Instruct") from None
    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return
    prefix = f"{key}={spec!r} is not a local directory and not found on the hub"
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise UserError(f"{prefix}: HF_HUB_OFFLINE is set and it is not in the local hub cache; "
                        "check the spelling, or pass the model's local directory")
    try:
        HfApi().model_info(spec, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise UserError(f"{key}={spec!r} is a gated hub model: accept its licence on huggingface.co, "
                        "then log in (`hf auth login`) or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise UserError(f"{prefix} (check the spelling; a private model needs HF_TOKEN)") from None
    except Exception as exc:  # noqa: BLE001 - any network failure means the same thing here
        raise UserError(f"{prefix}: the hub could not be reached ({type(exc).__name__}: {exc}); download the "
                        f"model where there is network (`hf download {spec} --local-dir DIR`) and pass "
                        "--model DIR") from None


def load_tokenizer(model_path: str, spec: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for an unusable tokenizer
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"model.path={spec}: cannot load its tokenizer ({first_line}); the model "
                        "directory needs the tokenizer files saved next to the weights") from None


def check_data_file(path: str, key: str, tokenizer: Any, model_spec: str) -> None:
    """A readable parquet file with the required columns whose prompts the tokenizer can encode."""
    file = open_parquet(path)
    if file.metadata.num_rows == 0:
        raise UserError(f"data file {path} ({key}) has no rows")
    first = file.read_row_group(0, columns=["prompt"]).slice(0, 1).to_pylist()[0]["prompt"]
    if not isinstance(first, str) and not tokenizer.chat_template:
        raise UserError(f"data file {path} ({key}) holds chat prompts (lists of messages), but the tokenizer of "
                        f"model.path={model_spec} has no chat template; use a chat/instruct model or a data file "
                        "whose 'prompt' column holds plain strings")


def check_devices(config: RLConfig) -> None:
    """Enough devices on this machine for trainer.n_gpus_per_node x trainer.nnodes (training and,
    with split placement, rollout workers: one device each).

    With RAY_ADDRESS the workers run on a cluster's nodes, which `check_cluster` checks once
    the controller has connected.
    """
    if os.environ.get("RAY_ADDRESS"):
        return
    import torch

    trainer = config.trainer
    devices = trainer.n_gpus_per_node * trainer.nnodes
    gpus = torch.cuda.device_count()
    wanted = f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}" + (
        f" x trainer.nnodes={trainer.nnodes}" if trainer.nnodes > 1 else "")
    if trainer.device == "cuda" and gpus == 0:
        raise UserError("trainer.device=cuda, but no CUDA device is visible (CUDA_VISIBLE_DEVICES="
                        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use trainer.device=auto or cpu")
    if gpus and trainer.device != "cpu":
        if devices > gpus:
            raise UserError(f"{wanted} asks for {devices} GPUs, but this machine has {gpus} visible GPU(s); "
                            f"lower trainer.n_gpus_per_node to {gpus}, or set RAY_ADDRESS to a cluster with more")
        return
    cores = len(os.sched_getaffinity(0))
    if devices > cores:
        raise UserError(f"{wanted} asks for {devices} CPU worker processes (no GPU in use), but this machine has "
                        f"{cores} CPU core(s); lower trainer.n_gpus_per_node to at most {cores}")


def check_cluster(config: RLConfig, nodes: list[dict[str, Any]]) -> None:
    """`nodes` (ray.nodes()) has trainer.nnodes alive nodes with n_gpus_per_node devices each."""
    trainer = config.trainer
    total_gpus = sum(node["Resources"].get("GPU", 0) for node in nodes if node["Alive"])
    kind = "GPU" if trainer.device == "cuda" or (trainer.device == "auto" and total_gpus > 0) else "CPU"
    sizes = sorted((int(node["Resources"].get(kind, 0)) for node in nodes if node["Alive"]), reverse=True)
    if sum(size >= trainer.n_gpus_per_node for size in sizes) < trainer.nnodes:
        raise UserError(f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node} "
                        f"needs {trainer.nnodes} node(s) with {trainer.n_gpus_per_node} {kind}(s) each, but the Ray "
                        f"cluster at RAY_ADDRESS has {len(sizes)} alive node(s) with {sizes} {kind}(s); lower "
                        "them or add nodes")
