"""`rlkit eval`: the run's validation, offline, of a run's checkpoint or of a model directory.

The same `Evaluator` as in training (rlkit.core.controller.validation), with one rollout engine
in this process (no Ray, no process group); an agent run's episodes run its agent loop on it. A
checkpoint's float32 policy is streamed into an engine started from the run's base model through
the engine's own `load_weights`, as the trainer's weight sync does, so the engine holds what the
run's engines held after that step; settings and seeds come from the config the checkpoint was
trained with. A run with one rollout engine gets the numbers its validation of that step logged;
with several, each engine saw a slice of the prompts, and a different batch can move float
rounding (rarely a token).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from rlkit.core.cluster.local_group import release_engines
from rlkit.core.controller.validation import (
    VALIDATION_DIR,
    Evaluator,
    ValSettings,
    engine_episodes,
    scorer_score,
    validation_rows,
)
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.base import RolloutEngine
from rlkit.core.state import checkpoint
from rlkit.core.state.run_dir import RunDir, find_run, prepare_val_files, resolve_model_path
from rlkit.core.train.export import EXPORT_CONFIG, EXPORT_INFO, load_policy
from rlkit.errors import UserError
from rlkit.recipes.loader import EVAL_OVERRIDES, load_config
from rlkit.recipes.schema import RLConfig

DEFAULT_RECIPE = "grpo"  # the settings of a model directory that carries no rlkit config


@dataclass
class EvalTarget:
    """What to score: the engine's starting model, the checkpoint loaded into it (if any), the settings."""

    label: str
    config: RLConfig
    model_path: str  # the engine and the tokenizer start from it
    step: int  # the step whose validation seeds are used
    checkpoint: checkpoint.Checkpoint | None = None  # its policy replaces the starting weights
    run: RunDir | None = None


@dataclass
class EvalReport:
    label: str
    model_path: str
    step: int
    data: list[str]
    rows: int
    metrics: dict[str, float]
    generations: str | None = None
    settings: dict[str, float | int] = field(default_factory=dict)


def eval_config(recipe: str, overrides: list[str]) -> RLConfig:
    """The config a model is validated with: the run's (or a recipe's) with `rlkit eval`'s overrides, which may
    set validation's sampling also for a model trained by SFT or DPO (objectives that generate nothing)."""
    return load_config(recipe, overrides, require_inputs=False, overrides_origin=EVAL_OVERRIDES)


def resolve_target(target: str, *, step: int | None, overrides: list[str], runs_dir: str | Path) -> EvalTarget:
    """A run id or run directory (its checkpoint at `step`, default the latest; 0 = the base model),
    or a model directory (an `rlkit export` carries its run's config and step; any other takes the
    grpo recipe's settings)."""
    path = Path(target).expanduser()
    if find_run(target, runs_dir) is not None:
        run = RunDir.open(target, runs_dir)
        if step == 0:  # before training: the base model, with the run's settings
            config = eval_config(str(run.path / "config.yaml"), overrides)
            return EvalTarget(f"{run.run_id} (base model)", config, resolve_model_path(config.model.path), 0, run=run)
        ckpt = checkpoint.checkpoint_at(run.path, step)
        config = eval_config(str(ckpt.path / checkpoint.CONFIG_FILE), overrides)
        return EvalTarget(
            f"{run.run_id} step {ckpt.step}",
            config,
            resolve_model_path(config.model.path),
            ckpt.step,
            checkpoint=ckpt,
            run=run,
        )
    if not (path / "config.json").is_file():
        raise UserError(
            f"{target!r} is neither a run (none under --runs-dir {runs_dir}) nor a model directory "
            "(no config.json); pass a run id, a run directory or an `rlkit export` directory"
        )
    exported = path / EXPORT_CONFIG
    recipe = str(exported) if exported.is_file() else DEFAULT_RECIPE
    config = eval_config(recipe, [*overrides, f"model.path={path}"])
    info = json.loads((path / EXPORT_INFO).read_text()) if (path / EXPORT_INFO).is_file() else {}
    seed_step = step if step is not None else int(info.get("step", 0))
    return EvalTarget(str(path), config, str(path), seed_step)


def evaluate_offline(target: EvalTarget, *, data: list[str] | None = None, out: Path | None = None) -> EvalReport:
    """Validate `target` on `data` (default: the run's validation prompts); write every response to `out`
    (default for a run: RUN/validation/eval_step_<N>.jsonl)."""
    from transformers import AutoTokenizer

    config = target.config
    with tempfile.TemporaryDirectory(prefix="rlkit-eval-") as scratch:
        files = list(data) if data else prepare_val_files(config, Path(scratch))
        if not files:
            raise UserError("no validation prompts: pass --data FILE.parquet (the config has no data.val_files)")
        tokenizer = AutoTokenizer.from_pretrained(target.model_path)
        rows = validation_rows(files, config, tokenizer)
    if out is None and target.run is not None:
        out = target.run.path / VALIDATION_DIR / f"eval_step_{target.step:08d}.jsonl"
    settings = ValSettings.from_config(config)
    try:
        metrics = _evaluate(target, rows, tokenizer, settings, out)
    finally:  # a library caller may evaluate again, or train, in this process
        release_engines()
    return EvalReport(
        target.label,
        target.model_path,
        target.step,
        files,
        len(rows),
        metrics,
        str(out) if out else None,
        {"val_n": settings.n, "temperature": settings.temperature, "max_tokens": settings.max_tokens},
    )


def _evaluate(
    target: EvalTarget, rows: list[PromptRow], tokenizer: Any, settings: ValSettings, out: Path | None
) -> dict[str, float]:
    """The validation metrics of `target`'s engine on `rows`; the engine is gone when this returns."""
    config = target.config
    engine = start_engine(target)
    with RewardScorer(config.reward) as scorer:
        evaluator = Evaluator(
            rows,
            tokenizer,
            settings,
            engine_episodes(engine, config, tokenizer),
            scorer_score(scorer),
            config.reward,
            config.rollout.agent,
        )
        return evaluator.run(target.step, out)


def start_engine(target: EvalTarget) -> RolloutEngine:
    """config.rollout.name's engine in this process, set up as a training worker sets up its own, holding
    the checkpoint's policy when the target has one."""
    from rlkit.core.cluster.worker_env import worker_env
    from rlkit.core.rollout.engines import make_engine
    from rlkit.core.train import fsdp

    cfg = target.config
    for key, value in worker_env(cfg).items():  # the workers' settings (vLLM's CPU KV cache, ...), unless set
        os.environ.setdefault(key, value)
    use_cuda = cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    engine = make_engine(
        cfg.rollout,
        target.model_path,
        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        device=device,
        dtype=fsdp.compute_dtype(cfg.model.dtype, device),
        seed=cfg.trainer.seed,
        sleep_mode=False,
    )
    if target.checkpoint is not None:
        engine.load_weights(_policy_tensors(target.checkpoint, target.model_path, device))
    return engine


def _policy_tensors(ckpt: checkpoint.Checkpoint, base: str, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) per parameter, as the weight sync streams them (TrainableModel.engine_weights)."""
    model, lora = load_policy(ckpt, base)
    if lora is not None:  # the engine takes base-model names: the adapters merged in, as the weight sync does
        model = model.merge_and_unload()
    for name, param in model.named_parameters():
        yield name, param.detach().to(device)
