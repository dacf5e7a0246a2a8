"""The multi-turn loop on a scripted engine: token ids exactly as generated, loss masks, log-probs,
per-turn batching across episodes, limits, and environments that fail."""

from __future__ import annotations

import asyncio
import time

import pytest
from agent_helpers import ScriptedEngine, chatml_tokenizer, rows
from transformers import AutoTokenizer

from rlkit.core.agents.chat import TurnBoundary
from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Episode, Limits
from rlkit.core.agents.tool_env import ToolEnv
from rlkit.core.agents.turns import BatchedTurns
from rlkit.core.agents.tools import Tool
from rlkit.core.data.synthetic import lookup
from rlkit.core.rollout.base import Sampling
from rlkit.core.tiny import TOOL_CALL_TOKEN

IM_START, IM_END = 1, 2  # the tiny tokenizer's special tokens


@pytest.fixture(scope="module")


def tiny_tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _tool_loop(tokenizer, *, max_turns=2, per_turn=1, total=8, timeout=5.0):
    limits = Limits(max_turns=max_turns, max_tokens_per_turn=per_turn, max_response_tokens=total, max_prompt_tokens=32)
    tools = [Tool.from_function(lookup)]
    return AgentLoop(tokenizer, lambda: ToolEnv(tools, Guard(timeout), 100), limits, Guard(timeout + 1))


def test_two_turn_tool_episode_keeps_the_engines_tokens_and_masks_the_tools(tiny_tokenizer):
    """Turn 1 calls `lookup` (one token), the tool answers with the row's digit, turn 2 answers."""
    tok = tiny_tokenizer
    call, digits = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN), {str(d): tok.convert_tokens_to_ids(str(d)) for d in range(10)}

    def policy(context):  # call the tool first; then repeat the digit the tool answered
        return ([call], False) if call not in context else ([context[-3]], False)

    engine = ScriptedEngine(policy)
    data = rows(tok, ["secret?", "secret?"], ["7", "3"])
    trajectories = _tool_loop(tok).run(engine, data, [0, 1], Sampling(n=2, max_tokens=1, seed=5, log_probs=True))

    assert [t.group for t in trajectories] == [0, 0, 1, 1]
    first, last = trajectories[0], trajectories[-1]
    # policy | the template closes the cut turn, tool message "7", opens the next turn | policy
    assert first.response_ids == [call, IM_END, IM_START, digits["7"], IM_END, IM_START, digits["7"]]
    assert first.loss_mask == [1, 0, 0, 0, 0, 0, 1]
    assert last.response_ids[-1] == digits["3"]
    # Log-probs: the engine's own on the policy's tokens (sample i of a call: -0.1 - i/1000), 0 elsewhere.
    assert first.log_probs == pytest.approx([-0.1, 0, 0, 0, 0, 0, -0.1])
    assert last.log_probs == pytest.approx([-0.103, 0, 0, 0, 0, 0, -0.103])
    assert [t.finish_reason for t in trajectories] == ["stop"] * 4  # turn 2 makes no call: the final answer
    # Per-turn batching: one engine call per turn holding every running episode, ...
    assert [len(prompts) for prompts, _ in engine.calls] == [4, 4]
    # ... and turn 2's contexts are the prompt + turn 1 + the tool's tokens, exactly.
    assert engine.calls[1][0][0] == data[0].prompt_token_ids + first.response_ids[:6]
    # Each episode's turn has its own seed (seed + turn * 1,000,003 + the episode's place), whoever shares the call.
    assert [call[1].prompt_seeds for call in engine.calls] == [[5, 6, 7, 8], [1_000_008, 1_000_009, 1_000_010, 1_000_011]]
    one_call = {"agent/tool_calls": 1, "agent/tool_errors": 0}  # per episode (rlkit.core.agents.tool_env)
    assert all(t.reward is None and t.info == {"turns": 2, "env_error": None, "env_metrics": one_call}
               for t in trajectories)


