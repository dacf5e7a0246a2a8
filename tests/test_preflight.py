"""Bad inputs at start: one clear sentence, exit code 2, and no run directory, Ray or worker."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from rlkit.cli.main import app
from rlkit.core.cluster import ray_access
from rlkit.core.controller import model_checks, preflight
from rlkit.core.state.run_dir import resolve_model_path
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


def test_a_local_model_path_is_resolved_to_an_absolute_one(tmp_path, monkeypatch):
    """What is typed relative to where a run started is written into exports (a LoRA adapter's base) that are
    read from other folders."""
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("models/m") == str(tmp_path.resolve() / "models" / "m")
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # not here: a hub id, as typed


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
    ray_access.check_cluster(config, [node(8), node(8), node(4)])
    with pytest.raises(UserError, match=r"needs 2 node\(s\) with 8 GPU\(s\) each, but the Ray cluster at "
                                        r"RAY_ADDRESS has 2 alive node\(s\) with \[8, 4\] GPU\(s\)"):
        ray_access.check_cluster(config, [node(8), node(4), node(8, alive=False)])


def test_hub_answers_become_sentences(monkeypatch):
    from huggingface_hub import HfApi

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(self, repo_id, timeout):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    with pytest.raises(UserError, match=r"not found on the hub: the hub could not be reached \(ConnectionError: "
                                        r"Name or service not known\); download the model where there is network"):
        model_checks.check_hub_model("Qwen/Qwen2.5-0.5B-Instruct")


# -- every input is checked before the run directory exists ----------------------------------
def _echo_data(tmp_path, *prompts: str, data_source: str = "synthetic/echo"):
    from rlkit.core.data.builders import make_row, write_parquet

    rows = [make_row(data_source, prompt, "1", split="train", index=i) for i, prompt in enumerate(prompts)]
    return write_parquet(rows, tmp_path / "echo.parquet")


def test_a_prompt_over_max_prompt_length_stops_the_run_before_its_directory_exists(tmp_path):
    data = _echo_data(tmp_path, *["echo 1"] * 20, "echo " + "1" * 40)
    line = _one_line_error(_train(tmp_path, f"data.train_files=[{data}]", "data.max_prompt_length=32"))
    assert f"{data}, row 20: prompt has" in line and "> data.max_prompt_length=32" in line


@pytest.mark.parametrize("overrides, message", [
    (["data.train_batch_size=32", "actor.mini_batch_size=32"],
     "data.train_batch_size=32 is larger than the dataset (20 rows)"),
    (["reward.function=/no/such/reward.py:score"], "reward.function='/no/such/reward.py:score': file"),
])
def test_batch_size_and_reward_function_are_checked_before_the_run_directory(tmp_path, overrides, message):
    data = _echo_data(tmp_path, *["echo 1"] * 20)
    line = _one_line_error(_train(tmp_path, f"data.train_files=[{data}]", *overrides))
    assert message in line


def test_a_data_source_without_a_reward_names_the_file_and_row(tmp_path):
    data = _echo_data(tmp_path, *["echo 1"] * 20, data_source="gsm9k")
    line = _one_line_error(_train(tmp_path, f"data.train_files=[{data}]"))
    assert f"{data}, row 0: unknown reward function for data_source 'gsm9k'" in line
    assert "reward.function=path/file.py:fn" in line


def test_an_unknown_synthetic_task_is_named(tmp_path):
    line = _one_line_error(_train(tmp_path, "data.synthetic_task=echoo"))
    assert "data.synthetic_task='echoo' is not a built-in task; choose one of ['add', 'echo', 'lookup', 'succ']" in line


# -- the model: config, weights, tokenizer, context, each with its own message ---------------
def _broken_model(tmp_path, tiny_model_dir, name: str):
    return shutil.copytree(tiny_model_dir, tmp_path / name)


def test_a_model_directory_without_weights(tmp_path, tiny_model_dir):
    model = _broken_model(tmp_path, tiny_model_dir, "no-weights")
    (model / "model.safetensors").unlink()
    line = _one_line_error(_train(tmp_path, f"model.path={model}"))
    assert f"model.path={model}: no weights in {model} (expected model.safetensors" in line


def test_a_truncated_safetensors_file(tmp_path, tiny_model_dir):
    model = _broken_model(tmp_path, tiny_model_dir, "truncated")
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as handle:
        handle.truncate(size - 1000)
    line = _one_line_error(_train(tmp_path, f"model.path={model}"))
    assert (f"model.path={model}: model.safetensors is truncated ({size - 1000} bytes, its header describes "
            f"{size}); download or copy the model again") in line


def test_a_weights_index_naming_a_missing_shard(tmp_path, tiny_model_dir):
    model = _broken_model(tmp_path, tiny_model_dir, "sharded")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    line = _one_line_error(_train(tmp_path, f"model.path={model}"))
    assert "the weights index lists model-00002-of-00002.safetensors, which is missing" in line


def test_an_unknown_model_type(tmp_path, tiny_model_dir):
    model = _broken_model(tmp_path, tiny_model_dir, "unknown-type")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "qwen9"}))
    line = _one_line_error(_train(tmp_path, f"model.path={model}"))
    assert f"model.path={model}: config.json has model_type 'qwen9', which transformers " in line


def test_a_corrupted_config_is_blamed_on_the_config_not_the_tokenizer(tmp_path, tiny_model_dir):
    model = _broken_model(tmp_path, tiny_model_dir, "bad-config")
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text[:len(text) // 2])
    line = _one_line_error(_train(tmp_path, f"model.path={model}"))
    assert f"model.path={model}: {model}/config.json is not valid JSON (" in line and "tokenizer" not in line


def test_a_missing_tokenizer_is_blamed_on_the_tokenizer(tmp_path, tiny_model_dir):
    model = _broken_model(tmp_path, tiny_model_dir, "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    line = _one_line_error(_train(tmp_path, f"model.path={model}"))
    assert f"model.path={model}: cannot load its tokenizer (" in line


def test_prompt_plus_response_longer_than_the_models_context_names_both_keys(tmp_path):
    line = _one_line_error(_train(tmp_path, "data.max_prompt_length=512", "data.max_response_length=16"))
    assert ("data.max_prompt_length=512 + data.max_response_length=16 = 528 tokens, but "
            "model.path=rlkit:tiny-qwen2 handles at most 256 (its config.json)") in line


def test_a_sliding_window_shorter_than_prompt_plus_response_is_refused(tmp_path, tiny_model_dir):
    """The tiny Qwen2 with sliding-window layers of 40 tokens: the engine would honour the window, rlkit's packed
    training attention would not."""
    model = _broken_model(tmp_path, tiny_model_dir, "sliding")
    config = json.loads((model / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=40, max_window_layers=0)
    config.pop("layer_types", None)  # transformers derives them from the three above
    (model / "config.json").write_text(json.dumps(config))
    line = _one_line_error(_train(tmp_path, f"model.path={model}", "data.max_prompt_length=32",
                                  "data.max_response_length=16"))
    assert (f"model.path={model} attends within a sliding window of 40 tokens on some of its layers" in line
            and "data.max_prompt_length=32 + data.max_response_length=16 = 48 tokens" in line
            and "lower the two so that they add up to at most 40" in line)


def test_which_configs_slide() -> None:
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    assert model_checks.sliding_window(MistralConfig(sliding_window=4096)) == 4096  # every layer: no layer_types
    assert model_checks.sliding_window(MistralConfig(sliding_window=None)) is None
    assert model_checks.sliding_window(Gemma2Config(sliding_window=1024)) == 1024  # every other layer
    assert model_checks.sliding_window(Qwen2Config(sliding_window=4096)) is None  # use_sliding_window off
    assert model_checks.sliding_window(Qwen2Config(use_sliding_window=True, sliding_window=4096)) == 4096
    assert model_checks.sliding_window(LlamaConfig()) is None
    assert model_checks.check_attention(Gemma2Config(sliding_window=1024, attn_logit_softcapping=None), "g", 512,
                                        512) == "sliding window 1024 >= 1024 tokens"
    with pytest.raises(UserError, match=r"model.path=g caps its attention logits \(its config.json: "
                                        r"attn_logit_softcapping=50.0\)"):
        model_checks.check_attention(Gemma2Config(), "g", 16, 16)


def test_safetensors_header_check(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(4, 4)}, str(path))
    assert model_checks.safetensors_problem(path) is None
    path.write_bytes(path.read_bytes() + b"xx")
    assert "is damaged" in model_checks.safetensors_problem(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert model_checks.safetensors_problem(path) == "has an unreadable header (not a safetensors file, or damaged)"
    path.write_bytes(b"\x00" * 5)
    assert "not even a safetensors header" in model_checks.safetensors_problem(path)


# -- a dry run runs every check that needs no GPU ---------------------------------------------
def _dry_run(tmp_path, *overrides: str):
    return _train(tmp_path, "--dry-run", *overrides)


def test_dry_run_checks_the_model_and_the_data(tmp_path):
    line = _one_line_error(_dry_run(tmp_path, f"model.path={tmp_path}/models/my-sft"))
    assert "no such directory" in line
    line = _one_line_error(_dry_run(tmp_path, f"data.train_files=[{tmp_path}/missing.parquet]"))
    assert f"data file {tmp_path}/missing.parquet does not exist" in line


def test_dry_run_says_what_it_checked_and_what_it_skipped(tmp_path):
    result = _dry_run(tmp_path)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "ok model.path=rlkit:tiny-qwen2: config (qwen2), weights: 1 file(s), complete, context: 17 of 256 tokens, " \
           "tokenizer" in output
    assert "ok data: 1024 training prompts of data.synthetic_task=echo, each within data.max_prompt_length=16" in output
    assert "ok reward rules: synthetic/echo -> rlkit.core.data.synthetic.exact_match_reward" in output
    assert ("ok reward rlkit.core.data.synthetic.exact_match_reward called on training row(s) 0, 1 within "
            "reward.timeout_s=10: response the row's ground truth scores 1, 1; response an empty string scores 0, 0"
            ) in output
    assert "skipped loading the weights onto the devices and starting the rollout engine" in output


# -- a dry run calls the reward on the first training rows, as the run will -----------------
REWARDS = '''
import time


def good(data_source, response, ground_truth, extra_info):
    return float(response == ground_truth)


def nan(data_source, response, ground_truth, extra_info):
    return float("nan")


def three(data_source, response, ground_truth):
    return 1.0


def hang(data_source, response, ground_truth, extra_info):
    time.sleep(600)


def no_format(data_source, response, ground_truth, extra_info):
    return {"score": float(response == ground_truth), "accuracy": float(response == ground_truth)}
'''


def _reward(tmp_path, name: str) -> str:
    (tmp_path / "rewards.py").write_text(REWARDS)
    return f"reward.function={tmp_path / 'rewards.py'}:{name}"


def test_dry_run_lists_the_scores_a_good_reward_gave(tmp_path):
    result = _dry_run(tmp_path, _reward(tmp_path, "good"))
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    # grpo-demo's echo rows: the ground truth equals itself (1), the empty string does not (0)
    assert (f"ok reward {tmp_path / 'rewards.py'}:good called on training row(s) 0, 1 within reward.timeout_s=10: "
            "response the row's ground truth scores 1, 1; response an empty string scores 0, 0") in output


@pytest.mark.parametrize("name, overrides, problem", [
    ("nan", [], "returned float nan, not a finite number"),
    ("hang", ["reward.timeout_s=0.5"], "timed out after 0.5 s (reward.timeout_s); its worker was killed"),
])
def test_dry_run_fails_on_a_reward_that_returns_nan_or_hangs(tmp_path, name, overrides, problem):
    line = " ".join(_one_line_error(_dry_run(tmp_path, _reward(tmp_path, name), *overrides)).split())
    assert (f"error: reward function {tmp_path / 'rewards.py'}:{name} failed on training row 0 (data_source "
            f"'synthetic/echo', response: the row's ground truth): {problem}") in line


def test_dry_run_fails_on_a_reward_with_three_parameters(tmp_path):
    line = " ".join(_one_line_error(_dry_run(tmp_path, _reward(tmp_path, "three"))).split())
    assert (f"error: reward.function={tmp_path / 'rewards.py'}:three cannot be called on training row 0: it takes "
            "(data_source, response, ground_truth), but rewards are called as fn(data_source, response, "
            "ground_truth, extra_info)") in line


def test_dry_run_fails_on_a_reward_without_a_component_gdpo_reads(tmp_path):
    line = " ".join(_one_line_error(_dry_run(tmp_path, _reward(tmp_path, "no_format"), "algorithm.adv_estimator=gdpo",
                                             "algorithm.gdpo_reward_keys=[accuracy,format]")).split())
    assert (f"error: reward function {tmp_path / 'rewards.py'}:no_format returned no 'format' on training row 0 "
            "(data_source 'synthetic/echo', response: the row's ground truth) (its keys besides 'score': "
            "['accuracy']); algorithm.gdpo_reward_keys names keys") in line
