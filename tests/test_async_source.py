"""The asynchronous rollout source's schedule without Ray: which weights each batch is generated with.

A stand-in for the split placement runs every call at once, in submission order (as a Ray
actor runs its calls), and answers each prompt (or runs each episode) with the token `10 + the
step whose update made the weights its engine holds`, so a test sees the weights that really
generated a sample next to the version the source recorded for it.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.controller.placement import PendingSync
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.dataset import PromptRow, PromptSampler
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.async_source import AsyncScheduler
from rlkit.core.rollout.base import RolloutSample
from rlkit.core.rollout.stages import RolloutStages
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.recipes.loader import load_config

SPLIT = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "data.train_batch_size=2", "rollout.n=2",
         "actor.mini_batch_size=2", "data.max_prompt_length=16", "data.max_response_length=1",
         "reward.num_workers=1", "trainer.n_gpus_per_node=2", "rollout.placement=split", "rollout.devices=1"]


class ScriptedSplitPlacement:
    """One rollout worker whose engine holds `engine_version`; weight loads and generations in call order."""

    def __init__(self) -> None:
        self.rollout, self.rollout_size = self, 1
        self.engine_version = 0   # the weights the engine holds
        self.trainer_version = 0  # the weights the trainer would send now
        self.calls: list[tuple[str, int]] = []
        self.samplings: list = []

    def submit(self, method, *, per_rank: list[tuple]) -> list:
        timed = method.__name__ == "timed"  # the worker's wrapper: (method, *args) -> (result, timing)
        method = (per_rank[0][0] if timed else method).__name__
        self.calls.append((method, self.engine_version))
        self.samplings += [args[-1] for args in per_rank]
        results = [getattr(self, method)(*(args[1:] if timed else args)) for args in per_rank]
        return [(result, {"seconds": 2.0, "idle_seconds": 0.5}) for result in results] if timed else results

    def generate(self, prompts: list[list[int]], sampling) -> list[RolloutSample]:
        return [RolloutSample(i, [10 + self.engine_version], [-0.5], finished=True)
                for i in range(len(prompts)) for _ in range(sampling.n)]

    def agent_episodes(self, rows: list[PromptRow], groups: list[int], sampling, scored=False) -> list[Trajectory]:
        """Two turns: the policy's token, then the environment's (not trained); scored after (no outcomes)."""
        return [Trajectory(row, group, [10 + self.engine_version, 20], [1, 0], [-0.5, 0.0], info={"turns": 2})
                for row, group in zip(rows, groups) for _ in range(sampling.n)]

    def collect(self, refs: list, phase: str) -> list:
        return refs

    def start_sync(self) -> PendingSync:
        self.engine_version = self.trainer_version  # the load runs after every call submitted before it
        self.calls.append(("load", self.engine_version))
        return PendingSync({"sync/seconds": 0.1}, ["load"])

    def finish_sync(self, pending: PendingSync) -> dict[str, float]:
        return {"sync/bytes": 8.0, "rollout/wait_for_weights_seconds": 0.3}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLKIT_CACHE", str(tmp_path_factory.mktemp("cache")))
        return AutoTokenizer.from_pretrained(resolve_model_path("rlkit:tiny-qwen2"))


def make_source(overrides: list[str], tokenizer, *, shuffle: bool = True, rule_scores=None) -> AsyncScheduler:
    """`rule_scores`: batch -> one score per sample, in place of the reward function's."""
    config = load_config("grpo-demo", [*SPLIT, *overrides])
    rows = [PromptRow(i, tokenizer(f"echo {i}")["input_ids"], "synthetic/echo", str(i)) for i in range(8)]
    sampler = PromptSampler(8, config.data.train_batch_size, seed=0, shuffle=shuffle)
    placement = ScriptedSplitPlacement()
    stages = RolloutStages.build(config, Algorithm.from_config(config), rows, sampler, tokenizer,
                                 RewardScorer(config.reward), placement)
    if rule_scores is not None:
        stages.score.rule_scores = lambda batch, outcomes=None: (rule_scores(batch), {}, {})  # no reward components
    return AsyncScheduler(stages, placement, config.rollout)


