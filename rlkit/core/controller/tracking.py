"""Metrics sinks: a live rich table on the console, metrics.jsonl, TensorBoard, wandb."""

from __future__ import annotations

import io
import json
import logging
import math
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from rlkit.console import make_console
from rlkit.errors import UserError

METRICS_FILE = "metrics.jsonl"
# console.log gets one plain line per step through this logger (the run loop attaches the file).
step_logger = logging.getLogger("rlkit.metrics")

# The columns a person watches; everything else goes to the files.
CONSOLE_KEYS = [
    ("reward/mean", "reward"),
    ("val/reward/mean@1", "val"),
    ("response/length_mean", "resp len"),
    ("actor/pg_loss", "pg loss"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad norm"),
    ("rollout/log_prob_diff", "|Δlogp|"),
    ("perf/tokens_per_s", "tok/s"),
    ("timing/step", "step s"),
]
# The same for offline objectives (sft): the loss instead of rewards.
OFFLINE_CONSOLE_KEYS = [
    ("actor/loss", "loss"),
    ("val/loss", "val loss"),
    ("actor/token_accuracy", "tok acc"),
    ("actor/grad_norm", "grad norm"),
    ("actor/lr", "lr"),
    ("perf/loss_tokens", "tokens"),
    ("perf/tokens_per_s", "tok/s"),
    ("timing/step", "step s"),
]
# objective dpo: the preference metrics (TRL's names) next to the loss.
DPO_CONSOLE_KEYS = [
    ("actor/loss", "loss"),
    ("val/loss", "val loss"),
    ("rewards/accuracies", "acc"),
    ("val/rewards/accuracies", "val acc"),
    ("rewards/margins", "margin"),
    ("rewards/chosen", "chosen"),
    ("rewards/rejected", "rejected"),
    ("actor/grad_norm", "grad norm"),
    ("perf/tokens_per_s", "tok/s"),
    ("timing/step", "step s"),
]
# config.objective -> columns
CONSOLE_KEYS_BY_OBJECTIVE = {"rl": CONSOLE_KEYS, "sft": OFFLINE_CONSOLE_KEYS, "dpo": DPO_CONSOLE_KEYS}


class Tracker:
    def __init__(
        self,
        run_dir: Path,
        loggers: list[str],
        *,
        total_steps: int,
        start_step: int,
        project: str,
        name: str,
        config: dict[str, Any],
        console: Console | None = None,
        run_id: str | None = None,
        columns: list[tuple[str, str]] = CONSOLE_KEYS,
    ) -> None:
        """`start_step` > 0 continues a resumed run: sinks drop what was logged after that step.
        `columns`: (metric, title) of the live table and of console.log's step lines."""
        self.loggers, self.columns = loggers, columns
        self.jsonl = None
        if "jsonl" in loggers:
            truncate_metrics(run_dir / METRICS_FILE, start_step)
            self.jsonl = (run_dir / METRICS_FILE).open("a")
        self.tb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events a killed run logged after its checkpoint.
            self.tb = SummaryWriter(
                log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None
            )
        self.wandb = None
        if "wandb" in loggers:
            try:
                import wandb  # optional dependency: only when asked for
            except ImportError:
                raise UserError(
                    "trainer.logger lists wandb, but wandb is not installed; "
                    "`pip install wandb` or drop it from trainer.logger"
                ) from None
            self.wandb = wandb.init(
                project=project, name=name, config=config, dir=str(run_dir), id=run_id, resume="allow"
            )
        self.console = console or make_console()
        self.rows: list[dict[str, Any]] = []
        self.live = None
        # On a file or a pipe (nohup, SLURM, `| tee`) rich's Live would print its table once, at the end: a plain
        # line per step instead, as each step ends, with the table's columns.
        self.plain_lines = "console" in loggers and not self.console.is_terminal
        if "console" in loggers and not self.plain_lines:
            self.progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step)
            self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            self.live.start()

    def _render(self) -> Group:
        table = Table(box=None, pad_edge=False, header_style="bold cyan")
        # Fold, never "…": a narrow terminal shows a number on two lines rather than a cut one.
        table.add_column("step", justify="right", overflow="fold")
        for _, title in self.columns:
            table.add_column(title, justify="right", overflow="fold")
        for row in self.rows[-12:]:
            table.add_row(str(row["step"]), *[_fmt(row.get(key)) for key, _ in self.columns])
        return Group(table, self.progress)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in sorted(metrics.items())}}
        line = f"step {step}  " + "  ".join(f"{title}={_fmt(record.get(key))}" for key, title in self.columns)
        step_logger.info(line)
        if self.plain_lines:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        if self.jsonl:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        if self.tb:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.wandb:
            self.wandb.log(record, step=step)
        if self.live:
            self.rows.append(record)
            self.progress.update(self.task, completed=step)
            self.live.update(self._render())

    def message(self, text: str) -> None:
        self.console.print(text, soft_wrap=True)
        step_logger.info(Text.from_markup(text).plain)

    def show(self, table: Table) -> None:
        """A table once, above the live one; console.log gets its text."""
        self.console.print(table)
        plain = io.StringIO()
        Console(width=120, file=plain, color_system=None).print(table)
        step_logger.info("\n".join(line.rstrip() for line in plain.getvalue().splitlines()))

    def close(self) -> None:
        if self.live:
            self.live.stop()
            self.console.line()
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the records of steps <= last_step, so a resumed run logs each later step once.

    Also drops a half-written last line (a run killed mid-write).
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= last_step:
            kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl as records, skipping a half-written line."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def is_timing_key(key: str) -> bool:
    """Metrics that measure wall-clock time: they differ between otherwise identical runs."""
    return key.startswith(("timing/", "perf/tokens_per_s", "startup/")) or "seconds" in key


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)