def test_an_answer_without_a_call_ends_the_episode(tiny_tokenizer):
    tok = tiny_tokenizer
    call, seven = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN), tok.convert_tokens_to_ids("7")
    engine = ScriptedEngine(lambda ctx: ([seven, IM_END], True) if len(ctx) < 12 else ([call], False))
    trajectories = _tool_loop(tok, per_turn=4).run(engine, rows(tok, ["secret?"], ["7"]), [0], Sampling(n=1, log_probs=False))
    assert trajectories[0].response_ids == [seven, IM_END]
    assert trajectories[0].loss_mask == [1, 1] and trajectories[0].log_probs == []
    assert trajectories[0].finish_reason == "stop" and len(engine.calls) == 1


def test_the_response_is_cut_at_the_token_limit_and_marked_truncated(tiny_tokenizer):
    """8 tokens in all: turn 1 (1) + tool (5) leaves 2; turn 2 asks for 3 and is cut to 2."""
    tok = tiny_tokenizer
    call, four = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN), tok.convert_tokens_to_ids("4")
    engine = ScriptedEngine(lambda ctx: ([call], False) if call not in ctx else ([four, four, four], False))
    loop = _tool_loop(tok, per_turn=3, total=8, max_turns=3)
    [trajectory] = loop.run(engine, rows(tok, ["secret?"], ["4"]), [0], Sampling(n=1))
    assert len(trajectory.response_ids) == 8 and trajectory.response_ids[-2:] == [four, four]
    assert trajectory.finish_reason == "truncated"
    assert engine.calls[1][1].max_tokens == 2  # the remaining budget, not the per-turn limit


def test_each_conversation_asks_the_engine_for_its_own_remaining_budget(tiny_tokenizer):
    """One call holds a conversation with 6 of its 8 tokens used and one with none used (per turn 3): the first
    may ask for 2 more, the second for 3. Asking both for 3 took a full-length prompt to 32 + 6 + 3 = 41 > 40
    tokens, past the engine's context, which vLLM and SGLang refuse (issue 30); prompt + response + ask <= 40."""
    four = tiny_tokenizer.convert_tokens_to_ids("4")
    engine = ScriptedEngine(lambda ctx: ([four] * 3, False))
    loop = _tool_loop(tiny_tokenizer, per_turn=3, total=8)
    prompt = [IM_START] * 32  # data.max_prompt_length's 32 tokens
    used, fresh = Episode(None, 0, None, prompt, response_ids=[four] * 6), Episode(None, 0, None, prompt)
    turns, sampling = BatchedTurns(engine, loop.events, episodes=2), Sampling(n=1, max_tokens=16)

    async def one_turn_each() -> None:
        await asyncio.gather(*(loop.generate(turns, key, e, sampling, turn=1) for key, e in enumerate([used, fresh])))

    loop.events.run(one_turn_each())
    assert engine.token_limits == [[2, 3]] and engine.calls[0][1].max_tokens == 3
    assert [len(e.response_ids) for e in (used, fresh)] == [8, 3]
    assert (used.finish_reason, fresh.finish_reason) == ("truncated", None)


class _FlakyEnv:
    """Row 1 raises, row 2 hangs, row 3 returns garbage; the others answer and finish."""

    def reset(self, row):
        self.index = row["index"]

    def step(self, action):
        if self.index == 1:
            raise ValueError("broken environment")
        if self.index == 2:
            time.sleep(30)
        if self.index == 3:
            return "not a tuple"
        return None, 1.0, True


def test_an_environment_that_raises_hangs_or_returns_garbage_costs_one_episode(tiny_tokenizer):
    tok = tiny_tokenizer
    limits = Limits(max_turns=2, max_tokens_per_turn=2, max_response_tokens=8, max_prompt_tokens=32)
    loop = AgentLoop(tok, _FlakyEnv, limits, Guard(0.5))
    engine = ScriptedEngine(lambda ctx: ([tok.convert_tokens_to_ids("a"), IM_END], True))
    start = time.perf_counter()
    trajectories = loop.run(engine, rows(tok, ["a"] * 5, ["1"] * 5), list(range(5)), Sampling(n=1))
    assert time.perf_counter() - start < 5  # the hung call did not hold the others up
    assert [t.finish_reason for t in trajectories] == ["stop", "error", "error", "error", "stop"]
    assert [t.reward for t in trajectories] == [1.0, 0.0, 0.0, 0.0, 1.0]
    errors = [t.info["env_error"] or "" for t in trajectories]
    assert "ValueError: broken environment" in errors[1] and "Traceback" in errors[1]
    assert "TimeoutError: did not return within 0.5 s" in errors[2]
    assert "expected a tuple (observation, reward, done)" in errors[3]


