"""Agents in your own code: `async def rollout(client, row)` with the official openai client against
the worker's loopback endpoint, on a scripted engine: requests batched across episodes, the
conversation recorded token for token, failures costing one episode."""

from __future__ import annotations

import asyncio

import pytest
from agent_helpers import ScriptedEngine, rows
from transformers import AutoTokenizer

from rlkit.core.agents.client_loop import ClientAgentLoop, agent_function
from rlkit.core.agents.loop import Limits
from rlkit.core.rollout.base import Sampling
from rlkit.core.tiny import TOOL_CALL_TOKEN
from rlkit.errors import UserError

IM_START, IM_END = 1, 2


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def lookup_agent(client, row):
    """Ask the row's own prompt; if the model calls the tool, answer the call with the row's secret and ask again."""
    messages = list(row["prompt"])
    reply = await client.chat.completions.create(model="anything", messages=messages)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if message.tool_calls:
        assert message.tool_calls[0].function.name == "lookup" and message.content is None
        messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": row["ground_truth"]})
        reply = await client.chat.completions.create(model="anything", messages=messages)
    return 1.0 if reply.choices[0].message.content == row["ground_truth"] else 0.0


def _loop(tok, agent, total=8):
    return ClientAgentLoop(tok, agent, Limits(max_turns=2, max_tokens_per_turn=1, max_response_tokens=total,
                                              max_prompt_tokens=32), call_timeout_s=5.0)


def test_an_openai_client_agent_trains_on_the_tokens_it_was_served(tok):
    call, digit = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN), {d: tok.convert_tokens_to_ids(d) for d in "123"}
    engine = ScriptedEngine(lambda ctx: ([call], False) if call not in ctx else ([ctx[-3]], False))
    data = rows(tok, ["secret?"] * 3, ["1", "2", "3"])
    trajectories = _loop(tok, lookup_agent).run(engine, data, [0, 1, 2], Sampling(n=2, log_probs=True))
    # Both turns of all 6 episodes were generated in 2 engine calls of 6.
    assert [len(prompts) for prompts, _ in engine.calls] == [6, 6]
    assert [t.group for t in trajectories] == [0, 0, 1, 1, 2, 2]
    first = trajectories[2]
    assert first.prompt_ids == data[1].prompt_token_ids
    assert first.response_ids == [call, IM_END, IM_START, digit["2"], IM_END, IM_START, digit["2"]]
    assert first.loss_mask == [1, 0, 0, 0, 0, 0, 1]
    assert [lp != 0 for lp in first.log_probs] == [bool(m) for m in first.loss_mask]
    assert all(t.reward == 1.0 and t.finish_reason == "stop" and t.info["turns"] == 2 for t in trajectories)
    # Turn 2's context is exactly turn 1's served tokens plus the tool message's (requests queue in arrival order).
    assert data[1].prompt_token_ids + first.response_ids[:6] in engine.calls[1][0]


def test_many_episodes_connect_at_once(tok):
    """A worker's whole share (here 128 episodes) opens its connections together."""
    call = tok.convert_tokens_to_ids(TOOL_CALL_TOKEN)
    engine = ScriptedEngine(lambda ctx: ([call], False) if call not in ctx else ([ctx[-3]], False))
    data = rows(tok, ["secret?"] * 64, [str(i % 10) for i in range(64)])
    trajectories = _loop(tok, lookup_agent).run(engine, data, list(range(64)), Sampling(n=2))
    assert [t.reward for t in trajectories] == [1.0] * 128
    sizes = [len(prompts) for prompts, _ in engine.calls]
    # Two turns of 128 episodes: batched (on a quiet machine exactly [128, 128]; a loaded one may
    # start generating before the last connections arrive, 0.2 s after the first), never one by one.
    assert sum(sizes) == 256 and len(sizes) <= 6, sizes


def test_a_conversation_that_does_not_continue_starts_over(tok):
    a = tok.convert_tokens_to_ids("a")

    async def forgetful(client, row):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}])
        return 0.5

    [t] = _loop(tok, forgetful).run(ScriptedEngine(lambda ctx: ([a], False)), rows(tok, ["x"], ["1"]), [0],
                                    Sampling(n=1))
    assert t.prompt_ids == tok.apply_chat_template([{"role": "user", "content": "two"}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)
    assert t.response_ids == [a] and t.reward == 0.5 and t.info["restarts"] == 1


def test_requests_past_max_turns_get_an_empty_cut_reply(tok):
    a = tok.convert_tokens_to_ids("a")
    replies = []

    async def talkative(client, row):
        messages = [{"role": "user", "content": "go"}]
        for _ in range(3):
            reply = await client.chat.completions.create(model="m", messages=messages)
            replies.append((reply.choices[0].message.content, reply.choices[0].finish_reason))
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        return 1.0

    [t] = _loop(tok, talkative, total=32).run(ScriptedEngine(lambda ctx: ([a], False)), rows(tok, ["x"], ["1"]), [0],
                                              Sampling(n=1))
    assert replies == [("a", "length"), ("a", "length"), ("", "length")]  # max_turns=2
    assert t.finish_reason == "truncated" and t.info["turns"] == 2 and t.loss_mask.count(1) == 2


async def _raises(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    raise KeyError("oops")


async def _returns_text(client, row):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    return "1.0"


async def _never_asks(client, row):
    return 1.0


async def _hangs(client, row):
    await asyncio.sleep(60)


@pytest.mark.parametrize("agent, error", [(_raises, "KeyError: 'oops'"), (_returns_text, "returned '1.0' (str)"),
                                          (_never_asks, "made no chat completion request"),
                                          (_hangs, "TimeoutError: did not return within 1 s")])
def test_an_agent_function_that_fails_costs_its_episode(tok, agent, error):
    a = tok.convert_tokens_to_ids("a")
    loop = ClientAgentLoop(tok, agent, Limits(2, 1, 8, 32), call_timeout_s=0.5)
    [t] = loop.run(ScriptedEngine(lambda ctx: ([a], False)), rows(tok, ["x"], ["1"]), [0], Sampling(n=1))
    assert t.finish_reason == "error" and t.reward == 0.0 and error in t.info["env_error"]


def test_agent_functions_are_checked(tmp_path):
    (tmp_path / "agents.py").write_text("def sync(client, row):\n    return 1.0\n\nasync def one(client):\n    return 1\n")
    with pytest.raises(UserError, match="must be `async def rollout"):
        agent_function(f"{tmp_path}/agents.py:sync")
    with pytest.raises(UserError, match=r"one\(client\) cannot be called as fn\(client, row\)"):
        agent_function(f"{tmp_path}/agents.py:one")
