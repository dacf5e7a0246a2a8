"""Record and replay through the CLI: a CPU run records its batches; replaying a step with unchanged
code and settings gives the logged metrics exactly, a changed clip ratio gives visibly different ones;
`rlkit inspect` shows the step; every checkpoint carries the run's provenance.

The run takes two optimizer steps per RL step, so the second mini-batch's ratio is not 1 and the
clip ratio matters; a dense custom reward gives every group non-zero advantages. The run's worker, and so
each replay's, is an object in the CLI's process (trainer.workers=in_process: no Ray, no worker processes), so
every command runs in the test's process (conftest.run_cli_in_process).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli_in_process

from rlkit.core.data.builders import write_parquet
from rlkit.core.data.synthetic import build_synthetic
from rlkit.core.state.checkpoint import list_checkpoints
from rlkit.core.state.provenance import PROVENANCE_FILE
from rlkit.core.state.records import recorded_steps

pytestmark = [pytest.mark.slow]
STEPS = 3
REWARD = "def dense(data_source, response, ground_truth, extra_info):\n    return (sum(map(ord, response)) % 5) / 4\n"
ROW = re.compile(r"^[│|]\s*(\S+)\s*[│|]\s*(\S+)\s*[│|]\s*(\S+)\s*[│|]\s*(\S+)\s*[│|]\s*$")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("replay")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))
        data = write_parquet(build_synthetic(task="echo", n_train=12, n_test=1, seed=3)["train"], root / "echo.parquet")
        (root / "reward.py").write_text(REWARD)
        runs = root / "runs"
        run_cli_in_process("train", "grpo-demo", f"data.train_files=[{data}]", "data.train_batch_size=4",
                           "data.max_response_length=2", "rollout.name=hf", "rollout.n=4", "actor.mini_batch_size=2",
                           "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1", "actor.entropy_coeff=0.01",
                           f"reward.function={root / 'reward.py'}:dense", f"trainer.total_steps={STEPS}",
                           "trainer.save_freq=1", "trainer.keep_last=5", "trainer.workers=in_process",
                           "trainer.device=cpu", "trainer.logger=[jsonl]", f"trainer.runs_dir={runs}",
                           "--run-id", "recorded")  # recording is on by default, keeping the last 3 steps
        yield {"root": root, "runs": runs, "path": runs / "recorded"}


def cli(run: dict, *args: str, exit_code: int = 0) -> str:
    """The command's output, stdout and stderr interleaved; asserts its exit code."""
    return run_cli_in_process(*args, "--runs-dir", str(run["runs"]), exit_code=exit_code).output


def table(output: str) -> dict[str, tuple[str, str, str]]:
    return {m.group(1): m.groups()[1:] for line in output.splitlines() if (m := ROW.match(line.strip()))}


def test_the_run_recorded_every_step_and_checkpointed_its_provenance(run) -> None:
    assert recorded_steps(run["path"]) == [1, 2, 3]
    logged = [json.loads(line) for line in (run["path"] / "metrics.jsonl").read_text().splitlines()]
    assert all(abs(r["adv/mean"]) < 1e-6 and r["reward/std"] > 0 for r in logged)  # dense rewards, GRPO
    ckpts = list_checkpoints(run["path"])
    assert [c.step for c in ckpts] == [1, 2, 3]
    recorded = json.loads((run["path"] / PROVENANCE_FILE).read_text())
    for ckpt in ckpts:
        assert json.loads((ckpt.path / PROVENANCE_FILE).read_text()) == recorded


@pytest.mark.parametrize("step", [1, STEPS])
def test_replaying_an_unchanged_step_gives_the_logged_metrics_exactly(run, step) -> None:
    output = cli(run, "replay", "recorded", "--step", str(step), "--tolerance", "0")
    assert f"replayed step {step} from " + ("the base model" if step == 1 else f"checkpoint step_0000000{step - 1}") \
        in output
    rows = table(output)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/pg_clipfrac", "actor/lr"):
        recorded, replayed, diff = rows[key]
        assert diff == "+0" and recorded == replayed, (key, rows[key])
    assert float(rows["actor/grad_norm"][0]) > 0


def test_replaying_with_another_clip_ratio_shows_the_difference(run) -> None:
    output = cli(run, "replay", "recorded", "--step", str(STEPS), "actor.clip_ratio_low=0.001",
                 "actor.clip_ratio_high=0.001", "--tolerance", "0", exit_code=1)
    assert "overrides: actor.clip_ratio_high: 0.2 -> 0.001; actor.clip_ratio_low: 0.2 -> 0.001" in output
    rows = table(output)
    recorded, replayed, diff = rows["actor/pg_clipfrac"]
    assert float(replayed) > float(recorded) and float(diff) > 0.1
    assert rows["actor/pg_loss"][2] != "+0"
    assert "differs: largest difference" in output


def test_inspect_shows_the_step_sorted(run) -> None:
    output = cli(run, "inspect", "recorded", "--step", "2", "--sort", "advantage", "--ascending", "--tensorboard")
    assert "step 2 of recorded: samples 16, groups 4" in output and "gap_mean" in output
    advantages = [float(cells[4]) for line in output.splitlines()  # cells: "", #, group, reward, adv, ...
                  if len(cells := [c.strip() for c in line.split("│")]) == 10 and cells[1].isdigit()]
    assert len(advantages) == 16 and advantages == sorted(advantages)
    assert list(Path(run["path"] / "tensorboard").glob("events.out.tfevents.*"))
