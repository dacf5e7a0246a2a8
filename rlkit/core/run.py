"""A run's directory and the inputs it resolves: model path, data files."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml
from rlkit.recipes.schema import RLConfig

TINY_PREFIX = "rlkit:"


@dataclass
class RunDir:
    run_id: str
    path: Path

    @classmethod
    def create(cls, config: RLConfig, run_id: str | None = None) -> RunDir:
        run_id = run_id or f"{config.recipe}-{dt.datetime.now():%Y%m%d-%H%M%S}"
        path = Path(config.trainer.runs_dir).expanduser() / run_id
        if path.exists() and any(path.iterdir()):
            raise UserError(f"run directory {path} already exists; pick another --run-id "
                            f"or continue it with `rlkit resume {run_id}`")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create run directory {path}: {exc.strerror}; set trainer.runs_dir") from None
        (path / "config.yaml").write_text(config_to_yaml(config))
        return cls(run_id, path)


def resolve_model_path(spec: str) -> str:
    """'rlkit:tiny-qwen2' builds (once) a tiny offline model; anything else is a path or hub id."""
    if spec.startswith(TINY_PREFIX):
        name = spec[len(TINY_PREFIX):]
        if name != "tiny-qwen2":
            raise UserError(f"model.path={spec!r}: the only built-in model is 'rlkit:tiny-qwen2'")
        from rlkit.core.tiny import build_tiny_qwen2

        cache = Path(os.environ.get("RLKIT_CACHE", Path.home() / ".cache" / "rlkit")) / name
        if not (cache / "config.json").exists():
            build_tiny_qwen2(cache)
        return str(cache)
    local = Path(spec).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise UserError(f"model.path={spec}: the directory has no config.json (not a transformers model)")
        return str(local)
    return spec


def prepare_data_files(config: RLConfig, run_path: Path) -> list[str]:
    """The training parquet files; a synthetic task is generated into the run directory."""
    if config.data.train_files:
        return [str(Path(f).expanduser()) for f in config.data.train_files]
    from rlkit.core.data.builders import write_parquet
    from rlkit.core.data.synthetic import build_synthetic

    splits = build_synthetic(task=config.data.synthetic_task, seed=config.trainer.seed)
    return [str(write_parquet(splits["train"], run_path / "data" / "train.parquet"))]
