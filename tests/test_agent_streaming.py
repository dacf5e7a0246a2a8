"""Agent episodes streamed to an async engine (rollout.vllm.streaming) against the batched schedule: the same
requests and trajectories whatever the timing, and no per-turn barrier. The engines here are scripted: a sample
is a function of its context and its seed, as a seeded request of a real engine is (up to the last bits of a
batch's floats, which tests/test_rollout_engines.py checks with vLLM's async engine on this CPU)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from agent_helpers import rows
from transformers import AutoTokenizer

from rlkit.core.agents.guard import Guard
from rlkit.core.agents.loop import AgentLoop, Limits, turn_seed
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt, request_seed
from rlkit.core.rollout.event_loop import EventLoop
from rlkit.core.rollout.replicas import ReplicatedEngine

IM_END = 2


def _answer(tokenizer, context: list[int], seed: int) -> tuple[list[int], list[float]]:
    """Two digit tokens from the seed and the context's length, then the end of the turn."""
    digits = [tokenizer.convert_tokens_to_ids(str((seed + len(context) * k) % 10)) for k in (1, 2)]
    return digits + [IM_END], [-seed % 7 / 10, -len(context) % 5 / 10, -0.5]


class BatchEngine(RolloutEngine):
    """Answers each call's requests together; records every call's (episode seeds, context lengths)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, []

    def generate(self, prompts, sampling, token_limits=None) -> list[RolloutSample]:
        limits = limits_per_prompt(prompts, sampling, token_limits)
        seeds = [request_seed(sampling, i, 0) for i in range(len(prompts))]
        self.calls.append(seeds)
        samples = []
        for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
            tokens, log_probs = _answer(self.tokenizer, prompt, seed)
            samples.append(RolloutSample(i, tokens[: limits[i]], log_probs[: limits[i]], limits[i] >= len(tokens)))
        return samples

    def load_weights(self, named_tensors) -> None:
        raise NotImplementedError

    def score(self, sequences, prompt_len):
        raise NotImplementedError


class StreamEngine(BatchEngine):
    """The async engine's surface (rlkit.core.rollout.vllm_async): `run` on its own loop, `sample` per request,
    each request taking a random time, so requests finish in another order than they came."""

    streams = True

    def __init__(self, tokenizer, shuffle_seed: int) -> None:
        super().__init__(tokenizer)
        self.events, self.delays = EventLoop("test-stream-engine"), random.Random(shuffle_seed)
        self.requests: list[tuple[float, int]] = []  # (when, seed)

    def run(self, coroutine):
        return self.events.run(coroutine)

    async def sample(self, prompt, sampling, seed, max_tokens, place=(0, 1)) -> RolloutSample:
        self.requests.append((time.monotonic(), seed))
        await asyncio.sleep(self.delays.uniform(0, 0.02))
        tokens, log_probs = _answer(self.tokenizer, prompt, seed)
        return RolloutSample(0, tokens[:max_tokens], log_probs[:max_tokens], max_tokens >= len(tokens))


class SlowFirstRowEnv:
    """Ends after ground_truth turns (reward 1 each); row 0's environment takes 0.3 s to answer a turn."""

    steps: list[tuple[float, int, int]] = []  # (when it answered, row, turn): shared by a test's episodes

    def reset(self, row):
        self.row, self.turn, self.left = row["index"], 0, int(row["ground_truth"])

    def step(self, action):
        if self.row == 0:
            time.sleep(0.3)
        self.turn += 1
        self.left -= 1
        SlowFirstRowEnv.steps.append((time.monotonic(), self.row, self.turn))
        return "go on", 1.0, self.left == 0


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _episodes(tokenizer, engine, turns_per_row: list[int], n: int = 2):
    SlowFirstRowEnv.steps = []
    limits = Limits(max_turns=4, max_tokens_per_turn=3, max_response_tokens=400, max_prompt_tokens=64)
    loop = AgentLoop(tokenizer, SlowFirstRowEnv, limits, Guard(5.0))
    data = rows(tokenizer, ["go"] * len(turns_per_row), [str(k) for k in turns_per_row])
    return loop.run(engine, data, list(range(len(data))), Sampling(n=n, seed=11))


