"""`objective: dpo` in the one schema: the recipe, its checks (each naming the key), the dry run's
arithmetic in pairs, the pair batch layout, and bad pairs at preflight (exit 2, no run directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlkit.core.algos.algorithm import Algorithm
from rlkit.cli.main import app
from rlkit.core.data.builders import write_parquet
from rlkit.core.data.pairs import PairRow, pair_batch
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config

BASE = ["model.path=some/model", "data.train_files=[pairs.parquet]"]
SMALL = ["data.max_prompt_length=16", "data.max_response_length=16"]  # the tiny model's context is 256


def test_the_dpo_recipe() -> None:
    config = load_config("dpo", BASE)
    assert config.objective == "dpo" and config.offline and Algorithm.from_config(config).reference
    assert (config.dpo.loss_type, config.dpo.beta, config.dpo.label_smoothing) == ("sigmoid", 0.1, 0.0)
    assert config.samples_per_prompt == 2  # a pair is two sequences
    assert config.log_prob_temperature == 1.0  # the data's likelihood, not a sampling temperature
    assert not Algorithm.from_config(config).critic
    ipo = load_config("dpo", [*BASE, "dpo.loss_type=ipo", "dpo.beta=0.5"])
    assert (ipo.dpo.loss_type, ipo.dpo.beta) == ("ipo", 0.5)


@pytest.mark.parametrize("recipe, overrides, key, message", [
    ("dpo", ["dpo.loss_type=ipo", "dpo.label_smoothing=0.1"], "dpo.label_smoothing",
     "applies to dpo.loss_type cdpo and robust, not to ipo"),
    ("dpo", ["dpo.label_smoothing=0.1"], "dpo.label_smoothing", "set dpo.loss_type=cdpo, or remove it"),
    ("dpo", ["trainer.n_gpus_per_node=2", "actor.mini_batch_size=3", "data.train_batch_size=6"],
     "actor.mini_batch_size", "3 pairs cannot be split evenly over 2 workers"),
    ("dpo", ["sft.completion_only_loss=false"], "sft.completion_only_loss", "only objective sft reads it"),
    ("sft", ["dpo.beta=0.5"], "dpo.beta", "only objective dpo reads it (objective is sft)"),
    ("grpo", ["dpo.beta=0.5"], "dpo.beta", "only objective dpo reads it (objective is rl)"),
    ("dpo", ["rollout.n=4"], "rollout.n", "objective dpo generates nothing"),
    # The recipe's 512 + 1024 tokens a sequence: a pair, which always runs whole, needs 3072.
    ("dpo", ["actor.micro_batch_tokens=2000"], "actor.micro_batch_tokens",
     "2000 tokens cannot hold one pair (two sequences) of max_prompt_length + max_response_length = 1536"),
])
def test_impossible_dpo_settings_name_the_key(recipe: str, overrides: list[str], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(recipe, [*BASE, *overrides])
    assert str(info.value).startswith(key) and message in str(info.value)


@pytest.mark.parametrize("override", ["dpo.label_smoothing=0.5", "dpo.beta=0", "dpo.loss_type=hinge"])
def test_out_of_range_dpo_values(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config("dpo", [*BASE, override])


def test_pair_batch_interleaves_chosen_and_rejected() -> None:
    batch = pair_batch([PairRow(0, [7, 8], [3, 2], [4, 5, 2]), PairRow(1, [9], [6, 2], [2])], pad_id=0)
    # Rows: chosen 0, rejected 0, chosen 1, rejected 1; prompts left-padded to 2, responses right-padded to 3.
    assert batch["input_ids"].tolist() == [[7, 8, 3, 2, 0], [7, 8, 4, 5, 2], [0, 9, 6, 2, 0], [0, 9, 2, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert batch.meta["row_index"] == [0, 0, 1, 1]


def test_dry_run_counts_pairs(tmp_path: Path) -> None:
    pair = {"prompt": [{"role": "user", "content": "1+1="}], "chosen": "2", "rejected": "3"}
    data = write_parquet([pair] * 8, tmp_path / "pairs.parquet")
    result = CliRunner().invoke(app, ["train", "dpo", "--dry-run", "--model", "rlkit:tiny-qwen2",
                                      f"data.train_files=[{data}]", "data.train_batch_size=8",
                                      "actor.mini_batch_size=4", *SMALL])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "each step takes 8 pairs of data.train_files = 16 sequences (dpo: no generation)" in text
    assert "2 optimizer step(s) per step: 2 mini-batch(es) of 4 pairs (8 sequences)" in text
    assert "data: 8 training and 0 validation preference pairs" in text


@pytest.mark.parametrize("bad, message", [
    ({"rejected": "2"}, "row 2: 'chosen' and 'rejected' are the same text"),
    ({"chosen": " "}, "row 2: 'chosen' is empty"),
    ({"rejected": "3" * 40}, "row 2: prompt (7 tokens) + the longer response (41 tokens with EOS) is 48 tokens > "
                             "data.max_prompt_length + data.max_response_length = 32"),
])
def test_bad_pairs_exit_2_naming_file_and_row_before_the_run_dir_exists(tmp_path: Path, bad: dict,
                                                                        message: str) -> None:
    import ray

    good = {"prompt": [{"role": "user", "content": "1+1="}], "chosen": "2", "rejected": "3"}
    data = write_parquet([good, good, {**good, **bad}, good], tmp_path / "pairs.parquet")
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", "dpo", "--model", "rlkit:tiny-qwen2", f"data.train_files=[{data}]",
                                      "data.train_batch_size=2", "actor.mini_batch_size=2", *SMALL,
                                      f"trainer.runs_dir={runs}"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"1 bad pair(s): {data}, {message}" in " ".join(result.output.split())
    assert not runs.exists() and not ray.is_initialized()


def test_the_plan_of_a_dpo_run_is_the_reference_pass_and_the_update() -> None:
    from rlkit.core.planning.plan import build_plan

    common = ["model.path=rlkit:tiny-qwen2", "data.train_files=[t.parquet]", "data.max_prompt_length=64",
              "data.max_response_length=64", "actor.micro_batch_tokens=4096", "trainer.device=cuda"]
    dpo = build_plan(load_config("dpo", [*common, "data.train_batch_size=32", "actor.mini_batch_size=16"]),
                     gpu_memory_gib=80)
    # The same sequences on SFT's side: 32 pairs are 64 rows, in mini-batches of 32 rows.
    sft = build_plan(load_config("sft", [*common, "data.train_batch_size=64", "actor.mini_batch_size=32"]),
                     gpu_memory_gib=80)
    assert set(dpo.time.phases) == {"ref", "update"} and dpo.kv is None
    assert dpo.time.phases["update"] == sft.time.phases["update"]
    assert dpo.memory.phases["update"] > sft.memory.phases["update"]  # plus the reference's weights


def test_the_plot_of_a_dpo_run_draws_the_preference_panels(tmp_path: Path) -> None:
    import json

    from rlkit.core.controller.plot import DPO_PANELS, panels_for, plot_run
    from rlkit.core.controller.tracking import METRICS_FILE, read_metrics

    records = [{"step": 0, "val/loss": 0.69, "val/rewards/margins": 0.0},
               {"step": 1, "actor/loss": 0.6, "rewards/margins": 0.1, "rewards/accuracies": 0.7, "timing/step": 1.0}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert panels_for(read_metrics(tmp_path / METRICS_FILE)) == DPO_PANELS
    assert plot_run(tmp_path, tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
