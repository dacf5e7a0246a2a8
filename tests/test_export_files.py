"""`rlkit export` writes files anyone with the umask's rights can read, quietly (no Ray, no training)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlkit.core.state.run_dir import RunDir
from rlkit.core.state.checkpoint import write_checkpoint
from rlkit.core.train.export import export_hf
from rlkit.core.state.shards import MODEL_KEY, SHARDS_DIR
from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml, load_config


def checkpointed_run(tmp_path: Path, model_dir: Path) -> RunDir:
    """A run whose step-1 checkpoint holds the base model's weights, doubled."""
    from transformers import AutoModelForCausalLM

    config = load_config("grpo-demo", [f"model.path={model_dir}", f"trainer.runs_dir={tmp_path / 'runs'}"])
    run = RunDir.create(config, "r")
    weights = {k: v * 2 for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}

    def shards(folder: Path) -> None:
        dcp.save({MODEL_KEY: weights}, checkpoint_id=str(folder / "policy" / SHARDS_DIR), no_dist=True)

    write_checkpoint(run.path, 1, reason="final", write_shards=shards, trainer_state={}, controller_rng={},
                     config_yaml=config_to_yaml(config), keep_last=1)
    return run


def test_export_files_follow_the_umask_and_no_progress_bars_print(tiny_model_dir, tmp_path, capfd) -> None:
    from transformers import AutoModelForCausalLM

    run = checkpointed_run(tmp_path, tiny_model_dir)
    capfd.readouterr()
    previous = os.umask(0o022)
    try:
        out = export_hf(run, tmp_path / "hf")
    finally:
        os.umask(previous)
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == ""  # no "Loading weights" / "Writing model shards" bars
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == 0o644  # transformers leaves it 0600
    assert set(modes.values()) == {0o644}, modes
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(exported[k], 2 * base[k]) for k in base)  # the checkpoint's weights, not the base's


def test_export_refuses_an_existing_file_as_out(tmp_path) -> None:
    (tmp_path / "model.bin").write_text("mine\n")
    with pytest.raises(UserError) as refused:
        export_hf(RunDir("r", tmp_path / "runs" / "r"), tmp_path / "model.bin")
    assert str(refused.value) == (f"--out {tmp_path / 'model.bin'} is an existing file, not a directory; pick a new "
                                  "directory (the export writes several files into it)")
    assert (tmp_path / "model.bin").read_text() == "mine\n"