def generating_version(batch) -> torch.Tensor:
    """Scores that show which weights generated each response (its token is 10 + their step)."""
    return (batch["responses"][:, 0] - 10).float()


def signal_on_rows_0_2_3_5(batch) -> torch.Tensor:
    """The second sample of rows 0, 2, 3 and 5 scores 1, every other 0: only those rows' groups have signal."""
    return torch.tensor([float(row in (0, 2, 3, 5) and i % 2 == 1) for i, row in enumerate(batch.meta["row_index"])])


ASYNC = ["rollout.mode=async", "rollout.max_staleness=2"]
REMAX = ["algorithm.adv_estimator=remax"]
AGENT = ["rollout.agent.loop=tool", "rollout.agent.tools=[lookup]", "data.max_response_length=2"]
DAPO = ["algorithm.dynamic_sampling.enable=true", "algorithm.dynamic_sampling.max_gen_rounds=3"]


def train(source: AsyncScheduler, steps: range, warmup_steps: int = 0) -> list[tuple]:
    """The controller's loop around the source: take the step's batch, update and send the weights
    (not during critic warm-up: the actor is left as it is and nothing is sent)."""
    out = []
    for step in steps:
        batch, metrics = source.next_batch(step, {})
        if step > warmup_steps:
            source.placement.trainer_version = step
            metrics.update(source.sync_weights(step))
        out.append((batch, metrics))
    return out


@pytest.mark.parametrize("mode, lookahead", [(["rollout.mode=one_step_off"], 1),
                                             (["rollout.mode=async", "rollout.max_staleness=2"], 2),
                                             (["rollout.mode=async", "rollout.max_staleness=3"], 3)])
def test_the_batch_of_step_s_is_generated_with_version_s_minus_1_minus_lookahead(mode, lookahead, tokenizer):
    source = make_source(mode, tokenizer)
    assert source.lookahead == lookahead
    for step, (batch, metrics) in enumerate(train(source, range(1, 9)), start=1):
        expected = max(0, step - 1 - lookahead)
        generated_with = batch["responses"][:, 0] - 10  # what the engine really held
        assert generated_with.tolist() == [expected] * 4
        assert batch["policy_version"].tolist() == [expected] * 4  # what the source recorded
        # Trained by version step - 1: never more than `lookahead` versions stale.
        assert metrics["rollout/staleness_max"] == metrics["rollout/staleness_mean"] == min(step - 1, lookahead)
        assert metrics["rollout/policy_version_min"] == expected
        assert metrics["rollout/generate_seconds"] == 2.0 and metrics["rollout/idle_seconds"] == 0.5
        # A batch submitted after a weight load reports that load (the first 1 + lookahead were not).
        assert ("rollout/wait_for_weights_seconds" in metrics) == (step > 1 + lookahead)
    # Step 1 submits the batches of steps 1..1+L at once; then one per step, each after the last load.
    calls = source.placement.calls
    assert calls[:1 + lookahead] == [("generate", 0)] * (1 + lookahead)
    assert calls[1 + lookahead:1 + lookahead + 2] == [("load", 1), ("generate", 1)]


@pytest.mark.parametrize("mode, versions, weights, staleness", [
    (["rollout.mode=one_step_off"], [0, 0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 3, 4, 5, 6], [0, 1, 1, 1, 1, 1, 1, 1]),
    (["rollout.mode=async", "rollout.max_staleness=2"], [0, 0, 0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 3, 4, 5],
     [0, 1, 2, 2, 2, 2, 2, 2])])
