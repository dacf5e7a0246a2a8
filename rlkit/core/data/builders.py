"""Dataset builders for `rlkit prep-data NAME`: each returns rows in the training schema.

A row (one parquet record, the schema verl users already have):
  data_source  str                      picks the reward function
  prompt       list[{role, content}]    chat messages, rendered by the tokenizer's template
  ability      str
  reward_model {style, ground_truth}    ground_truth is a string
  extra_info   {split, index, ...}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rlkit.errors import UserError

Row = dict[str, Any]


@dataclass(frozen=True)
class Dropped:
    """In place of a row: a source record the builder skipped; prep-data counts them by reason."""

    reason: str


# fn(source: str | None, **options) -> {"train": rows, "test": rows}; rows may include Dropped
Builder = Callable[..., dict[str, list["Row | Dropped"]]]


def make_row(
    data_source: str, content: str, ground_truth: str, *, split: str, index: int, ability: str = "math", **extra: Any
) -> Row:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **extra},
    }


def write_parquet(rows: list[Row], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def load_builder(spec: str) -> Builder:
    """A user builder named 'path/file.py:function' (`rlkit prep-data --builder`)."""
    from rlkit.core.rewards.custom import load_function

    return load_function(spec, "--builder")


def read_source(
    source: str | None, hub_name: str, hub_config: str | None = None, splits: tuple[str, ...] = ("train", "test")
) -> dict[str, list[dict[str, Any]]]:
    """Raw records per split: from the local directory `source`, else from the hub via `datasets`.

    A local directory holds one file per split: {split}.jsonl, {split}.parquet or
    {split}-*.parquet / {split}-*.jsonl (the hub's shard names).
    """
    if source is None:
        return _read_hub(hub_name, hub_config, splits)
    directory = Path(source).expanduser()
    if not directory.is_dir():
        raise UserError(
            f"--source {source}: not a directory; pass the directory holding "
            f"{'/'.join(splits)} files as .jsonl or .parquet"
        )
    records = {}
    for split in splits:
        files = sorted(
            p
            for pattern in (f"{split}.*", f"{split}-*")
            for p in directory.glob(pattern)
            if p.suffix in (".jsonl", ".parquet")
        )
        if not files:
            raise UserError(
                f"--source {source}: no {split}.jsonl or {split}.parquet in it "
                f"(found: {sorted(p.name for p in directory.iterdir()) or 'nothing'})"
            )
        records[split] = [record for file in files for record in _read_file(file)]
    return records


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for "not parquet"
            raise UserError(f"{path} is not a readable parquet file: {exc}") from None
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}, line {number}: not valid JSON ({exc})") from None
    return records


def _read_hub(name: str, config: str | None, splits: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"downloading {name} needs the `datasets` package: pip install 'rlkit[hub]', "
            "or pass --source DIR with local train/test .jsonl or .parquet files"
        ) from None
    try:
        loaded = datasets.load_dataset(name, config)
    except Exception as exc:  # network, auth, missing dataset: all fixable the same way
        raise UserError(
            f"could not load {name} from the Hugging Face hub ({type(exc).__name__}: {exc}); "
            "pass --source DIR with local train/test .jsonl or .parquet files"
        ) from None
    missing = [s for s in splits if s not in loaded]
    if missing:
        raise UserError(f"{name} on the hub has no split(s) {missing} (it has {list(loaded)})")
    return {split: loaded[split].to_list() for split in splits}
