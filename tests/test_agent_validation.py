"""Validation of an agent run without Ray: the Evaluator runs whole episodes (the run's agent loop,
tools or environment, turn limits) on a scripted engine, scores them as training does, reports
val/agent/* metrics, writes each conversation, and spreads over ranks with validation's seeds."""

from __future__ import annotations

import json

import pytest
import torch
from agent_helpers import ScriptedEngine, rows
from transformers import AutoTokenizer

from rlkit.core.agents.report import EnvironmentFailures
from rlkit.core.controller.validation import (
    Evaluator,
    ValSettings,
    engine_episodes,
    scorer_score,
    val_seed,
    workers_episodes,
)
from rlkit.core.cluster.phases import PhaseReporter
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.generator import Generator
from rlkit.core.tiny import TOOL_CALL_TOKEN
from rlkit.recipes.loader import load_config

TURN_SEED_STRIDE = 1_000_003  # rlkit.core.agents.loop: turn t's seeds start t * this after turn 0's


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _config(*overrides: str):
    return load_config("grpo-agent-demo", ["reward.num_workers=1", "trainer.seed=3", *overrides])


def _evaluator(config, tok, data, generate, scorer) -> Evaluator:
    return Evaluator(data, tok, ValSettings.from_config(config), generate, scorer_score(scorer), config.reward,
                     config.rollout.agent)


def _call_then(tok, digit: str):
    """The policy calls `lookup`, then answers `digit` whatever the tool said."""
    call, answer = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN), tok.convert_tokens_to_ids(digit)
    return lambda ctx: ([call], False) if call not in ctx else ([answer], False)


