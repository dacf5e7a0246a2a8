"""reward.while_generating: a streaming engine's samples scored as each finishes, in the rollout worker's reward
pool (rlkit.core.rollout.scored_generation), with the same scores and samples as scoring after the rollout.

The reward here writes a stamp file when it scores; the stand-in engine holds its last request until a stamp
exists, so a rollout that scored only after generating would never end (the test would time out instead)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlkit.core.data.dataset import PromptRow
from rlkit.core.rewards.scoring import RewardError, RewardScorer
from rlkit.core.rewards.worker_pool import Feed
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, request_seed
from rlkit.core.rollout.event_loop import EventLoop
from rlkit.core.rollout.generator import Generator
from rlkit.core.rollout.scored_generation import generate_scored, stream_samples
from rlkit.core.rollout.stages import Generate, Generation, Score, scores_while_generating
from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.loader import load_config
from rlkit.recipes.reward_schema import RewardConfig

# The response's digits as a number; the row's ground truth names a folder where each call leaves a stamp.
REWARD = '''
import os, time

def digits(data_source, response, ground_truth, extra_info):
    with open(os.path.join(ground_truth, f"{time.monotonic_ns()}-{response or 'empty'}"), "w"):
        pass
    if response == "99":
        raise ValueError("no 99s")
    return {"score": float(response or 0), "length": len(response)}
'''


def _digit(tokenizer, d: int) -> int:
    return tokenizer.convert_tokens_to_ids(str(d))


@pytest.fixture
def reward(tmp_path) -> tuple[RewardConfig, Path]:
    (tmp_path / "reward.py").write_text(REWARD)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    return RewardConfig(function=f"{tmp_path / 'reward.py'}:digits", num_workers=2, on_error="zero"), stamps


def _wait_for_a_stamp(stamps: Path, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while not any(stamps.iterdir()):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_the_pool_scores_rows_as_they_arrive(reward):
    """Rows fed from another thread run as they come: row 0 is scored before row 1 exists, and the run ends
    only when the feed is closed."""
    config, stamps = reward
    scorer = RewardScorer(config)
    feed = Feed()
    row_zero_scored_first = []

    def feeder():
        feed.put(0, scorer.call(0, "d", "12", str(stamps), {}))
        row_zero_scored_first.append(_wait_for_a_stamp(stamps))
        feed.put(2, scorer.call(2, "d", "7", str(stamps), {}))
        feed.put(1, scorer.call(1, "d", "", str(stamps), {}))
        feed.close()

    thread = threading.Thread(target=feeder)
    thread.start()
    try:
        outcomes = scorer.outcomes(feed, 3)
    finally:
        thread.join()
        scorer.close()
    assert row_zero_scored_first == [True]
    assert [o.score for o in outcomes] == [12.0, 0.0, 7.0]
    assert [o.details for o in outcomes] == [{"length": 2.0}, {"length": 0.0}, {"length": 1.0}]


class HoldingStreamEngine(RolloutEngine):
    """The async engine's surface (`sample`, `run`): sample j of prompt i answers the digits of its seed's last
    two places, then EOS; the last request finishes only once a reward call has left a stamp."""

    streams = True

    def __init__(self, tokenizer, stamps: Path, last_seed: int) -> None:
        self.tokenizer, self.stamps, self.last_seed = tokenizer, stamps, last_seed
        self.events = EventLoop("test-holding-engine")
        self.held: list[bool] = []  # the last request: whether a stamp came while it waited

    def run(self, coroutine):
        return self.events.run(coroutine)

    async def sample(self, prompt, sampling, seed, max_tokens, place=(0, 1)) -> RolloutSample:
        if seed == self.last_seed:
            self.held.append(await asyncio.to_thread(_wait_for_a_stamp, self.stamps))
        tens, ones = divmod(seed % 100, 10)
        tokens = [_digit(self.tokenizer, tens), _digit(self.tokenizer, ones), 2][:max_tokens]
        return RolloutSample(0, tokens, [-0.5] * len(tokens), len(tokens) == 3)

    def generate(self, prompts, sampling, token_limits=None):
        return stream_samples(self, prompts, sampling, token_limits)

    load_weights = score = None


def _rows(stamps: Path) -> list[PromptRow]:
    return [PromptRow(index=10 + i, prompt_token_ids=[1, 4 + i], data_source="d", ground_truth=str(stamps))
            for i in range(2)]


def test_samples_are_scored_while_the_last_one_still_generates(tiny_model_dir, reward):
    config, stamps = reward
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampling = Sampling(n=2, max_tokens=8, seed=40)
    engine = HoldingStreamEngine(tokenizer, stamps, last_seed=request_seed(sampling, 1, 1))  # seed 43
    with RewardScorer(config) as scorer:
        samples, outcomes = generate_scored(engine, _rows(stamps), sampling, scorer, tokenizer)
    assert engine.held == [True]  # the last sample waited for, and saw, an earlier one's score
    # Seeds 40..43: "40", "41" for prompt 0, "42", "43" for prompt 1, each ending with EOS.
    assert [s.prompt_index for s in samples] == [0, 0, 1, 1]
    assert [s.token_ids for s in samples] == [[7, 3, 2], [7, 4, 2], [7, 5, 2], [7, 6, 2]]
    assert [o.score for o in outcomes] == [40.0, 41.0, 42.0, 43.0]
    assert samples == engine.generate([[1, 4], [1, 5]], sampling)  # the samples of the engine's own call


def test_a_failed_row_costs_its_sample_and_is_reported_by_the_controller(tiny_model_dir, reward):
    """on_error=zero: a reward that raises on one streamed sample scores it 0 and names its row, as after."""
    config, stamps = reward
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampling = Sampling(n=2, max_tokens=8, seed=98)  # seeds 98, 99 (the reward refuses "99"), 100, 101
    engine = HoldingStreamEngine(tokenizer, stamps, last_seed=-1)
    with RewardScorer(config) as scorer:
        samples, outcomes = generate_scored(engine, _rows(stamps), sampling, scorer, tokenizer)
        scored = scorer.collect(outcomes, ["d"] * 4, [{"index": 10}, {"index": 10}, {}, {}])
    assert scored.scores == [98.0, 0.0, 0.0, 1.0]  # seed 100 answers "00", scored 0; 101 "01"
    assert scored.failed == [False, True, False, False]
    assert scored.metrics["reward/errors"] == 1.0
    assert "row 1 (data_source 'd', dataset index 10" in scored.errors[0] and "no 99s" in scored.errors[0]


def test_the_controller_uses_the_outcomes_and_scores_as_after(tiny_model_dir, reward):
    """Generate turns (samples, outcomes) per rank into trajectories carrying them; Score takes them without
    running a reward (its scorer is closed here) and gives what scoring the batch after gives."""
    config, stamps = reward
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows, sampling = _rows(stamps), Sampling(n=2, max_tokens=8, seed=40)
    engine = HoldingStreamEngine(tokenizer, stamps, last_seed=-1)
    scorer = RewardScorer(config)
    samples, outcomes = generate_scored(engine, rows, sampling, scorer, tokenizer)
    stage = Generate.__new__(Generate)  # only `trajectories` is used: it reads the Generation alone
    generation = Generation(rows, [[0, 1]], [None], policy_version=3, episodes=False, scored=True)
    trajectories = stage.trajectories(generation, [(samples, outcomes)])
    assert [t.reward_outcome.score for t in trajectories] == [40.0, 41.0, 42.0, 43.0]

    def score(with_scorer, given):
        stage = Score(RewardConfig(), AgentConfig(), tokenizer, with_scorer, None, reward_model=False,
                      max_response_length=8)
        batch = stage.batch(trajectories)
        return stage(batch, given)

    after = score(scorer, None)  # the controller's own pool, on the decoded policy tokens
    scorer.close()
    during = score(scorer, [t.reward_outcome for t in trajectories])
    assert torch.equal(during[0]["scores"], torch.tensor([40.0, 41.0, 42.0, 43.0]))
    assert torch.equal(during[0]["scores"], after[0]["scores"])
    assert during[1]["reward/length"] == after[1]["reward/length"] == 2.0
    with pytest.raises(RuntimeError, match="closed"):  # a row without an outcome is scored here: no pool now
        score(scorer, [t.reward_outcome for t in trajectories[:3]] + [None])


def test_on_error_raise_stops_at_the_streamed_failure(tiny_model_dir, reward):
    """reward.on_error=raise: the worker's pool stops at the failed row (rows not scored by then get no outcome)
    and the controller raises on it, naming the row, without scoring the batch again."""
    config, stamps = reward
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows, sampling = _rows(stamps), Sampling(n=2, max_tokens=8, seed=98)  # seeds 98..101: the reward refuses 99
    engine = HoldingStreamEngine(tokenizer, stamps, last_seed=-1)
    raising = config.model_copy(update={"on_error": "raise"})
    with RewardScorer(raising) as scorer:
        samples, outcomes = generate_scored(engine, rows, sampling, scorer, tokenizer)
    assert "no 99s" in outcomes[1].error
    generation = Generation(rows, [[0, 1]], [None], policy_version=0, episodes=False, scored=True)
    trajectories = Generate.__new__(Generate).trajectories(generation, [(samples, outcomes)])
    score = Score(raising, AgentConfig(), tokenizer, scorer, None, reward_model=False, max_response_length=8)
    with pytest.raises(RewardError, match=r"row 1 \(data_source 'd'.*no 99s"):  # the closed scorer runs nothing
        score(score.batch(trajectories), [t.reward_outcome for t in trajectories])
    # on_error=zero with a row left unscored (an episode its environment scored): the controller scores the batch
    zero = Score(config, AgentConfig(), tokenizer, scorer, None, reward_model=False, max_response_length=8)
    with pytest.raises(RuntimeError, match="closed"):
        zero(zero.batch(trajectories), [t.reward_outcome for t in trajectories[:3]] + [None])


def test_which_runs_score_while_generating():
    base = ["rollout.name=vllm", "rollout.vllm.streaming=true"]
    assert scores_while_generating(load_config("grpo-demo", base))
    assert not scores_while_generating(load_config("grpo-demo", [*base, "reward.while_generating=false"]))
    assert not scores_while_generating(load_config("grpo-demo", ["rollout.name=vllm"]))  # batch calls
    assert not scores_while_generating(load_config("grpo-demo", [*base, "reward_model.path=some/model"]))
    assert scores_while_generating(load_config("grpo-demo", ["rollout.name=sglang", "rollout.sglang.streaming=true"]))
    # Agent episodes end at different turns on any engine; a client agent's rewards are its own (the role skips it)
    assert scores_while_generating(load_config("grpo-agent-demo", []))
    assert not scores_while_generating(load_config("grpo-agent-demo", ["reward.while_generating=false"]))


def test_the_generation_role_scores_with_the_run_reward(tiny_model_dir, reward):
    """Generator.generate_scored: the role's own scorer (reward.*, started on first use) and the policy's
    tokenizer; samples recorded for the sync check as `generate`'s are."""
    config, stamps = reward

    class Phases:
        def reporting(self, name):
            import contextlib

            return contextlib.nullcontext()

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = HoldingStreamEngine(tokenizer, stamps, last_seed=-1)
    data = load_config("grpo-demo", []).data
    role = Generator(Phases(), AgentConfig(), data, str(tiny_model_dir), engine, device=torch.device("cpu"),
                     dtype="float32", sleep_mode=False, reward=config)
    samples, outcomes = role.generate_scored(_rows(stamps), Sampling(n=1, max_tokens=8, seed=5))
    assert [o.score for o in outcomes] == [5.0, 6.0]
    assert role.sync_probe.sequence == [4] + samples[0].token_ids  # the first prompt less its first token
    role.scoring()[0].close()


