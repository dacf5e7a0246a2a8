"""The rollout source with multi-turn episodes, its workers played in this process: groups in
order, the environment's reward or the reward function's, agent/* metrics, failures logged
with their row and traceback, and the stop above rollout.agent.max_error_rate."""

from __future__ import annotations

import logging

import pytest
from agent_helpers import ScriptedEngine, rows
from transformers import AutoTokenizer

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.agents.report import EnvironmentFailures
from rlkit.core.agents.worker import build_agent_loop
from rlkit.core.data.dataset import PromptSampler
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.source import SyncScheduler
from rlkit.core.rollout.stages import RolloutStages
from rlkit.core.tiny import TOOL_CALL_TOKEN
from rlkit.recipes.loader import load_config


class _Local:
    """A placement whose `rollout_size` workers run the agent loop here, on one scripted engine."""

    def __init__(self, loop, engine, size: int = 2) -> None:
        self.loop, self.engine, self.rollout_size, self.rollout = loop, engine, size, self

    def submit(self, method, per_rank):
        assert method.__name__ == "agent_episodes" and len(per_rank) == self.rollout_size
        # reward.while_generating's flag is the last argument: these episodes go unscored to the Score stage
        return [self.loop.run(self.engine, part_rows, groups, sampling) for part_rows, groups, sampling, _ in per_rank]

    def collect(self, refs, phase):
        return refs


def _source(tokenizer, overrides, policy, answers):
    config = load_config("grpo-agent-demo", ["reward.num_workers=1", "data.train_batch_size=4", "rollout.n=2",
                                             "actor.mini_batch_size=4", *overrides])
    data = rows(tokenizer, ["secret?"] * 4, answers)
    sampler = PromptSampler(4, 4, seed=0, shuffle=False)
    loop = build_agent_loop(config.rollout.agent, config.data, tokenizer)
    placement = _Local(loop, ScriptedEngine(policy))
    stages = RolloutStages.build(config, Algorithm.from_config(config), data, sampler, tokenizer,
                                 RewardScorer(config.reward), placement)
    return SyncScheduler(stages, placement)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_tool_episodes_are_scored_by_the_reward_function_on_the_policys_tokens(tok):
    call = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN)
    # Call, then answer the digit the tool showed: right for rows whose secret it is.
    source = _source(tok, [], lambda ctx: ([call], False) if call not in ctx else ([ctx[-3]], False), ["1", "2", "3", "4"])
    batch, metrics = source.next_batch(4, {})
    assert batch["group_ids"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch["policy_version"].tolist() == [3] * 8  # the weights after step 3
    assert batch["scores"].tolist() == [1.0] * 8  # lookup_reward: the secret after a call
    # The tool's "1" is not the policy's.
    assert source.stages.score.decode_responses(batch)[0] == TOOL_CALL_TOKEN + "1"
    assert metrics["agent/turns_mean"] == 2.0 and metrics["agent/env_errors"] == 0.0
    assert metrics["agent/env_tokens_mean"] == 5.0 and metrics["agent/truncated"] == 0.0


ENV = """
class Env:
    def reset(self, row):
        self.row = row
    def step(self, action):
        if self.row["ground_truth"] == "boom":
            raise RuntimeError("cannot score " + action)
        return None, 0.25 * int(self.row["ground_truth"]), True
"""


def test_an_environments_reward_replaces_the_reward_function_and_failures_are_logged(tok, tmp_path, caplog):
    (tmp_path / "env.py").write_text(ENV)
    overrides = ["rollout.agent.loop=env", f"rollout.agent.env={tmp_path}/env.py:Env", "rollout.agent.tools=[]"]
    a = tok.convert_tokens_to_ids("a")
    source = _source(tok, overrides + ["rollout.agent.max_error_rate=0.25"], lambda ctx: ([a], False),
                     ["1", "2", "boom", "4"])
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        batch, metrics = source.next_batch(5, {})
    assert batch["scores"].tolist() == [0.25, 0.25, 0.5, 0.5, 0.0, 0.0, 1.0, 1.0]
    assert metrics["agent/env_errors"] == 2.0
    assert "step 5: the environment failed on row 2 (data_source 'synthetic/lookup', extra_info.index 102, " \
           "sample group 2) (scored 0):\nstep failed:\nTraceback" in caplog.text
    assert "RuntimeError: cannot score a" in caplog.text

    strict = _source(tok, overrides + ["rollout.agent.max_error_rate=0.2"], lambda ctx: ([a], False),
                     ["1", "2", "boom", "4"])
    with pytest.raises(EnvironmentFailures, match=r"the environment failed on 2 of 8 episodes of step 1, more than "
                       r"rollout.agent.max_error_rate=0.2 allows; first on row 2 .*: RuntimeError: cannot score a"):
        strict.next_batch(1, {})
