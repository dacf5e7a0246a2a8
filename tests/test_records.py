"""Recorded rollouts: a step's batch round-trips through parquet exactly; what a replay accepts and refuses;
what `rlkit inspect` computes from a record (per-token gaps, advantages, sorting, TensorBoard text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch, build_batch
from rlkit.core.controller.replay import Replay, replay_config, replay_inputs
from rlkit.core.state.run_dir import RunDir, resolve_model_path
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import RolloutSample
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.state import records, rollout_view
from rlkit.core.state.checkpoint import write_checkpoint
from rlkit.errors import UserError
from rlkit.recipes.loader import config_to_yaml, load_config


def recorded_batch() -> Batch:
    """Two prompts x two samples, with what a step adds before the update. Sample 2 is a multi-turn
    episode: its middle token (13) came from the environment, so the loss mask leaves it out."""
    first, second = PromptRow(0, [5, 6, 7], "synthetic/echo", "1", {"split": "train"}), PromptRow(1, [11], "x", "2")
    trajectories = [
        Trajectory.single_turn(first, 0, RolloutSample(0, [8, 9], [-0.5, -1.25], finished=True)),
        Trajectory.single_turn(first, 0, RolloutSample(0, [10], [-2.0], finished=False)),
        Trajectory(second, 1, [12, 13, 14], loss_mask=[1, 0, 1], log_probs=[-0.1, 0.0, -0.3]),
        Trajectory.single_turn(second, 1, RolloutSample(1, [15], [-3.0], finished=True))]
    batch = build_batch(trajectories, pad_id=0)
    mask = batch["response_mask"]
    batch["scores"] = torch.tensor([1.0, 0.0, 0.25, 0.75])
    batch["advantages"] = torch.tensor([0.7071, -0.7071, -0.7071, 0.7071])[:, None] * mask
    batch["old_log_probs"] = (batch["rollout_log_probs"] - torch.tensor([[0.001, 0.002, 0.0]] * 4)) * mask
    return batch


def test_a_batch_round_trips_exactly(tmp_path) -> None:
    batch = recorded_batch()
    batch["advantages"] += torch.randn(batch["advantages"].shape) * 1e-3  # arbitrary float32 bits
    path = records.write_record(records.record_path(tmp_path, 7), 7, batch, {"actor/pg_loss": torch.tensor(0.5)})
    assert path == tmp_path / "rollouts" / "step_00000007.parquet"
    record = records.read_record(tmp_path, 7)
    assert (record.step, record.metrics) == (7, {"actor/pg_loss": 0.5})
    assert set(record.batch.tensors) == set(batch.tensors)
    for key, tensor in batch.tensors.items():
        assert record.batch[key].dtype == tensor.dtype and torch.equal(record.batch[key], tensor), key
    assert record.batch.meta == batch.meta
    assert records.read_record(tmp_path).step == 7  # the newest by default


def test_bfloat16_and_values_json_cannot_hold_are_recorded(tmp_path) -> None:
    batch = recorded_batch()
    batch["advantages"] = torch.tensor([[0.1, -0.3, 0.7]] * 4, dtype=torch.bfloat16)  # numpy has no bfloat16
    batch.meta["extra_info"][0] = {"raw": b"\x01", "split": "train"}  # bytes from a parquet column
    records.write_record(records.record_path(tmp_path, 1), 1, batch, {})
    record = records.read_record(tmp_path, 1)
    assert record.batch["advantages"].dtype == torch.bfloat16 and torch.equal(record.batch["advantages"],
                                                                                batch["advantages"])
    assert record.batch.meta["extra_info"][0] == {"raw": "b'\\x01'", "split": "train"}


def test_a_step_that_cannot_be_recorded_is_logged_and_skipped(tmp_path, caplog) -> None:
    recorder = records.RolloutRecorder(tmp_path, keep_steps=3)
    assert recorder.record(1, recorded_batch(), {"odd": object()}) is None  # a metric JSON cannot hold
    recorder.close()
    assert "recording step 1's rollouts failed (TypeError" in caplog.text and records.recorded_steps(tmp_path) == []


def test_missing_records_name_the_file_the_recorded_steps_and_the_option(tmp_path) -> None:
    run = fake_run(tmp_path, ["trainer.record_rollouts=false"], steps=0)
    with pytest.raises(UserError, match=r"no recorded step is missing: .*/rollouts/ holds no step_N.parquet, the run "
                                        r"trained with trainer.record_rollouts=false. Train, or resume, with "
                                        r"trainer.record_rollouts=true"):
        records.read_record(run.path)
    run = fake_run(tmp_path / "default", [], steps=0)  # recording on, keeping the last 3 steps (the defaults)
    for step in (1, 2, 3, 7):
        records.write_record(records.record_path(run.path, step), step, recorded_batch(), {})
    assert records.recorded_steps(run.path) == [1, 2, 3, 7]
    with pytest.raises(UserError, match=r"step 5's batch \(.*/rollouts/step_00000005.parquet\) is not on disk: the run "
                                        r"keeps only the last trainer.record_keep_steps=3 \(recorded: 1-3, 7\)\. To "
                                        r"keep more, train with trainer.record_keep_steps=0"):
        records.read_record(run.path, 5)
    with pytest.raises(UserError, match=r"step 9's batch .* that step was not recorded \(recorded: 1-3, 7\)"):
        records.read_record(run.path, 9)


def test_a_record_pruned_between_listing_and_reading_is_a_user_error(tmp_path, monkeypatch) -> None:
    run = fake_run(tmp_path, [], steps=0)
    for step in (2, 3, 4, 5):
        records.write_record(records.record_path(run.path, step), step, recorded_batch(), {})
    listings = iter([[1, 2, 3, 4, 5]])  # the first listing still had step 1, which the running run then pruned
    real = records.recorded_steps
    monkeypatch.setattr(records, "recorded_steps", lambda path: next(listings, None) or real(path))
    with pytest.raises(UserError, match=r"step 1's batch .* is not on disk: the run keeps only the last "
                                        r"trainer.record_keep_steps=3 \(recorded: 2-5\)"):
        records.read_record(run.path, 1)


def test_the_recorder_keeps_the_last_steps_and_touches_nothing_else(tmp_path) -> None:
    (tmp_path / "checkpoints" / "step_00000001").mkdir(parents=True)
    recorder = records.RolloutRecorder.for_run(load_config("grpo-demo", ["trainer.record_keep_steps=2"]), tmp_path)
    for step in (1, 2, 3, 4):
        recorder.record(step, recorded_batch(), {})
    recorder.wait()  # written on the recorder's thread
    assert records.recorded_steps(tmp_path) == [3, 4]
    # A killed run left steps 5 and 6; resumed from step 3's checkpoint, it writes step 4 again: the newer
    # records stay until the resumed run overwrites them, the older ones go.
    for step in (5, 6):
        records.write_record(records.record_path(tmp_path, step), step, recorded_batch(), {})
    recorder.record(4, recorded_batch(), {})
    recorder.wait()
    assert records.recorded_steps(tmp_path) == [3, 4, 5, 6]
    recorder.record(5, recorded_batch(), {})
    recorder.close()
    assert records.recorded_steps(tmp_path) == [4, 5, 6]
    assert (tmp_path / "checkpoints" / "step_00000001").is_dir()
    every = records.RolloutRecorder.for_run(load_config("grpo-demo", ["trainer.record_keep_steps=0"]), tmp_path)
    every.record(9, recorded_batch(), {})
    every.close()
    assert records.recorded_steps(tmp_path) == [4, 5, 6, 9]


def test_a_record_that_cannot_be_written_is_logged_and_the_run_goes_on(tmp_path, caplog) -> None:
    (tmp_path / "rollouts").write_text("a file where the folder should be")
    recorder = records.RolloutRecorder(tmp_path, keep_steps=3)
    assert recorder.record(2, recorded_batch(), {}) == tmp_path / "rollouts" / "step_00000002.parquet"
    recorder.close()
    assert "recording step 2's rollouts failed (FileExistsError" in caplog.text
    assert "training goes on" in caplog.text


def test_a_write_killed_midway_leaves_nothing_that_is_read_and_is_cleaned_on_restart(tmp_path, monkeypatch) -> None:
    records.write_record(records.record_path(tmp_path, 1), 1, recorded_batch(), {})

    def dies_midway(table, where, **kwargs) -> None:
        Path(where).write_bytes(b"PAR1 half a file")
        raise KeyboardInterrupt  # stands for the SIGKILL: nothing after this line runs

    monkeypatch.setattr(records.pq, "write_table", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        records.write_record(records.record_path(tmp_path, 2), 2, recorded_batch(), {})
    monkeypatch.undo()
    partial = tmp_path / "rollouts" / ".step_00000002.parquet.tmp"
    assert partial.exists() and records.recorded_steps(tmp_path) == [1]
    assert records.read_record(tmp_path).step == 1  # the newest complete record
    records.RolloutRecorder.for_run(load_config("grpo-demo"), tmp_path)  # the run starts again (resume)
    assert not partial.exists() and records.recorded_steps(tmp_path) == [1]


def test_the_recorder_writes_only_when_asked(tmp_path) -> None:
    off = records.RolloutRecorder.for_run(load_config("grpo-demo", ["trainer.record_rollouts=false"]), tmp_path)
    batch = recorded_batch()
    assert not off.on and off.record(1, batch, {}) is None and not (tmp_path / "rollouts").exists()

    on = records.RolloutRecorder.for_run(load_config("grpo-demo"), tmp_path)  # on by default
    assert on.on


def test_a_recorded_step_asks_its_update_for_the_trainer_log_probs() -> None:
    """Only where no old-log-prob pass gave them (one optimizer step) and the engine gave its own to compare."""
    own_old = Algorithm.from_config(load_config("grpo-demo"))
    assert own_old.old_log_probs_from_update and not own_old.rollout_log_probs
    asks = UpdateInputs.for_step(own_old, log_prob_check=True, recording=True)
    assert asks.keep_log_probs and "trainer_log_probs" not in asks.keys()  # not an input: the update's output
    assert not UpdateInputs.for_step(own_old, log_prob_check=True, recording=False).keep_log_probs
    assert not UpdateInputs.for_step(own_old, log_prob_check=False, recording=True).keep_log_probs  # no engine side
    with_pass = Algorithm.from_config(load_config("grpo-demo", ["actor.ppo_epochs=2"]))  # old log-probs recorded
    assert not with_pass.old_log_probs_from_update
    assert not UpdateInputs.for_step(with_pass, log_prob_check=True, recording=True).keep_log_probs


def test_a_record_keeps_the_step_s_values(tmp_path) -> None:
    on = records.RolloutRecorder.for_run(load_config("grpo-demo"), tmp_path)
    batch = recorded_batch()
    assert on.record(3, batch, {"reward/mean": 0.5}) == tmp_path / "rollouts" / "step_00000003.parquet"
    batch["scores"][0] = 7.0  # the batch changes while the record is written: the record keeps the step's values
    on.close()
    assert records.read_record(tmp_path, 3).batch["scores"][0] == 1.0


@pytest.fixture
def tokenizer(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path_factory.mktemp("cache")))
    return AutoTokenizer.from_pretrained(resolve_model_path("rlkit:tiny-qwen2"))


def test_views_show_per_token_gaps_advantages_and_sort(tmp_path, tokenizer) -> None:
    record = records.Record(4, recorded_batch(), {})
    views = rollout_view.sample_views(record, tokenizer)
    assert [v.tokens for v in views] == [[tokenizer.decode([8]), tokenizer.decode([9])], [tokenizer.decode([10])],
                                         [tokenizer.decode([t]) for t in (12, 13, 14)], [tokenizer.decode([15])]]
    assert views[0].prompt == tokenizer.decode([5, 6, 7]) and views[2].prompt == tokenizer.decode([11])
    assert views[0].gaps == pytest.approx([0.001, 0.002], abs=1e-7)  # float32 differences
    # the environment's token is shown, not trained, and has no gap
    assert views[2].trained == [True, False, True]
    assert views[2].gaps[0] == pytest.approx(0.001, abs=1e-7) and views[2].gaps[1:] == [None, 0.0]
    assert views[0].mean_gap == pytest.approx(0.0015, abs=1e-7)
    assert [v.advantage for v in views] == pytest.approx([0.7071, -0.7071, -0.7071, 0.7071])
    assert [v.index for v in rollout_view.sort_views(views, "reward")] == [0, 3, 2, 1]
    assert [v.index for v in rollout_view.sort_views(views, "advantage", descending=False)][:2] == [1, 2]
    assert not views[1].finished
    stats = rollout_view.summary(record, views)
    assert stats["reward_mean"] == pytest.approx(0.5) and stats["gap_max"] == pytest.approx(0.002, abs=1e-7)
    text = rollout_view.markdown(record, views)
    assert text.startswith("**step 4**: samples 4, groups 2, reward_mean 0.5")
    assert text.splitlines()[4].startswith("| 0 | 0 | 1 | +0.7071 | 0.0015 |")

    without_engine = recorded_batch()
    del without_engine.tensors["rollout_log_probs"]
    assert rollout_view.sample_views(records.Record(4, without_engine, {}), tokenizer)[0].gaps is None


def test_the_summary_goes_to_tensorboard(tmp_path, tokenizer) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = records.Record(4, recorded_batch(), {})
    folder = rollout_view.write_tensorboard(tmp_path, record, rollout_view.sample_views(record, tokenizer))
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    [event] = events.Tensors("rollouts/text_summary")
    assert event.step == 4 and b"**step 4**" in event.tensor_proto.string_val[0]


def fake_run(tmp_path: Path, overrides: list[str], steps: int) -> RunDir:
    config = load_config("grpo-demo", [f"trainer.runs_dir={tmp_path}", *overrides])
    run = RunDir.create(config, "run")
    for step in range(1, steps + 1):
        write_checkpoint(run.path, step, reason="periodic", write_shards=lambda folder: None, trainer_state={},
                         controller_rng={}, config_yaml=config_to_yaml(config), keep_last=10)
    return run


def test_replay_accepts_update_settings_and_refuses_the_rest(tmp_path) -> None:
    run = fake_run(tmp_path, [], steps=2)
    config, ckpt, changed = replay_config(run, 3, ["actor.clip_ratio_high=0.28"])
    assert ckpt.step == 2 and config.actor.clip_ratio_high == 0.28
    assert changed == {"actor.clip_ratio_high": (0.2, 0.28)}
    assert replay_config(run, 1, [])[1] is None  # step 1 starts from the base model
    with pytest.raises(UserError, match=r"a replay re-runs only the update on the recorded batch, so "
                                        r"algorithm.adv_estimator, rollout.n would change nothing or break it"):
        replay_config(run, 2, ["rollout.n=4", "algorithm.adv_estimator=rloo"])
    with pytest.raises(UserError, match=r"replaying step 5 needs the checkpoint of step 4 "
                                        r"\(.*/checkpoints/step_00000004\): .*checkpoints: 1, 2\)\. "
                                        r"Train with trainer.save_freq=1"):
        replay_config(run, 5, [])


def test_replay_names_everything_it_misses_at_once(tmp_path) -> None:
    run = fake_run(tmp_path, [], steps=2)
    records.write_record(records.record_path(run.path, 3), 3, recorded_batch(), {})
    assert replay_inputs(run, 3, [])[0].step == 3  # record of step 3, checkpoint of step 2: enough
    with pytest.raises(UserError) as missing:
        replay_inputs(run, 5, [])
    lines = str(missing.value).splitlines()
    assert lines[0] == "cannot replay step 5:" and len(lines) == 3
    assert "step 5's batch" in lines[1] and "/rollouts/step_00000005.parquet" in lines[1]
    assert "needs the checkpoint of step 4" in lines[2] and "trainer.save_freq=1" in lines[2]


def test_replay_refuses_a_critic_warm_up_step(tmp_path) -> None:
    run = fake_run(tmp_path, ["algorithm.adv_estimator=gae", "critic.warmup_steps=2"], steps=2)
    with pytest.raises(UserError, match="step 2 trained only the critic"):
        replay_config(run, 2, [])


def test_replay_differences_list_every_compared_metric() -> None:
    result = Replay(3, {"actor/pg_loss": 0.5, "actor/grad_norm": 2.0, "actor/entropy": 4.0},
                    {"actor/pg_loss": 0.25, "actor/grad_norm": 2.0, "actor/lr": 1e-3, "actor/new_metric": 1.0}, {}, "x")
    assert result.differences() == {"actor/pg_loss": (0.5, 0.25, -0.25), "actor/grad_norm": (2.0, 2.0, 0.0),
                                     "actor/entropy": (4.0, None, None), "actor/lr": (None, 1e-3, None),
                                     "actor/new_metric": (None, 1.0, None)}
    assert json.dumps(result.differences())  # printable as is