def _view(trajectories):
    return [(t.response_ids, t.loss_mask, t.log_probs, t.reward, t.finish_reason, t.info["turns"]) for t in trajectories]


def test_streamed_episodes_equal_batched_ones_whatever_order_the_requests_finish_in(tokenizer):
    """Rows of 1, 3 and 2 turns, two episodes each: the batched schedule (one call a turn) and three streamed
    runs whose requests finish in three random orders give the same trajectories, and ask for the same seeds:
    seed 11 + turn * 1,000,003 + the episode's place (0-5)."""
    batched = BatchEngine(tokenizer)
    expected = _view(_episodes(tokenizer, batched, [1, 3, 2]))
    assert [t[5] for t in expected] == [1, 1, 3, 3, 2, 2] and all(t[4] == "stop" for t in expected)
    # Turn 2 holds rows 1 and 2's episodes (places 2-5), turn 3 row 1's (places 2, 3).
    assert batched.calls == [[11 + k for k in range(6)], [1_000_016 + k for k in range(4)], [2_000_019, 2_000_020]]
    for shuffle_seed in (0, 1, 2):
        streamed = StreamEngine(tokenizer, shuffle_seed)
        assert _view(_episodes(tokenizer, streamed, [1, 3, 2])) == expected
        assert sorted(seed for _, seed in streamed.requests) == sorted(sum(batched.calls, []))
    assert turn_seed(Sampling(seed=11), 2, 3) == 2_000_020


def test_streamed_episodes_take_their_next_turn_while_a_slow_environment_still_works(tokenizer):
    """Row 0's environment answers in 0.3 s, row 1's at once; each row runs 3 turns. Streamed, row 1's episodes
    ask for turns 2 and 3 before row 0's first answer; batched, every turn waits for the slowest environment."""

    def first_answer_of_row0() -> float:
        return min(when for when, row, turn in SlowFirstRowEnv.steps if row == 0 and turn == 1)

    streamed = StreamEngine(tokenizer, shuffle_seed=0)
    _episodes(tokenizer, streamed, [3, 3], n=1)
    row1_later_turns = [when for when, seed in streamed.requests if seed in (1_000_015, 2_000_018)]
    assert len(row1_later_turns) == 2 and max(row1_later_turns) < first_answer_of_row0()

    batched = BatchEngine(tokenizer)
    started = time.monotonic()
    _episodes(tokenizer, batched, [3, 3], n=1)
    assert batched.calls == [[11, 12], [1_000_014, 1_000_015], [2_000_017, 2_000_018]]  # both rows in every call
    assert time.monotonic() - started >= 0.9  # three turns, each waiting for row 0's 0.3 s


def test_streaming_replicas_keep_each_episodes_turns_on_one_replica(tokenizer):
    """rollout.vllm.replicas=2 with streaming: the six episodes' places split 0-2 | 3-5, every turn of an episode
    goes to its replica (whose prefix cache holds the conversation), and the trajectories are the batched ones."""
    expected = _view(_episodes(tokenizer, BatchEngine(tokenizer), [1, 3, 2]))
    replicas = [StreamEngine(tokenizer, shuffle_seed=k) for k in (0, 1)]
    assert _view(_episodes(tokenizer, ReplicatedEngine(replicas), [1, 3, 2])) == expected
    episode_of = {seed: (seed - 11) % 1_000_003 for _, seed in replicas[0].requests + replicas[1].requests}
    assert {episode_of[seed] for _, seed in replicas[0].requests} == {0, 1, 2}
    assert {episode_of[seed] for _, seed in replicas[1].requests} == {3, 4, 5}
    assert len(replicas[0].requests) + len(replicas[1].requests) == 12  # 2 + 6 + 4 turns


def test_an_engine_failure_reaches_the_caller_as_itself(tokenizer):
    """The episodes run in a task group; the engine's exception comes out as raised, not wrapped in a group."""

    class Broken(BatchEngine):
        def generate(self, prompts, sampling, token_limits=None):
            raise RuntimeError("the engine died")

    with pytest.raises(RuntimeError, match="the engine died"):
        _episodes(tokenizer, Broken(tokenizer), [2, 2])