@pytest.mark.slow
def test_an_in_process_run_scores_in_its_rollout_worker(tmp_path, monkeypatch):
    """The whole path of a run (the controller's Generate and Score stages, the policy worker's generation role)
    with a streaming stand-in for vLLM's async engine (the HF engine behind `sample`): every training batch is
    scored in the worker as its samples finish, and the controller runs no reward itself."""
    import dataclasses

    from rlkit.core.controller.loop import train_run
    from rlkit.core.rewards import scoring
    from rlkit.core.rollout import stages
    from rlkit.core.rollout import generator

    real_make_engine = generator.make_engine

    class Streaming(RolloutEngine):
        streams = True

        def __init__(self, inner: RolloutEngine) -> None:
            self.inner, self.events, self.lock = inner, EventLoop("test-streaming-hf"), None

        def run(self, coroutine):
            return self.events.run(coroutine)

        async def sample(self, prompt, sampling, seed, max_tokens, place=(0, 1)) -> RolloutSample:
            self.lock = self.lock or asyncio.Lock()
            one = dataclasses.replace(sampling, n=1, seed=seed, prompt_seeds=None)
            async with self.lock:  # the HF engine seeds the process's RNG per call: one call at a time
                (sample,) = await asyncio.to_thread(self.inner.generate, [prompt], one, [max_tokens])
            return sample

        def generate(self, prompts, sampling, token_limits=None):
            return self.inner.generate(prompts, sampling, token_limits)

        def load_weights(self, named_tensors):
            self.inner.load_weights(named_tensors)

        def score(self, sequences, prompt_len):
            return self.inner.score(sequences, prompt_len)

    calls = {"score": 0, "outcomes": 0}
    real_score, real_outcomes = scoring.RewardScorer.score, scoring.RewardScorer.outcomes

    def counted(name, real):
        def call(self, *args, **kwargs):
            calls[name] += 1
            return real(self, *args, **kwargs)
        return call

    monkeypatch.setattr(generator, "make_engine", lambda *a, **k: Streaming(real_make_engine(*a, **k)))
    monkeypatch.setattr(stages, "scores_while_generating", lambda config: True)
    monkeypatch.setattr(scoring.RewardScorer, "score", counted("score", real_score))
    monkeypatch.setattr(scoring.RewardScorer, "outcomes", counted("outcomes", real_outcomes))
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "spread.py").write_text("def spread(data_source, response, ground_truth, extra_info):\n"
                                        "    return {'score': len(response) / 10, 'chars': len(response)}\n")
    config = load_config("grpo", [
        "model.path=rlkit:tiny-qwen2", "data.synthetic_task=echo", "data.train_batch_size=4", "rollout.n=2",
        "actor.mini_batch_size=2", "data.max_prompt_length=16", "data.max_response_length=3",
        "actor.micro_batch_tokens=4096", "trainer.total_steps=2", "rollout.name=hf", "trainer.logger=[jsonl]",
        "reward.num_workers=1", "trainer.workers=in_process", "trainer.device=cpu",
        f"trainer.runs_dir={tmp_path / 'runs'}", f"reward.function={tmp_path / 'spread.py'}:spread"])
    run_dir = train_run(config, run_id="scored")
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert calls == {"score": 0, "outcomes": 2}  # one streamed rollout a step, scored in the worker
    for row in rows:  # the reward's own numbers came back: score = characters / 10
        assert row["reward/mean"] == pytest.approx(row["reward/chars"] / 10)
        assert row["reward/errors"] == 0.0


