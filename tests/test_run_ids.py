"""A run id names one folder under trainer.runs_dir: nothing outside it is created, cleaned or read (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlkit.cli.main import app
from rlkit.core.state.run_dir import RunDir, check_run_id
from rlkit.errors import UserError
from rlkit.recipes.loader import load_config

BAD_IDS = ["../x", "a/b", "..", ".", "/abs/run", "", "a..b", "a\u2215b", "a\uff0fb", "a\\b", "run id"]
RULE = "a run id is letters, digits, '.', '_' and '-' only, without '..' (and not '.')"


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("run_id", BAD_IDS)
def test_a_bad_run_id_is_refused_by_name_with_the_rule(run_id) -> None:
    with pytest.raises(UserError) as refused:
        check_run_id(run_id)
    assert str(refused.value) == f"run id {run_id!r} is not allowed: {RULE}"


@pytest.mark.parametrize("run_id", ["grpo-demo-20261130-101500", "a.b_c-1", "v1.2", ".hidden"])
def test_plain_names_are_run_ids(run_id) -> None:
    assert check_run_id(run_id) == run_id


def test_run_dir_create_never_touches_a_folder_outside_runs_dir(tmp_path) -> None:
    victim = tmp_path / "victimdir"
    victim.mkdir()
    (victim / "config.yaml").write_text("mine\n")  # what made RunDir.create treat it as a restartable run
    (victim / "notes.txt").write_text("keep me\n")
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path / 'runs'}"])
    before = tree(tmp_path)
    for run_id in ["../victimdir", "../trav/x", str(victim), "..", ""]:
        with pytest.raises(UserError, match="is not allowed"):
            RunDir.create(config, run_id)
    assert tree(tmp_path) == before
    assert (victim / "notes.txt").read_text() == "keep me\n"


@pytest.mark.parametrize("command", [["train", "grpo-demo", "--run-id", "../trav/x"], ["resume", "../trav"],
                                     ["export", "../trav", "--out", "hf"], ["runs", "show", "../trav"],
                                     ["plot", "../trav"], ["inspect", "../trav"], ["replay", "../trav", "--step", "2"]])
def test_every_command_refuses_a_run_id_that_walks_out(command, tmp_path, monkeypatch) -> None:
    runs, elsewhere = tmp_path / "runs", tmp_path / "trav"
    runs.mkdir()
    for run in (elsewhere, elsewhere / "x"):  # runs outside runs_dir, for ids to reach
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("recipe: x\n")
    (tmp_path / "cwd" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd" / "sub")  # ../trav is no run directory from here: only an id reaches it
    bad = command[command.index("--run-id") + 1] if command[0] == "train" else "../trav"
    args = [*command, f"trainer.runs_dir={runs}"] if command[0] == "train" else [*command, "--runs-dir", str(runs)]
    before = tree(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"error: run id {bad!r} is not allowed: {RULE}" in " ".join(result.output.split())
    assert tree(tmp_path) == before


def test_eval_reads_no_run_that_an_id_walks_out_to(tmp_path, monkeypatch) -> None:
    (tmp_path / "trav").mkdir()
    (tmp_path / "trav" / "config.yaml").write_text("recipe: x\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "cwd" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd" / "sub")
    result = CliRunner().invoke(app, ["eval", "../trav", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert f"error: '../trav' is neither a run (none under --runs-dir {tmp_path / 'runs'}) nor a model directory" \
        in " ".join(result.output.split())


def test_a_symlinked_run_directory_is_not_emptied(tmp_path) -> None:
    victim = tmp_path / "victimdir"
    victim.mkdir()
    (victim / "config.yaml").write_text("mine\n")
    (victim / "notes.txt").write_text("keep me\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r").symlink_to(victim)
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path / 'runs'}"])
    with pytest.raises(UserError) as refused:
        RunDir.create(config, "r")
    assert str(refused.value) == (f"run directory {tmp_path / 'runs' / 'r'} already exists and is a symbolic link "
                                  f"(to {victim}); pick another --run-id")
    assert sorted(p.name for p in victim.iterdir()) == ["config.yaml", "notes.txt"]


def test_a_run_directorys_own_path_still_opens(tmp_path, monkeypatch) -> None:
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path / 'runs'}"])
    made = RunDir.create(config, "r1")
    monkeypatch.chdir(tmp_path)
    assert RunDir.open("runs/r1", "elsewhere").path == Path("runs/r1")
    assert RunDir.open("r1", tmp_path / "runs").path == made.path
