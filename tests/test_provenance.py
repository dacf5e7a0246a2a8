"""Provenance: what a run directory and each checkpoint record about the environment, `runs show`
printing it, and the resume warning that names what changed."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from pathlib import Path

from conftest import REPO, invoke

from rlkit.cli.run_cmds import register
from rlkit.core import environment
from rlkit.core.state.run_dir import RunDir
from rlkit.core.state import provenance
from rlkit.core.state.checkpoint import MARKER, write_checkpoint
from rlkit.recipes.loader import load_config


def make_run(tmp_path: Path, data: bytes = b"prompts v1") -> tuple:
    data_file = tmp_path / "train.parquet"
    data_file.write_bytes(data)
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path / 'runs'}", f"data.train_files=[{data_file}]"])
    return config, RunDir.create(config, "run"), data_file


def save_step(run: RunDir, step: int) -> Path:
    return write_checkpoint(run.path, step, reason="periodic", write_shards=lambda folder: None, trainer_state={},
                            controller_rng={}, config_yaml="", keep_last=5)


def test_the_record_holds_versions_commit_data_hashes_and_hardware(tmp_path) -> None:
    import torch
    import transformers

    config, run, data_file = make_run(tmp_path)
    record = provenance.write(run.path, config)
    assert json.loads((run.path / provenance.PROVENANCE_FILE).read_text()) == record
    assert record["packages"]["torch"] == torch.__version__
    assert record["packages"]["transformers"] == transformers.__version__
    assert record["data_files"] == {str(data_file): hashlib.sha256(b"prompts v1").hexdigest()}
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert record["rlkit"]["commit"] == head  # the tests run from a checkout
    assert record["hardware"]["cpu_count"] >= 1 and record["hardware"]["memory_gib"] > 0


def test_a_synthetic_task_is_hashed_under_its_run_relative_name(tmp_path) -> None:
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}"])
    run = RunDir.create(config, "synthetic")
    (run.path / "data").mkdir()
    (run.path / "data" / "train.parquet").write_bytes(b"echo")
    assert provenance.collect(config, run.path)["data_files"] == {"data/train.parquet": hashlib.sha256(b"echo").hexdigest()}


def test_every_checkpoint_carries_the_environment_that_wrote_it(tmp_path) -> None:
    config, run, _ = make_run(tmp_path)
    record = provenance.write(run.path, config)
    path = save_step(run, 1)
    assert provenance.read(path) == record
    assert provenance.PROVENANCE_FILE in json.loads((path / MARKER).read_text())["files"]  # in the manifest too


def test_differences_name_each_change_and_ignore_host_and_time() -> None:
    old = {"rlkit": {"version": "0.1.0", "commit": "a" * 40, "dirty": False}, "python": "3.11.7",
           "packages": {"torch": "2.13.0", "vllm": "0.32.0"}, "data_files": {"train.parquet": "1" * 64},
           "hardware": {"host": "a", "cpu": "X", "gpus": [{"name": "H200", "memory_gib": 139.8}] * 2},
           "written_at": "then"}
    assert provenance.differences(old, old) == []
    new = json.loads(json.dumps(old))
    new["packages"]["torch"] = "2.14.0"
    new["rlkit"]["commit"] = "b" * 40
    new["data_files"]["train.parquet"] = "2" * 64
    new["hardware"].update(host="b", gpus=[{"name": "H200", "memory_gib": 139.8}])
    new["written_at"] = "now"
    assert provenance.differences(old, new) == [
        "git commit aaaaaaaaaaaa -> bbbbbbbbbbbb", "torch 2.13.0 -> 2.14.0",
        "data file train.parquet sha256 111111111111 -> 222222222222",
        "GPUs 2 x H200 (139.8 GiB) -> 1 x H200 (139.8 GiB)"]


def test_resume_warns_naming_a_changed_package_and_data_file(tmp_path, monkeypatch, caplog) -> None:
    config, run, data_file = make_run(tmp_path)
    provenance.write(run.path, config)
    ckpt = save_step(run, 1)
    assert provenance.warn_if_changed(ckpt, config, run.path) == []

    real = environment.installed_version
    monkeypatch.setattr(environment, "installed_version", lambda p: "9.9.9" if p == "torch" else real(p))
    data_file.write_bytes(b"prompts v2")
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        changes = provenance.warn_if_changed(ckpt, config, run.path)
    old_torch = provenance.read(ckpt)["packages"]["torch"]
    assert changes[0] == f"torch {old_torch} -> 9.9.9"
    assert changes[1].startswith(f"data file {data_file} sha256 ")
    assert f"the environment changed since checkpoint step_00000001 was written: torch {old_torch} -> 9.9.9" \
        in caplog.text


def test_runs_show_prints_the_provenance(tmp_path) -> None:
    config, run, data_file = make_run(tmp_path)
    record = provenance.write(run.path, config)
    save_step(run, 1)
    run.write_status("finished", step=1, total_steps=1)
    result = invoke(register, "runs", "show", "run", "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    assert f"torch {record['packages']['torch']}" in result.output
    assert f"sha256 {hashlib.sha256(b'prompts v1').hexdigest()[:16]}" in result.output
    assert f"commit {record['rlkit']['commit'][:12]}" in result.output
    assert "written in another environment" not in result.output