AGENT_REWARD = '''
import os, time

def policy_chars(data_source, response, ground_truth, extra_info):
    open(os.path.join(extra_info["stamps"], str(time.monotonic_ns())), "w").close()
    return {"score": float(len(response)), "turn_digits": len(response) / 2}
'''


class UnscoredEnv:
    """Ends after ground_truth turns and scores nothing (a tool loop's way: the reward function scores). Its
    second step waits for a reward's stamp: a run that scored only after every episode ended would not see one."""

    second_steps: list[bool] = []

    def reset(self, row):
        self.left, self.turn, self.stamps = int(row["ground_truth"]), 0, Path(row["extra_info"]["stamps"])

    def step(self, action):
        self.turn += 1
        self.left -= 1
        if self.turn == 2:
            UnscoredEnv.second_steps.append(_wait_for_a_stamp(self.stamps, timeout=20.0))
        return "go on", None, self.left == 0


@pytest.mark.parametrize("streamed", [False, True])
def test_agent_episodes_are_scored_as_each_ends(tiny_model_dir, tmp_path, streamed):
    """Row 0's episodes end after one turn, row 1's take three: row 0's are scored (their reward's stamps) while
    row 1's still run, on the batched schedule as on the streamed one; each outcome is the reward of the episode's
    own policy text (2 digits a turn: 2 and 6 characters), the text the controller's Score stage would score."""
    from dataclasses import replace

    from agent_helpers import rows as agent_rows
    from test_agent_streaming import BatchEngine, StreamEngine

    from rlkit.core.agents.guard import Guard
    from rlkit.core.agents.loop import AgentLoop, Limits
    from rlkit.core.rollout.scored_generation import episodes_scored

    (tmp_path / "reward.py").write_text(AGENT_REWARD)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = StreamEngine(tokenizer, shuffle_seed=3) if streamed else BatchEngine(tokenizer)
    limits = Limits(max_turns=4, max_tokens_per_turn=3, max_response_tokens=64, max_prompt_tokens=64)
    loop = AgentLoop(tokenizer, UnscoredEnv, limits, Guard(30.0))
    data = [replace(row, extra_info={"stamps": str(stamps)}) for row in agent_rows(tokenizer, ["a", "b"], ["1", "3"])]
    UnscoredEnv.second_steps = []
    config = RewardConfig(function=f"{tmp_path / 'reward.py'}:policy_chars", num_workers=1)
    with RewardScorer(config) as scorer:
        trajectories = episodes_scored(loop, engine, data, [0, 1], Sampling(n=2, seed=11), scorer, tokenizer)
        texts = [tokenizer.decode(t.policy_ids, skip_special_tokens=True) for t in trajectories]
        after = scorer.score(texts, [t.row.data_source for t in trajectories], ["1", "1", "3", "3"],
                             [t.row.extra_info for t in trajectories])
    assert UnscoredEnv.second_steps == [True, True]  # row 1's two episodes saw row 0's scores at their 2nd turn
    assert [t.info["turns"] for t in trajectories] == [1, 1, 3, 3]
    assert [t.reward_outcome.score for t in trajectories] == after.scores == [2.0, 2.0, 6.0, 6.0]
    assert [t.reward_outcome.details for t in trajectories] == [{"turn_digits": 1.0}] * 2 + [{"turn_digits": 3.0}] * 2