def test_reset_may_write_the_prompt_and_rewards_add_up(tiny_tokenizer):
    tok = tiny_tokenizer

    class CountingEnv:
        async def reset(self, row):
            return "echo 5"

        async def step(self, action):
            return "again", 0.5, action == "55"

    five, again = tok.convert_tokens_to_ids("5"), tok.encode("again")
    engine = ScriptedEngine(lambda ctx: ([five, five], False) if ctx[-7:-2] == again else ([five], False))
    limits = Limits(max_turns=3, max_tokens_per_turn=2, max_response_tokens=24, max_prompt_tokens=32)
    [t] = AgentLoop(tok, CountingEnv, limits, Guard(2.0)).run(engine, rows(tok, ["x"], ["5"]), [0], Sampling(n=1))
    assert t.prompt_ids == tok.apply_chat_template([{"role": "user", "content": "echo 5"}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)
    assert t.reward == 1.0 and t.finish_reason == "stop"  # 0.5 after "5" and after "55" (done)
    assert tok.decode(t.response_ids) == "5<|im_end|><|im_start|>again<|im_end|><|im_start|>55"


def test_turn_boundaries_reproduce_the_templates_own_rendering(tmp_path):
    """Appending only the new messages' tokens after the policy's turns gives exactly the ids
    the chat template gives for the whole conversation (Qwen2.5-style ChatML, Hermes tool calls)."""
    from rlkit.core.agents.builtin_tools import calculator

    tok = chatml_tokenizer(tmp_path)
    tools = [Tool.from_function(calculator).schema]
    boundary = TurnBoundary(tok, tools)
    user = [{"role": "user", "content": "What is 12*7? Use the tool."}]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
    turn1 = tok.encode(call, add_special_tokens=False) + [tok.eos_token_id]
    answers = [{"role": "tool", "content": "84"}, {"role": "tool", "content": "error: no"}]
    turn2 = tok.encode("It is 84.", add_special_tokens=False) + [tok.eos_token_id]
    ids = boundary.render_prompt(user) + turn1 + boundary.after_turn(turn1, answers) + turn2
    whole = tok.apply_chat_template(user + [{"role": "assistant", "content": call}] + answers
                                    + [{"role": "assistant", "content": "It is 84."}], tools=tools, tokenize=True,
                                    return_dict=False)
    assert ids == whole[:len(ids)] and tok.decode(whole[len(ids):]) == "\n"
    # A turn cut before its end token is closed by the environment's tokens instead.
    assert boundary.after_turn(turn1[:-1], answers) == [tok.eos_token_id] + boundary.after_turn(turn1, answers)


def test_turn_boundaries_render_each_distinct_answer_once(tmp_path, monkeypatch):
    """The agent loop's host time: an environment answer seen before takes its remembered ids (the template is
    rendered once per distinct answer), a caller changing the ids it got changes nothing remembered, content that
    is not JSON is rendered every time, and the memory starts over when full."""
    from rlkit.core.agents import chat

    tok = chatml_tokenizer(tmp_path)
    boundary = TurnBoundary(tok)
    rendered = []
    render = boundary.render_delta
    monkeypatch.setattr(boundary, "render_delta", lambda messages: rendered.append(messages) or render(messages))
    again = [{"role": "user", "content": "again"}]
    first = boundary.after_turn([5], again)
    assert first == render(again) and len(rendered) == 1
    first.append(99)
    assert boundary.after_turn([5], again) == render(again) and len(rendered) == 1  # remembered, unchanged
    other = [{"role": "user", "content": "other"}]
    assert boundary.after_turn([5], other) == render(other) and len(rendered) == 2

    odd = [{"role": "user", "content": "odd", "sent_at": object()}]  # a field the template skips, JSON cannot key
    assert boundary.after_turn([5], odd) == boundary.after_turn([5], odd) == render([{"role": "user", "content": "odd"}])
    assert len(rendered) == 4
    monkeypatch.setattr(chat, "MAX_REMEMBERED", 2)
    boundary.after_turn([5], [{"role": "user", "content": "third"}])
    assert len(boundary.remembered) == 1  # full at 2: started over with the third


def test_messages_the_template_cannot_write_cost_the_episode(tmp_path):
    tok = chatml_tokenizer(tmp_path)

    class OddRole:
        def reset(self, row):
            return None

        def step(self, action):
            return {"role": "user", "content": 7}, None, False  # content must be text

    class Refusing(OddRole):
        def step(self, action):
            return {"role": "system", "content": "x"}, None, False

    tok.chat_template = tok.chat_template.replace("{%- else %}", "{%- elif message.role == 'system' and not loop.first %}"
                                                  "{{ raise_exception('system only first') }}{%- else %}")
    limits = Limits(max_turns=2, max_tokens_per_turn=2, max_response_tokens=64, max_prompt_tokens=64)
    engine = ScriptedEngine(lambda ctx: (tok.encode("hi", add_special_tokens=False), False))
    for env, error in ((OddRole, "step returned an observation of {'role': 'user', 'content': 7}"),
                       (Refusing, "TemplateError: system only first")):
        [t] = AgentLoop(tok, env, limits, Guard(2.0)).run(engine, rows(tok, ["x"], ["1"]), [0], Sampling(n=1))
        assert t.finish_reason == "error" and error in t.info["env_error"], t.info


def test_an_environment_may_score_a_cut_episode_and_report_metrics(tiny_tokenizer):
    """truncate(action) gets the turn step() never saw (cut at the response limit) and its number is the reward;
    episode_metrics travels with the trajectory."""
    tok = tiny_tokenizer

    class Scoring:
        episode_metrics: dict = {}

        def reset(self, row):
            return None

        def step(self, action):
            return "again", 0.25, False

        def truncate(self, action):
            self.episode_metrics = {"cut/length": float(len(action or ""))}
            return 0.5 if action == "55" else None

    five = tok.convert_tokens_to_ids("5")
    engine = ScriptedEngine(lambda ctx: ([five, five, five], False))
    cut_by_length = Limits(max_turns=3, max_tokens_per_turn=3, max_response_tokens=2, max_prompt_tokens=32)
    [t] = AgentLoop(tok, Scoring, cut_by_length, Guard(2.0)).run(engine, rows(tok, ["x"], ["5"]), [0], Sampling(n=1))
    assert t.finish_reason == "truncated" and t.reward == 0.5 and t.info["env_metrics"] == {"cut/length": 2.0}
    cut_by_turns = Limits(max_turns=1, max_tokens_per_turn=1, max_response_tokens=16, max_prompt_tokens=32)
    [t] = AgentLoop(tok, Scoring, cut_by_turns, Guard(2.0)).run(engine, rows(tok, ["x"], ["5"]), [0], Sampling(n=1))
    assert t.finish_reason == "truncated" and t.reward == 0.25  # step's 0.25; truncate(None) added nothing
    assert t.info["env_metrics"] == {"cut/length": 0.0}


def test_environments_are_closed_after_the_episodes_and_a_failing_close_is_only_logged(tiny_tokenizer, caplog):
    tok, closed = tiny_tokenizer, []

    class Closing:
        def reset(self, row):
            self.index = row["index"]

        def step(self, action):
            return None, 1.0, True

        def close(self):
            closed.append(self.index)
            if self.index == 1:
                raise OSError("session already gone")

    limits = Limits(max_turns=1, max_tokens_per_turn=1, max_response_tokens=4, max_prompt_tokens=32)
    engine = ScriptedEngine(lambda ctx: ([tok.convert_tokens_to_ids("a")], True))
    trajectories = AgentLoop(tok, Closing, limits, Guard(2.0)).run(engine, rows(tok, ["a"] * 2, ["1"] * 2), [0, 1],
                                                                  Sampling(n=1))
    assert sorted(closed) == [0, 1] and [t.reward for t in trajectories] == [1.0, 1.0]
    assert "closing the environment of row 1 failed" in caplog.text and "OSError: session already gone" in caplog.text