def test_tool_episodes_are_validated_whole_and_scored_by_the_reward_function(tok, tmp_path):
    """lookup_reward: 1 for the secret after a call, 0.2 for another digit after a call. The policy
    always answers 5: rows whose secret is 5 score 1, the others 0.2, greedy and sampled alike."""
    config = _config("trainer.val_n=2")
    engine = ScriptedEngine(_call_then(tok, "5"))
    data = rows(tok, ["secret?"] * 4, ["5", "2", "5", "7"])
    with RewardScorer(config.reward) as scorer:
        evaluator = _evaluator(config, tok, data, engine_episodes(engine, config, tok), scorer)
        metrics = evaluator.run(6, tmp_path / "step_6.jsonl")
    assert {k: v for k, v in metrics.items() if "/synthetic/" not in k} == pytest.approx({
        "val/reward/mean@1": (1 + 0.2 + 1 + 0.2) / 4, "val/reward/mean@2": 0.6,
        "val/reward/pass@1": 0.5, "val/reward/pass@2": 0.5, "val/reward/maj@2": 0.6,  # every answer is "5"
        "val/response/length_mean": 7.0, "val/response/clip_frac": 0.0,  # 1 + 5 tool tokens + 1; ended by the policy
        "val/agent/turns_mean": 2.0, "val/agent/env_tokens_mean": 5.0, "val/agent/truncated": 0.0,
        "val/agent/env_errors": 0.0, "val/agent/tool_calls": 1.0, "val/agent/tool_errors": 0.0})
    # Two turns each for the greedy episodes, then for the 8 sampled ones, seeded by validation's stream.
    assert [(len(prompts), s.greedy, s.prompt_seeds[0]) for prompts, s in engine.calls] == [
        (4, True, val_seed(3, 6)), (4, True, val_seed(3, 6) + TURN_SEED_STRIDE),
        (8, False, val_seed(3, 6)), (8, False, val_seed(3, 6) + TURN_SEED_STRIDE)]
    assert all(s.max_tokens == 1 and not s.log_probs for _, s in engine.calls)  # max_tokens_per_turn=1
    lines = [json.loads(line) for line in (tmp_path / "step_6.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["row"], r["sample"], r["score"]) for r in lines[:5]] == [
        ("greedy", 0, 0, 1.0), ("greedy", 1, 0, 0.2), ("greedy", 2, 0, 1.0), ("greedy", 3, 0, 0.2),
        ("sample", 0, 0, 1.0)]
    second = lines[1]
    assert second["response"] == TOOL_CALL_TOKEN + "5"  # what was scored: the policy's own tokens
    assert (second["turns"], second["finish_reason"], second["env_error"]) == (2, "stop", None)
    policy_1, tool, policy_2 = second["conversation"]
    assert policy_1 == {"from": "policy", "text": TOOL_CALL_TOKEN} and policy_2 == {"from": "policy", "text": "5"}
    # The tool's answer (the secret, 2) between the tiny template's turn markers.
    assert tool == {"from": "environment", "text": "<|im_end|><|im_start|>2<|im_end|><|im_start|>"}


ENV = """
class Countdown:
    '''Done when the policy says "a"; the reward is the row's number / 4 (raises on "boom").'''
    def reset(self, row):
        self.row = row
    def step(self, action):
        if self.row["ground_truth"] == "boom":
            raise RuntimeError("cannot score " + action)
        if action != "a":
            return "again", None, False
        return None, 0.25 * int(self.row["ground_truth"]), True
"""


def _env_config(tmp_path, *overrides: str):
    (tmp_path / "env.py").write_text(ENV)
    return _config("rollout.agent.loop=env", f"rollout.agent.env={tmp_path}/env.py:Countdown", "rollout.agent.tools=[]",
                   "rollout.agent.max_turns=3", "data.max_response_length=64", *overrides)


def test_an_environments_reward_counts_and_a_failed_episode_scores_0(tok, tmp_path):
    """Greedy only (val_n=0): the policy says "b" on its first turn and "a" on its second, when the
    environment ends the episode with 0.25 x the row's number; "boom" fails the episode (reward 0)."""
    config = _env_config(tmp_path, "trainer.val_n=0", "rollout.agent.max_error_rate=0.25")
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    engine = ScriptedEngine(lambda ctx: ([a if b in ctx else b], False))
    data = rows(tok, ["count"] * 4, ["1", "2", "boom", "4"])
    with RewardScorer(config.reward) as scorer:  # the reward function is never asked: every episode has its reward
        metrics = _evaluator(config, tok, data, engine_episodes(engine, config, tok), scorer).run(2)
    assert metrics["val/reward/mean@1"] == pytest.approx((0.25 + 0.5 + 0 + 1.0) / 4)
    assert metrics["val/agent/env_errors"] == 1.0
    assert metrics["val/agent/turns_mean"] == pytest.approx((2 + 2 + 1 + 2) / 4)
    strict = _env_config(tmp_path, "trainer.val_n=0", "rollout.agent.max_error_rate=0.2")
    with RewardScorer(strict.reward) as scorer, pytest.raises(
            EnvironmentFailures, match=r"failed on 1 of 4 episodes of step 2's validation, more than "
                                       r"rollout.agent.max_error_rate=0.2 allows; first on row 2 "):
        _evaluator(strict, tok, data, engine_episodes(ScriptedEngine(engine.policy), strict, tok), scorer).run(2)


class _Group:
    """`ranks` workers, each running its share of validation's episodes here on its own scripted engine."""

    def __init__(self, ranks: int, config, model_path, policy) -> None:
        self.workers = [_generator(config, model_path, ScriptedEngine(policy)) for _ in range(ranks)]
        self.size = ranks

    def call(self, method, *, per_rank, phase):
        return [getattr(worker, method.__name__)(*args) for worker, args in zip(self.workers, per_rank)]


class _Reporter(PhaseReporter):
    rank = 0  # reported with its phases


def _generator(config, model_path, engine) -> Generator:
    """A rank's generation role on a scripted engine."""
    return Generator(_Reporter(), config.rollout.agent, config.data, model_path, engine, device=torch.device("cpu"),
                     dtype="float32", sleep_mode=False)


def test_episodes_spread_over_ranks_keep_validations_seeds(tok, tiny_model_dir):
    """5 rows x 2 samples over 2 ranks: rank 0 runs rows 0-1, rank 1 rows 2-4 from seed + 2 x 2, so each
    row's first turn draws what one engine would; the episodes come back prompt-major."""
    config = _config("trainer.val_n=2")
    policy = _call_then(tok, "5")
    data = rows(tok, ["secret?"] * 5, ["5", "1", "2", "3", "5"])
    group = _Group(2, config, str(tiny_model_dir), policy)
    settings = ValSettings.from_config(config)
    spread = workers_episodes(group)(data, settings.sampling(4, greedy=False))
    alone = engine_episodes(ScriptedEngine(policy), config, tok)(data, settings.sampling(4, greedy=False))
    assert spread == alone and [e.group for e in spread] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    first_turns = [(len(prompts), s.seed) for worker in group.workers for prompts, s in worker.engine.calls[:1]]
    assert first_turns == [(4, val_seed(3, 4)), (6, val_seed(3, 4) + 2 * 2)]
