"""The loop around `Controller.step`: fresh or resumed, with checkpoints, status and console.log."""

from __future__ import annotations

import functools
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from rich.logging import RichHandler

from rlkit.console import make_console
from rlkit.core.cluster.failures import RunFailure, continue_hint
from rlkit.core.cluster.phases import profiled_step
from rlkit.core.cluster.profiling import summary_lines
from rlkit.core.controller import invariants
from rlkit.core.controller.controller import Controller
from rlkit.core.controller.interrupt import (
    RunInterrupted,
    StopOnSignal,
    stop_after_step,
    stopped_at_once,
)
from rlkit.core.controller.offline import OfflineController
from rlkit.core.controller.preflight import RunInputs, check_inputs
from rlkit.core.controller.tracking import (
    CONSOLE_KEYS_BY_OBJECTIVE,
    Tracker,
    step_logger,
)
from rlkit.core.controller.validation import (
    discard_generations_after,
    training_evaluator,
    validate,
    validation_due,
)
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import SYNTHETIC_TRAIN_FILE
from rlkit.core.rollout.sync_check import check_weight_sync
from rlkit.core.state import provenance
from rlkit.core.state.checkpoint import Checkpoint, discard_after
from rlkit.core.state.run_dir import RunDir, check_run_id
from rlkit.core.state.shards import seed_rng
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig, TrainerConfig

CONSOLE_LOG = "console.log"
logger = logging.getLogger("rlkit")