def test_an_episode_its_environment_scored_gets_no_outcome(tiny_model_dir, tmp_path):
    """The environment's own reward (SlowFirstRowEnv gives 1 a turn) stands: no reward call runs for its episodes."""
    from agent_helpers import rows as agent_rows
    from test_agent_streaming import BatchEngine, SlowFirstRowEnv

    from rlkit.core.agents.guard import Guard
    from rlkit.core.agents.loop import AgentLoop, Limits
    from rlkit.core.rollout.scored_generation import episodes_scored

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    limits = Limits(max_turns=4, max_tokens_per_turn=3, max_response_tokens=64, max_prompt_tokens=64)
    loop = AgentLoop(tokenizer, SlowFirstRowEnv, limits, Guard(30.0))
    data = agent_rows(tokenizer, ["a", "b"], ["1", "2"])
    (tmp_path / "never.py").write_text("def never(*args):\n    raise AssertionError('called')\n")
    with RewardScorer(RewardConfig(function=f"{tmp_path / 'never.py'}:never")) as scorer:
        trajectories = episodes_scored(loop, BatchEngine(tokenizer), data, [0, 1], Sampling(n=1, seed=2), scorer,
                                       tokenizer)
    assert [t.reward for t in trajectories] == [1.0, 2.0] and [t.reward_outcome for t in trajectories] == [None] * 2
