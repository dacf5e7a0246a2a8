"""Bad inputs at start: one clear sentence, exit code 2, and no run directory, Ray or worker."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from rlkit.cli.main import app
from rlkit.core.controller import preflight
from rlkit.errors import UserError
from rlkit.recipes.loader import load_config

runner = CliRunner()


@pytest.fixture
def chat_data(tmp_path):
    from rlkit.core.data.builders import write_parquet
    from rlkit.core.data.synthetic import build_synthetic

    return write_parquet(build_synthetic(task="echo", seed=0)["train"], tmp_path / "chat.parquet")


def _train(tmp_path, *overrides: str):
    """`rlkit train grpo-demo ...`; returns the result after checking nothing was started."""
    import ray

    runs = tmp_path / "runs"
    result = runner.invoke(app, ["train", "grpo-demo", f"trainer.runs_dir={runs}", *overrides])
    assert not ray.is_initialized()
    assert not runs.exists() or not any(runs.iterdir()), "a bad input must not leave a run directory"
    return result


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.rstrip().endswith(errors[0]), result.output
    return errors[0]


def test_unknown_hub_id_says_not_local_and_not_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _one_line_error(_train(tmp_path, "model.path=no-such-org/no-such-model"))
    assert "model.path='no-such-org/no-such-model' is not a local directory and not found on the hub" in line


def test_unknown_reward_model_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _one_line_error(_train(tmp_path, "reward_model.path=no-such-org/rm"))
    assert "reward_model.path='no-such-org/rm' is not a local directory and not found on the hub" in line


def test_missing_local_path_is_named(tmp_path):
    line = _one_line_error(_train(tmp_path, f"model.path={tmp_path}/models/my-sft"))
    assert f"model.path={tmp_path}/models/my-sft: no such directory" in line


def test_directory_without_a_model_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    line = _one_line_error(_train(tmp_path, f"model.path={tmp_path / 'empty'}"))
    assert "has no config.json (not a transformers model)" in line


def test_chat_prompts_need_a_chat_template(tmp_path, tiny_model_dir, chat_data):
    model = shutil.copytree(tiny_model_dir, tmp_path / "no-template")
    (model / "chat_template.jinja").unlink()
    line = _one_line_error(_train(tmp_path, f"model.path={model}", f"data.train_files=[{chat_data}]"))
    assert f"data file {chat_data} (data.train_files) holds chat prompts" in line
    assert f"the tokenizer of model.path={model} has no chat template" in line


def test_data_file_that_is_not_parquet(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("prompt,answer\necho 1,1\n")
    line = _one_line_error(_train(tmp_path, f"data.train_files=[{csv}]"))
    assert f"data file {csv} is not a readable parquet file" in line


def test_more_workers_than_devices(tmp_path):
    line = _one_line_error(_train(tmp_path, "trainer.n_gpus_per_node=4096", "actor.mini_batch_size=512",
                                  "data.train_batch_size=512"))
    assert "trainer.n_gpus_per_node=4096 asks for 4096" in line


def test_gpu_count_is_checked(monkeypatch):
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    preflight.check_devices(load_config("grpo-demo", ["trainer.n_gpus_per_node=2"]))
    with pytest.raises(UserError, match=r"trainer.n_gpus_per_node=4 asks for 4 GPUs, but this machine has "
                                        r"2 visible GPU\(s\); lower trainer.n_gpus_per_node to 2"):
        preflight.check_devices(load_config("grpo-demo", ["trainer.n_gpus_per_node=4"]))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(UserError, match="trainer.device=cuda, but no CUDA device is visible"):
        preflight.check_devices(load_config("grpo-demo", ["trainer.device=cuda"]))


def test_cluster_nodes_are_checked():
    config = load_config("grpo-demo", ["trainer.n_gpus_per_node=8", "trainer.nnodes=2"])
    node = lambda gpus, alive=True: {"Alive": alive, "Resources": {"CPU": 64, "GPU": gpus}}  # noqa: E731
    preflight.check_cluster(config, [node(8), node(8), node(4)])
    with pytest.raises(UserError, match=r"needs 2 node\(s\) with 8 GPU\(s\) each, but the Ray cluster at "
                                        r"RAY_ADDRESS has 2 alive node\(s\) with \[8, 4\] GPU\(s\)"):
        preflight.check_cluster(config, [node(8), node(4), node(8, alive=False)])


def test_hub_answers_become_sentences(monkeypatch):
    from huggingface_hub import HfApi

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(self, repo_id, timeout):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    with pytest.raises(UserError, match=r"not found on the hub: the hub could not be reached \(ConnectionError: "
                                        r"Name or service not known\); download the model where there is network"):
        preflight.check_hub_model("Qwen/Qwen2.5-0.5B-Instruct")
