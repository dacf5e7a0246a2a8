"""Recipes, overrides, verl aliases and the errors a user sees."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rlkit.core.algos.algorithm import Algorithm
from rlkit.cli.main import app
from rlkit.errors import ConfigError
from rlkit.recipes.checks import batch_arithmetic
from rlkit.recipes.loader import load_config, parse_override

SPLIT = ["trainer.n_gpus_per_node=2", "rollout.placement=split", "rollout.devices=1"]

runner = CliRunner()
DEMO = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo"]


def test_recipe_by_name_inherits_base_and_keeps_schema_defaults():
    config = load_config("grpo-demo")
    assert config.recipe == "grpo-demo"
    assert config.algorithm.adv_estimator == "grpo"        # from base grpo.yaml
    assert config.actor.lr == 1e-3                          # grpo-demo overrides grpo's 1e-6
    assert config.actor.grad_clip == 1.0                    # schema default, stated nowhere in YAML


def test_recipe_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: grpo\nrollout:\n  n: 4\n")
    config = load_config(str(path), DEMO)
    assert config.rollout.n == 4 and config.algorithm.adv_estimator == "grpo"


def test_overrides_are_yaml_typed():
    config = load_config("grpo", DEMO + ["rollout.n=16", "actor.lr=3e-4", "trainer.logger=[console,tensorboard]",
                                          "actor.clip_ratio_c=null"])
    assert config.rollout.n == 16
    assert config.actor.lr == pytest.approx(3e-4)
    assert config.trainer.logger == ["console", "tensorboard"]
    assert config.actor.clip_ratio_c is None


def test_verl_long_keys_are_aliases():
    config = load_config("grpo", [
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "data.train_files=[a.parquet]",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.optim.lr=2e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "trainer.total_training_steps=7"])
    assert config.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (config.rollout.name, config.rollout.n, config.actor.lr) == ("hf", 4, 2e-6)
    assert (config.actor.mini_batch_size, config.trainer.total_steps) == (32, 7)


def test_verls_loss_options_are_aliases_of_the_losss_options():
    sapo = load_config("sapo", DEMO + ["actor_rollout_ref.actor.tau_neg=2.0"])
    assert sapo.actor.policy_loss_options == {"tau_pos": 1.0, "tau_neg": 2.0}  # the recipe's tau_pos kept
    kl_cov = load_config("kl_cov", DEMO + ["actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.01",
                                           "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=0.5"])
    assert kl_cov.actor.policy_loss_options == {"kl_cov_ratio": 0.01, "ppo_kl_coef": 0.5}
    clip_cov = load_config("clip_cov", DEMO + ["actor_rollout_ref.actor.policy_loss.clip_cov_ub=4.0"])
    assert clip_cov.actor.policy_loss_options["clip_cov_ub"] == 4.0
    with pytest.raises(ConfigError, match="tau_pos"):  # grpo's loss (vanilla) has no such option
        load_config("grpo", DEMO + ["actor_rollout_ref.actor.tau_pos=2.0"])


def test_unsupported_verl_key_is_answered_with_our_spelling():
    with pytest.raises(ConfigError, match="actor.clip_ratio_low and actor.clip_ratio_high"):
        load_config("grpo", DEMO + ["actor_rollout_ref.actor.clip_ratio=0.2"])


@pytest.mark.parametrize("override, expected", [
    ("rollout.n=abc", "rollout.n='abc' (command line): Input should be a valid integer"),
    ("algorithm.adv_estimater=grpo", "did you mean 'algorithm.adv_estimator'"),
    ("rollout.name=slang", "unknown rollout engine 'slang' (known: hf, sglang, vllm)"),
    ("algorithm.adv_estimator=grpoo", "did you mean 'grpo'"),
    ("rollout.n=1", "needs rollout.n >= 2"),
    ("actor.mini_batch_size=5", "must divide data.train_batch_size=16"),
])
def test_bad_config_messages(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config("grpo-demo", [override])
    assert expected in str(info.value)


@pytest.mark.parametrize("overrides, from_update", [
    ([], True),                                            # one optimizer step per RL step: skip the pass
    (["actor.old_log_probs=recompute"], False),
    (["actor.old_log_probs=rollout"], False),
    (["actor.ppo_epochs=2"], False),                       # the second epoch's old policy is not the current one
    (["actor.mini_batch_size=8"], False),                  # nor the second mini-batch's
    (["algorithm.use_kl_in_reward=true"], False),          # the reward needs old log-probs before the update
    (["actor.rollout_is_cap=2.0"], True),                  # importance weights need no separate pass either
])
def test_old_log_probs_come_from_the_update_only_when_it_is_the_batch_only_step(overrides, from_update):
    algorithm = Algorithm.from_config(load_config("grpo-demo", overrides))
    assert algorithm.old_log_probs_from_update is from_update


def test_rollout_log_probs_anchor_every_optimizer_step_in_bypass():
    # verl's bypass mode: pi_old = pi_rollout on every mini-batch and epoch, no old-log-prob pass.
    config = load_config("grpo-demo", ["actor.old_log_probs=rollout", "actor.ppo_epochs=2"])
    assert Algorithm.from_config(config).old_log_probs == "rollout"


def test_importance_weights_on_a_ratio_loss_in_bypass_would_correct_twice():
    with pytest.raises(ConfigError, match=r"actor.rollout_is_cap .*ratio is already pi / pi_rollout"):
        load_config("grpo-demo", ["actor.rollout_is_cap=2.0", "actor.old_log_probs=rollout"])


def test_streaming_is_vllms_async_engine_alone_and_composes_with_replicas():
    config = load_config("grpo-demo", ["rollout.name=vllm", "rollout.vllm.streaming=true", "rollout.vllm.replicas=2"])
    assert config.rollout.vllm.streaming and config.rollout.vllm.replicas == 2
    with pytest.raises(ConfigError, match=r"rollout.vllm.streaming.*needs rollout.name=vllm \(got sglang\)"):
        load_config("grpo-demo", ["rollout.name=sglang", "rollout.vllm.streaming=true"])
    # SGLang streams through its own key; which engine streams is the engine in use's key
    assert load_config("grpo-demo", ["rollout.name=sglang", "rollout.sglang.streaming=true"]).rollout.streams
    assert config.rollout.streams and not load_config("grpo-demo", ["rollout.name=vllm"]).rollout.streams
    with pytest.raises(ConfigError, match=r"rollout.sglang.streaming.*needs rollout.name=sglang \(got vllm\)"):
        load_config("grpo-demo", ["rollout.name=vllm", "rollout.sglang.streaming=true"])


def test_engine_kwargs_pass_through_but_cannot_override_rlkit_keys():
    config = load_config("grpo-demo", ["rollout.vllm.engine_kwargs={async_scheduling: true}"])
    assert config.rollout.vllm.engine_kwargs == {"async_scheduling": True}
    with pytest.raises(ConfigError, match="rollout.vllm.engine_kwargs.*max_num_seqs is set by rlkit"):
        load_config("grpo-demo", ["rollout.vllm.engine_kwargs={max_num_seqs: 4}"])
    verl = load_config("grpo-demo", ["rollout.name=sglang",
                                     "actor_rollout_ref.rollout.engine_kwargs.sglang={chunked_prefill_size: 512}"])
    assert verl.rollout.sglang.engine_kwargs == {"chunked_prefill_size": 512}
    with pytest.raises(ConfigError, match="rollout.sglang.engine_kwargs.*mem_fraction_static is set by rlkit"):
        load_config("grpo-demo", ["rollout.sglang.engine_kwargs={mem_fraction_static: 0.3}"])
    # A key set from one rlkit key names it; others get the list of rlkit's keys.
    with pytest.raises(ConfigError, match=r"enforce_eager, seed is set by rlkit; use its own key instead "
                                          r"\(model.path, .*rollout.<engine>.\*; rollout.vllm.enforce_eager\)$"):
        load_config("grpo-demo", ["rollout.vllm.engine_kwargs={enforce_eager: true, seed: 3}"])


def test_moved_engine_keys_still_read_from_old_configs_and_command_lines():
    """rollout.enforce_eager / rollout.engine_kwargs moved under rollout.vllm; old spellings keep working."""
    config = load_config("grpo-demo", ["rollout.enforce_eager=true", "rollout.engine_kwargs={async_scheduling: true}"])
    assert config.rollout.vllm.enforce_eager is True
    assert config.rollout.vllm.engine_kwargs == {"async_scheduling": True}
    verl = load_config("grpo-demo", ["actor_rollout_ref.rollout.enforce_eager=false"])
    assert verl.rollout.vllm.enforce_eager is False


def test_an_unknown_engine_names_the_known_ones():
    with pytest.raises(ConfigError, match="rollout.name.*unknown rollout engine 'vlm'.*hf, sglang, vllm.*did you mean 'vllm'"):
        load_config("grpo-demo", ["rollout.name=vlm"])


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.nn=4", "unknown key 'actor_rollout_ref.rollout.nn' (command line); did you mean "
                                       "'actor_rollout_ref.rollout.n' (verl's spelling of rollout.n)?"),
    ("trainr.total_steps=3", "unknown key 'trainr.total_steps' (command line); did you mean 'trainer.total_steps'?"),
    ("critic.optim.lrr=1e-5", "unknown key 'critic.optim.lrr' (command line); did you mean 'critic.optim.lr' "
                              "(verl's spelling of critic.lr)?"),
])
def test_a_mistyped_key_is_named_whole_with_its_source_and_a_suggestion_from_its_namespace(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("grpo-demo", [override])
    assert str(info.value) == message


def test_a_mistyped_key_in_a_recipe_file_names_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: grpo-demo\nactor_rollout_ref:\n  rollout:\n    nn: 4\n    temperatur: 0.7\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(info.value).splitlines() == [
        "unknown key 'actor_rollout_ref.rollout.nn' (mine.yaml); did you mean 'actor_rollout_ref.rollout.n' "
        "(verl's spelling of rollout.n)?",
        "unknown key 'actor_rollout_ref.rollout.temperatur' (mine.yaml); did you mean "
        "'actor_rollout_ref.rollout.temperature' (verl's spelling of rollout.temperature)?"]


def test_a_renamed_key_is_answered_with_its_new_spelling():
    with pytest.raises(ConfigError, match=r"actor.recompute_old_log_probs \(command line\) is now actor.old_log_probs"):
        load_config("grpo-demo", ["actor.recompute_old_log_probs=false"])


def test_nearest_recipe_is_suggested():
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        load_config("grpoo")


def test_parse_override_requires_key_value():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("rollout.n")
    assert parse_override("data.train_files=[a.parquet, b.parquet]") == ("data.train_files", ["a.parquet", "b.parquet"])


@pytest.mark.parametrize("args, expected", [
    (["train", "grpo", "rollout.n=abc"], "rollout.n='abc'"),
    (["train", "grpo", "algorithm.adv_estimater=grpo"], "did you mean 'algorithm.adv_estimator'"),
    (["train", "nosuchrecipe"], "no recipe named 'nosuchrecipe'"),
])
def test_cli_user_errors_exit_2_with_one_message_and_no_traceback(args, expected):
    proc = subprocess.run([sys.executable, "-m", "rlkit.cli.main", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dry_run_prints_resolved_config_and_batch_arithmetic():
    result = runner.invoke(app, ["train", "grpo-demo", "trainer.n_gpus_per_node=2", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "adv_estimator: grpo" in result.output
    assert "16 prompts x rollout.n=8 = 128 sequences" in result.output
    assert "split over 2 worker(s): 64 each" in result.output


def test_dry_run_needs_no_model_or_data_but_training_does():
    assert runner.invoke(app, ["train", "grpo", "--dry-run"]).exit_code == 0
    with pytest.raises(ConfigError, match="no model given"):
        load_config("grpo")


def test_batch_arithmetic_counts_optimizer_steps():
    config = load_config("grpo-demo", ["data.train_batch_size=32", "actor.mini_batch_size=8", "actor.ppo_epochs=2"])
    lines = batch_arithmetic(config)
    assert any("8 optimizer step(s) per RL step: 4 mini-batch(es) of 8 prompts (64 sequences) x 2 epoch(s)" in l
               for l in lines)


def test_recipes_list_and_show():
    listed = runner.invoke(app, ["recipes", "list"])
    assert listed.exit_code == 0 and "grpo-demo" in listed.output
    shown = runner.invoke(app, ["recipes", "show", "grpo"])
    assert shown.exit_code == 0 and "adv_estimator: grpo" in shown.output


@pytest.mark.parametrize("overrides, correction, every_step", [
    ([], None, False),                                                       # sync: off unless asked
    (["actor.rollout_is_cap=3.0"], ("token", 3.0), True),                    # TIS as before
    (["actor.rollout_is=sequence"], ("sequence", 2.0), True),
    (["rollout.mode=one_step_off", *SPLIT], ("token", 2.0), True),           # stale samples: on by default
    (["rollout.mode=async", *SPLIT, "actor.rollout_is=sequence", "actor.rollout_is_cap=5"], ("sequence", 5.0), True),
    (["rollout.mode=async", *SPLIT, "actor.rollout_is=off"], None, False),   # an ablation can turn it off
    (["algorithm.rollout_correction.rollout_is=sequence",                    # verl's spellings
      "algorithm.rollout_correction.rollout_is_threshold=4"], ("sequence", 4.0), True),
])
def test_rollout_importance_weights_by_mode_and_keys(overrides, correction, every_step):
    algorithm = Algorithm.from_config(load_config("grpo-demo", ["rollout.log_prob_check_freq=0", *overrides]))
    assert algorithm.rollout_correction == correction
    assert algorithm.rollout_log_probs is every_step  # the engine returns log-probs on every step


@pytest.mark.parametrize("overrides, message", [
    (["rollout.mode=one_step_off"], "rollout.mode (command line): one_step_off generates while the trainer trains, "
                                    "on devices of its own: set rollout.placement=split"),
    (["rollout.mode=async", *SPLIT, "actor.old_log_probs=rollout"],
     "actor.old_log_probs (command line): with rollout.mode=async the engine's log-probs come from an older policy"),
    (["rollout.mode=async", *SPLIT, "algorithm.adv_estimator=remax", "algorithm.dynamic_sampling.enable=true"],
     "algorithm.dynamic_sampling.enable (command line): with rollout.mode=async, remax's greedy baseline is "
     "generated ahead with the batch, not for the groups of dynamic sampling's extra rounds"),
    (["rollout.max_staleness=3"], "rollout.max_staleness (command line): has no effect: only rollout.mode=async "
                                  "reads it (mode is sync)"),
    (["rollout.weight_sync_timeout_s=9"], "rollout.weight_sync_timeout_s (command line): has no effect: only split "
                                          "placement sends weights"),
    (["actor.rollout_is=off", "actor.rollout_is_cap=2"], "actor.rollout_is_cap (command line): truncates importance "
                                                          "weights that actor.rollout_is=off turns off"),
    (["actor.rollout_is=token", "actor.old_log_probs=rollout"], "actor.rollout_is (command line): with "
                                                                "actor.old_log_probs=rollout (bypass)"),
])
def test_rollout_mode_and_correction_misconfigurations_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config("grpo-demo", overrides)
    assert message in str(info.value)
