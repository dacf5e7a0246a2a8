"""The controller's algorithm phases without Ray: DAPO dynamic sampling with overlong shaping, and
ReMax's greedy baseline, against hand-computed batches.

A stand-in for the policy workers answers `generate` from a script, so which groups have signal
and what each response scores are known in advance.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import pytest
import torch
from transformers import AutoTokenizer

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.kl import FixedKLController
from rlkit.core.controller.controller import Controller
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.data.dataset import PromptRow, PromptSampler
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.base import RolloutSample, Sampling, request_seed, returns_log_probs
from rlkit.core.rollout.source import SyncScheduler
from rlkit.core.rollout.stages import RolloutStages
from rlkit.recipes.loader import load_config

TINY = ["model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "data.train_batch_size=2", "rollout.n=2",
        "actor.mini_batch_size=2", "data.max_prompt_length=16", "data.max_response_length=3",
        "actor.micro_batch_tokens=4096", "reward.num_workers=1", "data.shuffle=false"]


class ScriptedWorkers:
    """Answers the controller's `generate` calls with respond(call number, prompt row, sample index)."""

    def __init__(self, rows: list[PromptRow], respond: Callable[[int, PromptRow, int], list[int]]) -> None:
        self.by_prompt = {tuple(row.prompt_token_ids): row for row in rows}
        self.respond, self.samplings = respond, []

    def submit(self, method, *, per_rank: list[tuple]) -> list[list[RolloutSample]]:
        """The results themselves stand in for the calls' ObjectRefs (answered at once)."""
        assert method.__name__ == "generate"
        results = []
        for prompts, sampling in per_rank:
            self.samplings.append(sampling)
            results.append([RolloutSample(i, tokens, [-0.5] * len(tokens) if with_log_probs else [], finished=True)
                            for i, prompt in enumerate(prompts) for j in range(sampling.n)
                            for tokens in [self.respond(len(self.samplings), self.by_prompt[tuple(prompt)], j)]
                            for with_log_probs in [returns_log_probs(sampling, request_seed(sampling, i, j))]])
        return results

    def collect(self, refs: list[list[RolloutSample]], phase: str) -> list[list[RolloutSample]]:
        return refs


@pytest.fixture
def tokenizer(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path_factory.mktemp("cache")))
    return AutoTokenizer.from_pretrained(resolve_model_path("rlkit:tiny-qwen2"))


def make_controller(recipe: str, overrides: list[str], tokenizer, respond) -> tuple[Controller, ScriptedWorkers]:
    config = load_config(recipe, [*TINY, *overrides])
    controller = Controller.__new__(Controller)  # the phases under test need no Ray workers
    controller.config, controller.tokenizer = config, tokenizer
    controller.algorithm = Algorithm.from_config(config)
    controller.rows = [PromptRow(i, tokenizer(f"echo {i}")["input_ids"], "synthetic/echo", str(i)) for i in range(8)]
    sampler = PromptSampler(8, config.data.train_batch_size, seed=0, shuffle=False)
    controller.scorer = RewardScorer(config.reward)
    controller.workers = ScriptedWorkers(controller.rows, respond)
    # Colocated placement: the training workers also generate.
    controller.placement = SimpleNamespace(rollout=controller.workers, rollout_size=config.world_size)
    stages = RolloutStages.build(config, controller.algorithm, controller.rows, sampler, tokenizer, controller.scorer,
                                 controller.placement)
    controller.source = SyncScheduler(stages, controller.placement)
    controller.kl_ctrl = FixedKLController(config.algorithm.kl_ctrl.kl_coef)
    return controller, controller.workers


