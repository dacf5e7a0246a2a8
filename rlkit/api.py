"""The Python API: `rlkit.train`, `rlkit.resume` and `Run`, the same work as `rlkit train`, `rlkit resume`,
`rlkit runs show` and `rlkit export`, called from a script or a notebook (docs/python_api.md).

A mistake in the inputs raises rlkit.errors.UserError (ConfigError for a recipe or an override) with the
message the command line prints before its exit code 2; a run that fails raises
rlkit.core.cluster.failures.RunFailure (the command line's exit code 1), one stopped by Ctrl-C
rlkit.core.controller.interrupt.RunInterrupted. Nothing here exits the interpreter.

Importing this module imports nothing heavy (torch, Ray, vLLM load when a run starts), so `import rlkit` stays
cheap (tests/test_python_api.py pins it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlkit.core.state.checkpoint import Checkpoint
    from rlkit.recipes.loader import Overrides

RUNS_DIR_ENV = "RLKIT_RUNS_DIR"  # the command line's --runs-dir default, read here the same way


def train(
    recipe: str | Path, *, model: str | None = None, overrides: Overrides | None = None, run_id: str | None = None
) -> Run:
    """Train with a recipe, as `rlkit train RECIPE [KEY=VALUE ...] [--model M] [--run-id ID]` does; returns the
    finished run.

    `recipe`: a built-in recipe's name (`rlkit recipes list`) or a recipe .yaml file. `model`: a hub id or a
    local model directory (model.path). `overrides`: {dotted key: value}, the command line's KEY=VALUE with
    Python values (`{"rollout.n": 8, "trainer.logger": ["jsonl"]}`); a reward function, an environment
    class, tools or an agent function may be the objects themselves (`{"reward.function": my_reward}`): they
    must pickle with cloudpickle, since the run's other processes receive copies. The run directory is
    trainer.runs_dir/run_id (default: recipe-date-time).
    """
    from rlkit.core.controller.loop import train_run
    from rlkit.recipes.loader import load_config

    config = load_config(str(recipe), overrides, model=model)
    return Run(train_run(config, run_id=run_id))


def dry_run(recipe: str | Path, *, model: str | None = None, overrides: Overrides | None = None) -> list[str]:
    """`rlkit train RECIPE --dry-run`'s checks, which need no GPU: the model, its tokenizer, every training prompt,
    the environment or tools, and the reward called on the first two training rows under reward.timeout_s, as
    the run will call it. Returns what was checked and what was skipped, a line each; raises UserError at the
    first problem. Arguments as `train`'s (model and data may still be missing: what needs them is skipped)."""
    from rlkit.core.controller.preflight import Preflight
    from rlkit.recipes.loader import load_config

    checks = Preflight(load_config(str(recipe), overrides, model=model, require_inputs=False), dry_run=True)
    checks.run()
    return [f"ok: {line}" for line in checks.checked] + [f"skipped: {line}" for line in checks.skipped]


def resume(run: str | Path | Run, *, overrides: Overrides | None = None, runs_dir: str | Path | None = None) -> Run:
    """Continue a run exactly from its latest complete checkpoint, as `rlkit resume RUN [KEY=VALUE ...]` does.

    `run`: a run id under `runs_dir` (default: $RLKIT_RUNS_DIR or ./runs), a run directory, or a Run.
    `overrides` may change only what cannot change the math (trainer.total_steps, logging, validation, ...);
    a Python object the run was started with (its reward function, environment, tools) is given again here,
    under its key, unless config.yaml names it by an importable module.
    """
    from rlkit.core.controller.resume import resume_run

    target = str(run.path) if isinstance(run, Run) else str(run)
    return Run(resume_run(target, overrides, _runs_dir(runs_dir)))


class Run:
    """A run directory: its id, config, status, per-step metrics and checkpoints, read from the files the run
    writes (config.yaml, status.json, metrics.jsonl, checkpoints/), so a run still training, finished,
    failed or written by another process reads the same. `Run.load` opens one by id or path."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.id = self.path.name

    @classmethod
    def load(cls, run: str | Path, runs_dir: str | Path | None = None) -> Run:
        """An existing run: its id under `runs_dir` (default: $RLKIT_RUNS_DIR or ./runs) or its directory;
        UserError naming the runs there when there is none."""
        from rlkit.core.state.run_dir import RunDir

        return cls(RunDir.open(str(run), _runs_dir(runs_dir)).path)

    @property
    def config(self) -> dict[str, Any]:
        """config.yaml: the resolved config the run started (or was last resumed) with, as plain data."""
        import yaml

        return yaml.safe_load((self.path / "config.yaml").read_text()) or {}

    @property
    def status(self) -> dict[str, Any]:
        """status.json: status (running, finished, failed, interrupted, or dead: its process is gone), step,
        total_steps, last_checkpoint, error."""
        from rlkit.core.state.run_dir import RunDir

        return RunDir(self.id, self.path).read_status()

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """One record per logged step, oldest first, as metrics.jsonl holds them: `step` and every metric the step
        logged (reward/mean, actor/loss, timing/..., val/... on validation steps; step 0: the validation
        before training). UserError when the run does not write metrics.jsonl (trainer.logger without jsonl)."""
        from rlkit.core.controller.tracking import METRICS_FILE, read_metrics
        from rlkit.errors import UserError

        path = self.path / METRICS_FILE
        loggers = (self.config.get("trainer") or {}).get("logger") or []
        if not path.exists() and "jsonl" not in loggers:
            raise UserError(
                f"run {self.id} writes no {METRICS_FILE} (trainer.logger={loggers}); "
                "train with jsonl in trainer.logger to read its metrics"
            )
        return read_metrics(path)

    def history(self, key: str) -> dict[int, float]:
        """step -> value of metric `key` (e.g. 'reward/mean', 'val/reward/mean@1'), for the steps that logged it."""
        return {record["step"]: record[key] for record in self.metrics if key in record}

    @property
    def checkpoints(self) -> list[Checkpoint]:
        """The complete checkpoints (step, path), oldest first; damaged or half-written ones are left out
        (`rlkit runs show` lists them with the reason)."""
        from rlkit.core.state.checkpoint import list_checkpoints

        return [c for c in list_checkpoints(self.path) if c.problem is None]

    def export(
        self, out: str | Path, *, step: int | None = None, dtype: str = "auto", lora_format: str | None = None
    ) -> Path:
        """A checkpoint's policy (default: the latest complete one) as a Hugging Face model directory `out`, as
        `rlkit export` writes it (a LoRA run's also as a peft adapter, `lora_format`); returns `out`."""
        from rlkit.core.state.run_dir import RunDir
        from rlkit.core.train.export import export_hf

        return export_hf(RunDir(self.id, self.path), out, step=step, dtype=dtype, lora_format=lora_format)

    def resume(self, *, overrides: Overrides | None = None) -> Run:
        """`rlkit.resume(self, overrides=...)`."""
        return resume(self, overrides=overrides)

    def __repr__(self) -> str:
        status = self.status
        return (
            f"Run({self.id!r}, status={status.get('status')}, "
            f"step={status.get('step', '-')}/{status.get('total_steps', '-')}, path={str(self.path)!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and self.path.resolve() == other.path.resolve()

    def __hash__(self) -> int:
        return hash(self.path.resolve())


def _runs_dir(runs_dir: str | Path | None) -> str | Path:
    return runs_dir if runs_dir is not None else os.environ.get(RUNS_DIR_ENV, "runs")