def run_training(config: RLConfig, run: RunDir, inputs: RunInputs, resume_from: Checkpoint | None = None) -> Path:
    """Train steps (resume_from.step + 1 or 1) .. trainer.total_steps on the checked `inputs`;
    returns the run directory."""

    trainer = config.trainer
    start = resume_from.step if resume_from else 0
    controller = tracker = None
    with (
        run_log(run.path / CONSOLE_LOG),
        StopOnSignal(logger.warning, save_on_interrupt=trainer.save_on_interrupt) as stop,
    ):
        if run.restarted:
            logger.warning(
                "run directory %s held no checkpoint (its run stopped before the first one): "
                "starting run %s there again, replacing that attempt's logs and metrics",
                run.path,
                run.run_id,
            )
        logger.info(
            "%s run %s at step %d of %d",
            "resuming" if resume_from else "starting",
            run.run_id,
            start,
            trainer.total_steps,
        )
        run.write_status("running", step=start, total_steps=trainer.total_steps, error=None)
        # The controller's own draws (checkpointed as controller_rng.pt) start from the seed; a
        # resume then restores them from its checkpoint.
        seed_rng(trainer.seed)
        try:
            controller = make_controller(config, run, inputs)
            config = controller.config  # with what the workers resolved at start-up (actor.micro_batch_tokens)
            provenance.write(run.path, config)  # after the run dir holds a synthetic task's data
            logger.info(controller.fast_paths.describe())
            validation = validation_fn(controller, run.path)
            if resume_from:
                discard_after(run.path, start)
                discard_generations_after(run.path, start)
                controller.load_checkpoint(resume_from)
            stop.finish_steps()
            tracker = Tracker(
                run.path,
                trainer.logger,
                total_steps=trainer.total_steps,
                start_step=start,
                project=trainer.project_name,
                name=trainer.experiment_name or run.run_id,
                config=config.model_dump(mode="json"),
                run_id=run.run_id,
                columns=CONSOLE_KEYS_BY_OBJECTIVE[config.objective],
            )
            headline: list[float] = []  # the training metric the summary compares (reward, or the loss)
            val_scores: dict[int, float] = {}  # step -> the validation metric, for the summary
            controller.startup.mark("run_setup")
            if validation and trainer.val_before_train and not resume_from:
                val_metrics = validation(0)
                val_scores[0] = val_metrics[controller.VAL_KEY]
                tracker.log(val_metrics, 0)
                controller.startup.mark("first_validation")
            for step in range(start + 1, trainer.total_steps + 1):
                with profiled_step(controller.checkpoint_groups, run.path, step, trainer.profile_steps) as profile:
                    metrics = controller.step(step)
                if profile is not None:
                    logger.info("step %d profiled: per phase and rank, a table and a Chrome trace in %s", step, profile)
                    for line in summary_lines(profile):
                        logger.info("  rank 0 %s", line)
                startup = controller.startup.finish()  # the first step's start-up parts, {} after: docs/startup.md
                metrics.update(startup)
                check_weight_sync(metrics, config.rollout, step)  # a stale rollout engine stops the run here
                headline.append(metrics[controller.TRAIN_KEY])
                if validation and validation_due(step, trainer):  # the policy this step's checkpoint holds
                    metrics.update(validation(step))
                    val_scores[step] = metrics[controller.VAL_KEY]
                tracker.log(metrics, step)
                if startup:
                    tracker.show(controller.startup.table())
                invariants.check_step(config, step, metrics)  # after logging: the broken step's metrics are kept
                controller.completed_steps = step
                run.write_status("running", step=step)  # with metrics.jsonl, not after a long checkpoint
                if should_save(step, trainer):
                    path = controller.save_checkpoint("final" if step == trainer.total_steps else "periodic")
                    logger.info("checkpoint of step %d: %s", step, path)
                    run.write_status("running", last_checkpoint=step)
                if stop.requested:
                    raise stop_after_step(controller, run, stop, saved=should_save(step, trainer))
            run.write_status("finished")
            tracker.message(summary(headline, start, run.path, val_scores, controller.TRAIN_KEY, controller.VAL_KEY))
        except (KeyboardInterrupt, RunInterrupted) as exc:
            if isinstance(exc, KeyboardInterrupt):  # a second signal, or one during start-up
                exc = stopped_at_once(run, stop, controller.completed_steps if controller else start)
            record_status(run, "interrupted", error=str(exc))
            raise exc from None
        except BaseException as exc:
            record_status(run, "failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            if isinstance(exc, (RunFailure, UserError)):  # a reward that failed mid-run, too
                exc.next_step = continue_hint(run.path, run.run_id)
            raise
        finally:
            if tracker:
                tracker.close()
            if controller:
                controller.close()
    return run.path


def record_status(run: RunDir, status: str, **fields: object) -> None:
    """status.json at the end of a run, which must not hide the run's own error (e.g. a full disk)."""
    try:
        run.write_status(status, **fields)
    except OSError as exc:
        logger.warning("could not record status %r in %s: %s", status, run.path, exc)


def make_controller(config: RLConfig, run: RunDir, inputs: RunInputs) -> Controller | OfflineController:
    """The RL controller, or the offline one for objectives that train on a data set's rows."""
    return OfflineController(config, run, inputs) if config.offline else Controller(config, run, inputs)


def validation_fn(
    controller: Controller | OfflineController, run_path: Path
) -> Callable[[int], dict[str, float]] | None:
    """What validates the policy after a step (its `val/...` metrics); None without validation data."""
    if isinstance(controller, OfflineController):
        return controller.validate if controller.val_rows else None
    evaluator = training_evaluator(
        controller.config, run_path, controller.tokenizer, controller.scorer, controller.placement.rollout
    )
    return functools.partial(validate, evaluator, run_path) if evaluator else None


def summary(
    values: list[float],
    start: int,
    run_path: Path,
    val_scores: dict[int, float],
    train_key: str = "reward/mean",
    val_key: str = "val/reward/mean@1",
) -> str:
    window = min(5, len(values))
    steps = sorted(val_scores)
    validation = (
        f"; {val_key} {val_scores[steps[0]]:.3f} (step {steps[0]}) -> {val_scores[steps[-1]]:.3f} (step {steps[-1]})"
        if len(steps) > 1
        else ""
    )
    return (
        f"[bold green]done:[/] steps {start + 1}-{start + len(values)}; {train_key} "
        f"{sum(values[:window]) / window:.3f} (first {window}) -> {sum(values[-window:]) / window:.3f} "
        f"(last {window}){validation}; run dir {run_path}\n      curves: rlkit plot {run_path.name} --runs-dir "
        f"{run_path.parent}  |  model: rlkit export {run_path.name} --runs-dir {run_path.parent} --out DIR"
    )


def should_save(step: int, trainer: TrainerConfig) -> bool:
    """Every save_freq steps, and always after the last one (so every finished run can be exported)."""
    return step == trainer.total_steps or (trainer.save_freq > 0 and step % trainer.save_freq == 0)


@contextmanager
def run_log(path: Path) -> Iterator[None]:
    """rlkit's log records into the run's console.log, and on screen.

    The per-step lines stay off the screen (the live table shows them); rich's Live prints the
    other messages above the table. Re-entrant: `rlkit resume` opens it before choosing a checkpoint,
    so its warnings land in the file too.
    """
    if any(isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path.absolute() for h in logger.handlers):
        yield
        return
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    screen = _screen_handler()
    screen.addFilter(lambda record: record.name != step_logger.name)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(file_handler)
    logger.addHandler(screen)
    try:
        yield
    finally:
        logger.removeHandler(file_handler)
        logger.removeHandler(screen)
        logger.setLevel(previous_level)
        file_handler.close()


def _screen_handler() -> logging.Handler:
    """Rich's log layout on a terminal; plain whole lines when stderr is a file or a pipe (rich
    would wrap them at 80 columns, or pad them to the width of an unlimited console)."""
    console = make_console(stderr=True, soft_wrap=True)
    if console.is_terminal:
        return RichHandler(console=console, show_time=False, show_path=False)
    plain = logging.StreamHandler(sys.stderr)
    plain.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
    return plain


def train_run(config: RLConfig, run_id: str | None = None) -> Path:
    """Check every input, then create the run directory and train config.trainer.total_steps steps;
    returns the run dir."""
    if run_id is not None:
        check_run_id(run_id)  # before the inputs' checks load the model: RunDir.create checks it again
    inputs = check_inputs(config)
    run = RunDir.create(config, run_id)
    if inputs.generated is not None:  # data.synthetic_task: the run dir keeps the prompts it trained on
        write_parquet(inputs.generated, run.path / SYNTHETIC_TRAIN_FILE)
    return run_training(config, run, inputs)
