"""What a person sees of an SFT run: the live table's and console.log's loss columns, `runs show`,
and the plot's loss panels."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from conftest import invoke
from rich.console import Console

from rlkit.cli import run_cmds
from rlkit.core.controller.plot import OFFLINE_PANELS, panels_for, plot_run
from rlkit.core.state.run_dir import RunDir
from rlkit.core.controller.tracking import OFFLINE_CONSOLE_KEYS, Tracker, read_metrics, step_logger
from rlkit.recipes.loader import load_config


def sft_run(runs: Path) -> RunDir:
    """Steps 1-2 of an SFT run, validated at 0 and 2."""
    config = load_config("sft", [f"trainer.runs_dir={runs}", "trainer.total_steps=2", "model.path=m",
                                 "data.train_files=[t.parquet]"])
    run = RunDir.create(config, "sftrun")
    records = [{"step": 0, "val/loss": 4.0, "val/token_accuracy": 0.0, "timing/val": 0.1}]
    for step in (1, 2):
        records.append({"step": step, "actor/loss": 3.0 / step, "actor/token_accuracy": 0.25 * step,
                        "actor/grad_norm": 1.5, "actor/lr": 1e-5, "perf/loss_tokens": 32.0,
                        "perf/tokens_per_s": 1000.0, "timing/step": 0.5, "timing/update": 0.4})
    records[-1].update({"val/loss": 2.0, "val/token_accuracy": 0.5})
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run.write_status("finished", step=2, total_steps=2)
    return run


def test_the_live_table_and_console_log_show_the_loss_columns(tmp_path: Path, caplog) -> None:
    console = Console(record=True, width=200, force_terminal=True)  # a terminal: the live table
    tracker = Tracker(tmp_path, ["console"], total_steps=2, start_step=0, project="p", name="n", config={},
                      console=console, columns=OFFLINE_CONSOLE_KEYS)
    with caplog.at_level(logging.INFO, logger=step_logger.name):
        tracker.log({"actor/loss": 1.25, "actor/token_accuracy": 0.5, "actor/grad_norm": 2.0, "actor/lr": 1e-5,
                     "perf/loss_tokens": 32.0, "perf/tokens_per_s": 900.0, "timing/step": 0.25}, 1)
    tracker.close()
    header = next(line for line in console.export_text().splitlines() if "val loss" in line)
    assert header.split() == ["step", "loss", "val", "loss", "tok", "acc", "grad", "norm", "lr", "tokens", "tok/s",
                              "step", "s"]
    assert "step 1  loss=1.25  val loss=-  tok acc=0.5  grad norm=2  lr=1e-05  tokens=32  tok/s=900  step s=0.25" \
        in caplog.text


def test_runs_show_prints_the_loss_and_the_validation_loss(tmp_path: Path) -> None:
    sft_run(tmp_path)
    result = invoke(run_cmds.register, "runs", "show", "sftrun", "--runs-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    rows = {line.replace("│", " ").split()[0]: line.replace("│", " ").split()[1:]
            for line in result.output.splitlines() if "/" in line and "│" in line}
    assert rows["actor/loss"] == ["1.5"] and rows["actor/token_accuracy"] == ["0.5"]
    assert rows["val/loss"] == ["4", "2"]  # steps 0 and 2
    assert "validation (2 times)" in result.output  # no generated responses to point to


def test_runs_list_shows_an_sft_runs_loss(tmp_path: Path) -> None:
    sft_run(tmp_path)
    result = invoke(run_cmds.register, "runs", "list", "--runs-dir", str(tmp_path))
    row = next(line for line in result.output.splitlines() if "sftrun" in line)
    assert "loss 1.5" in row and "2/2" in row


def test_the_plot_draws_the_loss_panels(tmp_path: Path) -> None:
    run = sft_run(tmp_path)
    assert panels_for(read_metrics(run.path / "metrics.jsonl")) == OFFLINE_PANELS
    assert plot_run(run.path, tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plan_of_an_sft_run_is_the_update_alone() -> None:
    from rlkit.core.planning.plan import build_plan

    common = ["model.path=rlkit:tiny-qwen2", "data.train_files=[t.parquet]", "data.train_batch_size=64",
              "actor.mini_batch_size=32", "data.max_prompt_length=64", "data.max_response_length=64",
              "actor.micro_batch_tokens=4096", "trainer.device=cuda"]
    sft = build_plan(load_config("sft", common), gpu_memory_gib=80)
    # The same update on RL's side: one sample per prompt, no reference, no engine phases counted.
    rl = build_plan(load_config("grpo", [*common, "rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus",
                                         "actor.use_kl_loss=false"]), gpu_memory_gib=80)
    assert set(sft.memory.phases) == {"update"} and sft.kv is None
    assert sft.memory.phases["update"] == rl.memory.phases["update"]
    assert set(sft.time.phases) == {"update"}
    assert sft.time.phases["update"] == rl.time.phases["update_actor"]
