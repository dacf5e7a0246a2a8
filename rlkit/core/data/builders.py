"""Dataset builders for `rlkit prep-data NAME`: each returns rows in the training schema.

A row (one parquet record, the schema verl users already have):
  data_source  str                      picks the reward function
  prompt       list[{role, content}]    chat messages, rendered by the tokenizer's template
  ability      str
  reward_model {style, ground_truth}    ground_truth is a string
  extra_info   {split, index, ...}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rlkit.core.registry import Registry

Row = dict[str, Any]
# fn(source: str | None, **options) -> {"train": rows, "test": rows}
Builder = Callable[..., dict[str, list[Row]]]
DATASET_BUILDERS: Registry[Builder] = Registry("dataset builder")


def make_row(data_source: str, content: str, ground_truth: str, *, split: str, index: int,
             ability: str = "math", **extra: Any) -> Row:
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