def test_steps_that_leave_the_weights_as_they_are_still_advance_the_policy_version(mode, versions, weights, staleness,
                                                                                   tokenizer):
    """Critic warm-up: steps 1 and 2 update only the critic and send no weights. A version is the last
    completed step all the same; counted by weight syncs instead, step 4 of max_staleness=2 trained a
    batch 'version 0' with 'version 3' (staleness 3) although no update happened in between."""
    source = make_source(mode, tokenizer)
    trained = train(source, range(1, 9), warmup_steps=2)
    assert [batch["policy_version"].tolist() for batch, _ in trained] == [[v] * 4 for v in versions]
    # The engine held the last update's weights at or before that version: the same weights.
    assert [(batch["responses"][:, 0] - 10).tolist() for batch, _ in trained] == [[w] * 4 for w in weights]
    assert [metrics["rollout/staleness_max"] for _, metrics in trained] == staleness


def test_the_batch_of_step_s_has_the_prompts_and_seeds_sync_mode_gives_step_s(tokenizer):
    source = make_source(["rollout.mode=async", "rollout.max_staleness=2"], tokenizer)
    batches = [b for b, _ in train(source, range(1, 5))]
    sync = make_source([], tokenizer)  # the same sampler and seeds, step by step
    for step, batch in enumerate(batches, start=1):
        assert batch.meta["row_index"] == [i for i in sync.stages.prompts.sampler.next_batch() for _ in range(2)]
    # Submitted ahead (steps 1..3 at step 1), but each with its own step's sampling seed.
    seeds = [sampling.seed for sampling in source.placement.samplings]
    assert seeds == [(sync.stages.generate.sampling(step).seed * 1009) for step in range(1, 7)]


def test_agent_episodes_are_run_ahead_and_scored_with_their_agent_metrics(tokenizer):
    source = make_source([*ASYNC, *AGENT], tokenizer)
    trained = train(source, range(1, 5))
    assert source.placement.calls == [("agent_episodes", 0)] * 3 + [("load", 1), ("agent_episodes", 1), ("load", 2),
                                                                     ("agent_episodes", 2), ("load", 3),
                                                                     ("agent_episodes", 3), ("load", 4)]
    assert [batch["policy_version"].tolist() for batch, _ in trained] == [[0] * 4, [0] * 4, [0] * 4, [1] * 4]
    batch, metrics = trained[3]
    assert batch["response_mask"].tolist() == [[1, 0]] * 4  # the environment's token is not trained
    assert batch["responses"][:, 0].tolist() == [11] * 4  # generated by the weights of step 1
    assert metrics["agent/turns_mean"] == 2.0 and metrics["agent/env_tokens_mean"] == 1.0
    assert metrics["rollout/staleness_max"] == 2 and metrics["rollout/generate_seconds"] == 2.0


def test_remax_baseline_is_generated_right_behind_its_batch_by_the_same_version(tokenizer):
    source = make_source([*ASYNC, *REMAX], tokenizer, rule_scores=generating_version)
    trained = train(source, range(1, 6))
    # Each batch's sampled call, then its greedy one: no weight load between them.
    assert source.placement.calls == [("generate", 0)] * 6 + [("load", 1), ("generate", 1), ("generate", 1),
                                                              ("load", 2), ("generate", 2), ("generate", 2),
                                                              ("load", 3), ("generate", 3), ("generate", 3),
                                                              ("load", 4), ("generate", 4), ("generate", 4),
                                                              ("load", 5)]
    assert [(s.greedy, s.n) for s in source.placement.samplings] == [(False, 2), (True, 1)] * 7
    for step, (batch, metrics) in enumerate(trained, start=1):
        version = max(0, step - 3)
        assert batch["scores"].tolist() == [version] * 4
        assert batch["baseline_scores"].tolist() == [version] * 4  # not step - 1's greedy answers
        assert metrics["rollout/greedy_samples"] == 2 and metrics["rollout/generate_seconds"] == 4.0


