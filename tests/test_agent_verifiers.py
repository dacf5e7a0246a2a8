"""rollout.agent.loop=verifiers:ENV: a verifiers 0.4 environment (tests/vf_arith.py, tests/vf_guess.py) played
by rlkit's engine through the agent loop; the task's rubric is the reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import ScriptedEngine
from transformers import AutoTokenizer

from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Limits
from rlkit.core.agents.verifiers_env import VerifiersEpisode, build_verifiers, load_verifiers_env
from rlkit.core.data.dataset import PromptRow
from rlkit.core.rollout.base import Sampling
from rlkit.errors import UserError

pytest.importorskip("verifiers.v1")
GUESS = f"verifiers:{Path(__file__).parent / 'vf_guess.py'}:guess_env"
IM_END = 2  # the tiny tokenizer's end of turn


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _rows(tok, env: str) -> list[PromptRow]:
    built = build_verifiers(env=env)["train"]
    return [PromptRow(index=i, prompt_token_ids=tok.apply_chat_template(r["prompt"], add_generation_prompt=True,
                                                                         tokenize=True, return_dict=False),
                      data_source=r["data_source"], ground_truth=r["reward_model"]["ground_truth"],
                      extra_info=r["extra_info"], prompt=r["prompt"])
            for i, r in enumerate(built)]


def _run(tok, spec: str, replies: dict[str, list[str]], *, max_turns=3, total=64, timeout=5.0):
    """Each prompt's policy replies, turn by turn (keyed by the task's prompt; 3+1= answers 4), through the agent
    loop."""
    replies = {"3+1=": ["4"], **replies}
    env = load_verifiers_env(spec)
    limits = Limits(max_turns=max_turns, max_tokens_per_turn=4, max_response_tokens=total, max_prompt_tokens=32)
    loop = AgentLoop(tok, lambda: VerifiersEpisode(env), limits, Guard(timeout))

    def policy(context: list[int]) -> tuple[list[int], bool]:
        text = tok.decode(context)
        prompt = next(p for p in replies if p in text)
        turn = (text.count("<|im_end|>") - 1) // 2  # the prompt ends one message; each earlier turn two more
        return tok.encode(replies[prompt][turn]) + [IM_END], True

    rows = _rows(tok, spec.removeprefix("verifiers:"))
    return loop.run(ScriptedEngine(policy), rows, list(range(len(rows))), Sampling(n=1))


def test_prep_data_writes_the_tasksets_tasks_as_rows():
    split = build_verifiers(env="vf_arith", test_size=1)
    assert [r["prompt"] for r in split["train"]] == [[{"role": "user", "content": f"{a}+1="}] for a in range(3)]
    [test] = split["test"]
    assert test["data_source"] == "verifiers/vf_arith" and test["extra_info"]["split"] == "test"
    assert json.loads(test["reward_model"]["ground_truth"])["answer"] == "4"


def test_the_rubric_scores_a_single_turn_episode_and_each_reward_is_reported(tok):
    # 0+1= -> "1" right and brief: 2.0 * 1 + 0.5 * 1; 1+1= -> "22" wrong, long: 0; 2+1= -> "4" wrong, brief: 0.5
    trajectories = _run(tok, "verifiers:vf_arith", {"0+1=": ["1"], "1+1=": ["22"], "2+1=": ["4"]})
    assert [t.reward for t in trajectories] == [2.5, 0.0, 0.5, 2.5]
    assert [t.finish_reason for t in trajectories] == ["stop"] * 4
    first = trajectories[0]
    assert first.response_ids == tok.encode("1") + [IM_END] and first.loss_mask == [1, 1]
    assert first.info["env_metrics"] == {"verifiers/reward/correct": 1.0, "verifiers/reward/brief": 1.0,
                                         "verifiers/metric/replies": 1.0}
    assert first.prompt_ids == tok.apply_chat_template([{"role": "user", "content": "0+1="}],
                                                       add_generation_prompt=True, tokenize=True, return_dict=False)


def test_a_multi_turn_env_answers_each_turn_with_masked_tokens(tok):
    # 1+1= (answer 2): "1" -> "higher" -> "2": right on the second turn; finalize records 2 guesses.
    [_, second, third, _] = _run(tok, GUESS, {"0+1=": ["1"], "1+1=": ["1", "2"], "2+1=": ["5", "4", "3"]})
    assert tok.decode(second.response_ids) == "1<|im_end|><|im_start|>higher<|im_end|><|im_start|>2<|im_end|>"
    policy = len(tok.encode("1")) + 1
    env_tokens = len(second.response_ids) - 2 * policy
    assert second.loss_mask == [1] * policy + [0] * env_tokens + [1] * policy
    assert second.log_probs[policy:policy + env_tokens] == [0.0] * env_tokens
    assert second.reward == 2.5 and second.info["turns"] == 2
    assert second.info["env_metrics"]["verifiers/metric/guesses"] == 2.0
    assert third.reward == 2.5 and third.info["turns"] == 3  # 5 -> lower, 4 -> lower, 3


def test_an_episode_cut_at_max_turns_is_still_scored_by_the_rubric(tok):
    # One turn: "5" for 1+1= is wrong but brief (0.5); the env wanted another turn, got a terminated segment.
    [_, cut, *_] = _run(tok, GUESS, {"0+1=": ["1"], "1+1=": ["5"], "2+1=": ["3"]}, max_turns=1)
    assert cut.finish_reason == "truncated" and cut.reward == 0.5 and cut.info["env_error"] is None
    assert cut.loss_mask == [1, 1]  # the env's answer to a turn that had no successor is not appended


def test_a_turn_cut_at_the_token_limit_reaches_the_rubric(tok):
    # A one-token response: "22" for 1+1= is cut to "2" (step never sees it), which the rubric scores right and
    # brief (2.5).
    [_, cut, *_] = _run(tok, "verifiers:vf_arith", {"0+1=": ["1"], "1+1=": ["22"], "2+1=": ["3"]}, total=1)
    assert cut.finish_reason == "truncated" and cut.response_ids == tok.encode("2") and cut.reward == 2.5


FAILING = '''
import asyncio
import verifiers.v1 as vf
from vf_guess import GuessConfig


class FailingEnv(vf.Env[GuessConfig]):
    async def run(self, task, agents):
        if task.data.answer == "2":
            raise RuntimeError("the environment broke")
        if task.data.answer == "3":
            await asyncio.sleep(30)
        await agents.agent.run(task)
        if task.data.answer == "4":
            await agents.agent.run(task)  # best-of-n style: a second conversation in one episode


def failing_env():
    return FailingEnv(GuessConfig(taskset={"id": "vf_arith"}))
'''


def test_an_env_that_raises_or_hangs_costs_one_episode(tok, tmp_path):
    (tmp_path / "failing.py").write_text(FAILING)
    trajectories = _run(tok, f"verifiers:{tmp_path}/failing.py:failing_env",
                        {"0+1=": ["1"], "1+1=": ["2"], "2+1=": ["3"], "3+1=": ["4"]}, timeout=0.5)
    assert [t.finish_reason for t in trajectories] == ["stop", "error", "error", "error"]
    assert [t.reward for t in trajectories] == [2.5, 0.0, 0.0, 0.0]
    assert "RuntimeError: the environment broke" in trajectories[1].info["env_error"]
    assert "TimeoutError: did not return within 0.5 s" in trajectories[2].info["env_error"]
    assert "opened a second exchange with the policy" in trajectories[3].info["env_error"]


def test_a_rubric_that_raises_costs_one_episode(tok):
    [t, *_] = _run(tok, "verifiers:vf_arith", {"0+1=": ["???"], "1+1=": ["2"], "2+1=": ["3"]})
    assert t.finish_reason == "error" and t.reward == 0.0 and "the rubric broke" in t.info["env_error"]


def test_a_bad_environment_is_named_before_the_run(tmp_path):
    with pytest.raises(UserError, match="rollout.agent.loop=verifiers:no_such_env: loading the environment failed"):
        load_verifiers_env("verifiers:no_such_env")
    (tmp_path / "two.py").write_text("def make():\n    return 3\n")
    with pytest.raises(UserError, match="got int, not a verifiers.v1 Env"):
        load_verifiers_env(f"verifiers:{tmp_path}/two.py:make")