def test_dynamic_sampling_keeps_groups_with_signal_and_shapes_overlong_answers(tokenizer) -> None:
    eos = tokenizer.eos_token_id
    right = {i: [tokenizer.convert_tokens_to_ids(str(i)), eos] for i in range(8)}  # 2 tokens: inside the buffer
    wrong = [tokenizer.convert_tokens_to_ids("9")] * 3  # 3 tokens: at the limit
    # Rows come in order (no shuffle), two per round: round 1 rows 0, 1; round 2 rows 2, 3; round 3 rows 4, 5.
    plan = {0: [True, True], 1: [True, False], 2: [False, False], 3: [False, False], 4: [True, False],
            5: [False, False]}

    def respond(call: int, row: PromptRow, j: int) -> list[int]:
        return right[row.index] if plan[row.index][j] else wrong

    controller, workers = make_controller("dapo", ["reward.overlong_buffer.length=2",
                                                   "algorithm.dynamic_sampling.max_gen_rounds=5"], tokenizer, respond)
    batch, metrics = controller.source.next_batch(1, {})
    # Max length 3, buffer 2: 2 tokens -> -0.5, 3 tokens -> -1. Right scores 1 - 0.5, wrong 0 - 1.
    # Round 1 keeps row 1 (row 0 is all right), round 2 keeps nothing, round 3 keeps row 4 and stops:
    # rows 0, 2, 3 and 5 are dropped.
    assert len(workers.samplings) == 3
    assert batch.meta["row_index"] == [1, 1, 4, 4]
    assert batch["group_ids"].tolist() == [0, 0, 1, 1]
    assert batch["verifier_scores"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch["scores"].tolist() == [0.5, -1.0, 0.5, -1.0]
    assert batch["response_mask"].sum(-1).tolist() == [2, 3, 2, 3]
    # All 12 samples: row 0 [.5, .5], row 1 [.5, -1], rows 2, 3 and 5 all -1, row 4 [.5, -1]: sum -6.
    assert metrics["dapo/reward_mean_sampled"] == pytest.approx(-0.5)
    assert metrics["rollout/samples"] == 12
    assert (metrics["dapo/gen_rounds"], metrics["dapo/groups_dropped"], metrics["dapo/groups_filled"]) == (3, 4, 0)
    # Each round samples from its own seed range.
    assert len({s.seed for s in workers.samplings}) == 3


def test_remax_baseline_is_the_greedy_score_of_each_prompt(tokenizer) -> None:
    eos = tokenizer.eos_token_id

    def respond(call: int, row: PromptRow, j: int) -> list[int]:
        # Sampled answers (call 1) are right for sample 0 only; the greedy one (call 2) only for row 0.
        if call == 1:
            return [tokenizer.convert_tokens_to_ids(str(row.index)), eos] if j == 0 else [eos]
        return [tokenizer.convert_tokens_to_ids(str(row.index) if row.index == 0 else "9"), eos]

    controller, workers = make_controller("remax", ["rollout.n=2"], tokenizer, respond)
    batch, metrics = controller.source.next_batch(1, {})
    greedy: Sampling = workers.samplings[-1]
    assert greedy.greedy and greedy.n == 1
    assert batch["scores"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch["baseline_scores"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert (metrics["remax/baseline_score_mean"], metrics["rollout/greedy_samples"]) == (0.5, 2.0)
    # ReMax advantages: score - baseline, on every response token (the recipe's in-reward KL is 0 here).
    batch["old_log_probs"] = batch["ref_log_probs"] = torch.zeros_like(batch["response_mask"])
    advantages = controller.advantages(batch)["advantages"]
    assert advantages[:, 0].tolist() == [0.0, -1.0, 1.0, 0.0]


@pytest.mark.parametrize("overrides, asked", [
    (["rollout.log_prob_check_freq=3"], [True, False, True, False, False, True]),  # step 1: the invariants
    (["rollout.log_prob_check_freq=3", "trainer.invariants=off"], [False, False, True, False, False, True]),
    (["rollout.log_prob_check_freq=0"], [True] + [False] * 5),
    (["rollout.log_prob_check_freq=0", "trainer.invariants=off"], [False] * 6),
    (["rollout.log_prob_check_freq=0", "actor.old_log_probs=rollout"], [True] * 6),  # the PPO ratio needs them
    (["rollout.log_prob_check_freq=0", "actor.rollout_is_cap=2.0"], [True] * 6),     # and so do TIS weights
])
def test_engine_log_probs_are_asked_for_only_on_check_steps(tokenizer, overrides, asked) -> None:
    eos = tokenizer.eos_token_id
    controller, workers = make_controller("grpo", overrides, tokenizer, lambda call, row, j: [eos])
    batches = [controller.source.next_batch(step, {})[0] for step in range(1, 7)]
    assert [s.log_probs for s in workers.samplings] == asked
    assert ["rollout_log_probs" in batch for batch in batches] == asked


@pytest.mark.parametrize("overrides, every, rows", [
    ([], 2, 32),                           # a check step of 8 x 8 samples: one in 64 // 32 = 2, by seed
    (["data.train_batch_size=4", "actor.mini_batch_size=4"], 1, 32),  # 32 samples, fewer than 2 x 32: all
    (["actor.rollout_is_cap=2.0"], 1, 64),  # TIS weights read every sample's
])
def test_a_check_step_takes_log_probs_from_a_share_of_the_samples(tokenizer, overrides, every, rows) -> None:
    eos = tokenizer.eos_token_id
    controller, workers = make_controller("grpo", ["data.train_batch_size=8", "rollout.n=8",
                                                   "actor.mini_batch_size=8", *overrides], tokenizer,
                                          lambda call, row, j: [eos])
    batch, _ = controller.source.next_batch(1, {})  # step 1: the invariants' check step
    (sampling,) = workers.samplings
    assert sampling.log_probs and sampling.log_prob_every == every
    assert int(batch["rollout_log_prob_rows"].sum()) == rows
    seeds = [request_seed(sampling, i, j) for i in range(len(batch) // 8) for j in range(8)]
    assert batch["rollout_log_prob_rows"].tolist() == [seed % every == 0 for seed in seeds]
    assert (batch["rollout_log_probs"][:, 0] == -0.5).tolist() == batch["rollout_log_prob_rows"].tolist()
