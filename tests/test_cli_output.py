"""Output that goes to a file or a pipe is whole: no line cut at 80 columns, no cell ending in '…'."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import yaml

from rlkit.console import make_console
from rlkit.core.controller.loop import logger, run_log
from rlkit.core.state.run_dir import RunDir
from rlkit.core.controller.tracking import CONSOLE_KEYS, Tracker
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic
from rlkit.recipes.loader import BUILTIN_DIR, load_config

ROOT = Path(__file__).resolve().parents[1]


def rlkit_piped(*args: str) -> str:
    """`rlkit ARGS | cat`: stdout is a pipe, as in `rlkit recipes show dapo > x.yaml`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    proc = subprocess.run([sys.executable, "-m", "rlkit.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_recipes_show_redirected_is_the_recipe_file_itself() -> None:
    text = (BUILTIN_DIR / "dapo.yaml").read_text()
    assert max(map(len, text.splitlines())) > 80  # its description line
    assert rlkit_piped("recipes", "show", "dapo") == text.rstrip("\n") + "\n"


def test_a_dry_run_redirected_prints_long_values_whole(tmp_path: Path) -> None:
    data = tmp_path / ("a-folder-with-a-long-name-" * 4) / "train.parquet"
    # A dry run checks the data too: a real file of echo prompts.
    write_parquet(build_synthetic(task="echo", n_train=32, n_test=1, seed=0)["train"], data)
    out = rlkit_piped("train", "grpo-demo", f"data.train_files=[{data}]", "--dry-run")
    resolved = yaml.safe_load(out.split("Batch arithmetic")[0])
    assert resolved["data"]["train_files"] == [str(data)]


def test_runs_list_piped_keeps_every_column_whole(tmp_path: Path) -> None:
    run_id = "grpo-gsm8k-qwen2.5-7b-instruct-lr1e-6-n16-20261130-101500"
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}", "trainer.total_steps=120"])
    run = RunDir.create(config, run_id)
    (run.path / "metrics.jsonl").write_text('{"step": 7, "reward/mean": 0.123456}\n')
    run.write_status("finished", step=7, total_steps=120)
    out = rlkit_piped("runs", "list", "--runs-dir", str(tmp_path))
    row = next(line for line in out.splitlines() if run_id in line)
    updated = run.read_status()["updated_at"]
    for cell in (run_id, "grpo-demo", "finished", "7/120", "0.1235", "0", updated):
        assert f" {cell} " in row, (cell, row)
    assert "…" not in out


def test_the_step_table_in_a_log_file_prints_whole_numbers(tmp_path: Path, capsys) -> None:
    # stdout is pytest's capture here: not a terminal, as under nohup or `| tee run.log`.
    tracker = Tracker(tmp_path, ["console"], total_steps=3, start_step=0, project="p", name="n", config={})
    values = [-2.7912345e-05, 0.5, 512.0, -0.000123456, 3.21, 0.987654, 1.23e-07, 123456.7, 12.5]
    tracker.log({key: value for (key, _), value in zip(CONSOLE_KEYS, values, strict=True)}, 1)
    tracker.close()
    out = capsys.readouterr().out
    assert "…" not in out
    for printed in ("-2.79e-05", "-0.000123", "1.23e-07", "123,457"):
        assert printed in out, out
    # One plain line per step as it ends (the live table would print only when the run ends).
    assert out.splitlines()[0].startswith("step 1  reward=-2.79e-05  val=0.5  resp len=512  "), out


def test_a_redirected_console_gets_each_step_when_it_ends(tmp_path: Path) -> None:
    stream = io.StringIO()  # a file: not a terminal
    tracker = Tracker(tmp_path, ["console"], total_steps=3, start_step=0, project="p", name="n", config={},
                      console=make_console(file=stream))
    tracker.log({"reward/mean": 0.25, "timing/step": 1.5}, 1)
    assert stream.getvalue().splitlines() == ["step 1  reward=0.25  val=-  resp len=-  pg loss=-  entropy=-  "
                                              "grad norm=-  |Δlogp|=-  tok/s=-  step s=1.5"]
    tracker.log({"reward/mean": 0.5, "timing/step": 1.25}, 2)
    tracker.close()
    assert len(stream.getvalue().splitlines()) == 2


def test_log_lines_on_a_redirected_stderr_are_whole_and_unpadded(tmp_path: Path, capsys) -> None:
    message = "checkpoint of step 7: " + "/a-long-run-directory" * 8
    with run_log(tmp_path / "console.log"):
        logger.info(message)
    assert capsys.readouterr().err.splitlines() == [f"INFO     {message}"]