def test_dynamic_samplings_extra_rounds_are_generated_when_the_step_takes_its_batch(tokenizer):
    source = make_source([*ASYNC, *DAPO], tokenizer, shuffle=False, rule_scores=signal_on_rows_0_2_3_5)
    trained = train(source, range(1, 5))
    # Rows in order, two a round. Step 1 submits steps 1-3 (rows 0 1, 2 3, 4 5) and keeps row 0 of its own;
    # its extra rounds draw rows 6 7 (no signal) and 0 1 (row 0 again). Step 2 submits step 4 (rows 2 3),
    # then takes rows 2 3: both have signal. Step 3 submits step 5 (rows 4 5), keeps row 5, and its extra
    # rounds, with the weights of step 2, draw rows 6 7 and 0 1 again. Step 4 takes rows 2 3 (version 1).
    assert [batch.meta["row_index"] for batch, _ in trained] == [[0, 0, 0, 0], [2, 2, 3, 3], [5, 5, 0, 0],
                                                                 [2, 2, 3, 3]]
    assert [batch["policy_version"].tolist() for batch, _ in trained] == [[0] * 4, [0] * 4, [0, 0, 2, 2], [1] * 4]
    assert [metrics["dapo/gen_rounds"] for _, metrics in trained] == [3, 1, 3, 1]
    assert [metrics["rollout/staleness_max"] for _, metrics in trained] == [0, 1, 2, 2]
    assert trained[2][1]["rollout/staleness_mean"] == 1.0
    # Extra rounds queue behind the batches in flight (not timed), with their own rounds' seeds.
    assert source.placement.calls == [("generate", 0)] * 5 + [("load", 1), ("generate", 1), ("load", 2)] + \
        [("generate", 2)] * 3 + [("load", 3), ("generate", 3), ("load", 4)]
    generate = make_source(DAPO, tokenizer).stages.generate
    assert [s.seed for s in source.placement.samplings[3:5]] == [generate.sampling(1, round_index=r).seed * 1009
                                                                  for r in (1, 2)]


@pytest.mark.parametrize("overrides, rule_scores", [([], None), (REMAX, generating_version), (AGENT, None),
                                                    (DAPO, signal_on_rows_0_2_3_5)], ids=["grpo", "remax", "agent",
                                                                                          "dapo"])
def test_a_checkpoint_drains_the_batches_in_flight_and_a_resumed_source_continues_exactly(overrides, rule_scores,
                                                                                         tokenizer):
    mode = [*ASYNC, *overrides]
    reference = train(make_source(mode, tokenizer, rule_scores=rule_scores), range(1, 9))

    killed = make_source(mode, tokenizer, rule_scores=rule_scores)
    train(killed, range(1, 5))
    state = json.loads(json.dumps(killed.state_dict()))  # through JSON, as trainer_state.json holds it
    assert state["rollout_submitted_through"] == 6
    assert [e["step"] for e in state["rollout_in_flight"]] == [5, 6]
    assert [t["policy_version"] for t in state["rollout_in_flight"][0]["trajectories"]] == [2] * 4
    baseline = state["rollout_in_flight"][0]["baseline"]  # ReMax's greedy answers are in flight too
    assert baseline is None if overrides != REMAX else [t["policy_version"] for t in baseline] == [2, 2]

    resumed = make_source(mode, tokenizer, rule_scores=rule_scores)  # a new process: the engine holds the base model
    resumed.placement.trainer_version = 4  # the trainer loaded step 4's checkpoint
    resumed.sync_weights(4)  # as Controller.load_checkpoint does, before the source's state
    resumed.load_state_dict(state)
    for (want_batch, want), (got_batch, got) in zip(reference[4:], train(resumed, range(5, 9))):
        assert set(got) == set(want)
        assert {k: v for k, v in got.items() if "seconds" not in k} == {k: v for k, v in want.items()
                                                                         if "seconds" not in k}
        for key, tensor in want_batch.tensors.items():
            assert torch.equal(got_batch[key], tensor), key
        assert got_batch.meta == want_batch.meta
