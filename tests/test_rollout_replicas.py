"""rollout.vllm.replicas: a call split over several engines gives the samples one engine would (shares, seeds,
prompt indices, per-prompt limits), and weights, sleep and wake reach every engine."""

from __future__ import annotations

import threading

import pytest
import torch

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling, limits_per_prompt, request_seed
from rlkit.core.rollout.replicas import ReplicatedEngine, shares


class Recorder(RolloutEngine):
    """An engine whose sample j of prompt i is [seed of that sample, limit, first prompt token]."""

    def __init__(self, meet: threading.Barrier | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.meet = meet  # each engine's generate waits for the others' there: they must run at the same time

    def generate(self, prompts, sampling, token_limits=None):
        if self.meet is not None:
            self.meet.wait(timeout=10)
        self.calls.append(("generate", [p[0] for p in prompts]))
        limits = limits_per_prompt(prompts, sampling, token_limits)
        return [RolloutSample(i, [request_seed(sampling, i, j), limits[i], p[0]], [], True)
                for i, p in enumerate(prompts) for j in range(sampling.n)]

    def score(self, sequences, prompt_len):
        self.calls.append(("score", [s[0] for s in sequences]))
        return [[float(s[0] + prompt_len)] for s in sequences]

    def load_weights(self, named_tensors):
        self.calls.append(("load", [name for name, _ in named_tensors]))

    discards_weights = True

    def sleep(self, discard_weights=False):
        self.calls.append(("sleep", discard_weights))

    def wake_up(self, weights_only=False):
        self.calls.append(("wake_up", weights_only))


def test_shares_are_contiguous_and_differ_by_at_most_one():
    assert shares(5, 2) == [range(0, 3), range(3, 5)]
    assert shares(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert shares(1, 3) == [range(0, 1), range(1, 1), range(1, 1)]


def test_a_split_call_gives_one_engines_seeds_indices_and_limits_in_order():
    sampling = Sampling(n=2, max_tokens=4, seed=10)
    prompts = [[100 + i] for i in range(5)]
    limits = [4, 3, 2, 1, 4]
    one = Recorder().generate(prompts, sampling, limits)
    meet = threading.Barrier(2)
    engines = [Recorder(meet), Recorder(meet)]
    split = ReplicatedEngine(engines).generate(prompts, sampling, limits)
    # prompts 0-2 on the first engine, 3-4 on the second; prompt 3's samples keep seeds 10 + 3 * 2 + j = 16, 17
    assert [s.token_ids for s in split] == [s.token_ids for s in one]
    assert [s.token_ids[0] for s in split[6:]] == [16, 17, 18, 19]
    assert [s.prompt_index for s in split] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert engines[0].calls == [("generate", [100, 101, 102])] and engines[1].calls == [("generate", [103, 104])]


def test_each_prompts_own_seed_goes_with_it_to_its_engine():
    """An agent turn's call (Sampling.prompt_seeds: each episode's own seed): prompt 3 keeps seed 40 on engine 2."""
    sampling = Sampling(n=1, max_tokens=4, seed=10, prompt_seeds=[7, 20, 30, 40, 50])
    split = ReplicatedEngine([Recorder(), Recorder()]).generate([[100 + i] for i in range(5)], sampling)
    assert [s.token_ids[0] for s in split] == [7, 20, 30, 40, 50]


def test_fewer_prompts_than_engines_leave_the_rest_idle():
    engines = [Recorder(), Recorder(), Recorder()]
    samples = ReplicatedEngine(engines).generate([[7], [8]], Sampling(n=1, seed=0))
    assert [s.token_ids for s in samples] == [[0, 16, 7], [1, 16, 8]]
    assert [len(e.calls) for e in engines] == [1, 1, 0]


def test_scores_come_back_in_order_and_weights_sleep_and_wake_reach_every_engine():
    engines = [Recorder(), Recorder()]
    replicated = ReplicatedEngine(engines)
    assert replicated.score([[1], [2], [3]], 10) == [[11.0], [12.0], [13.0]]
    replicated.load_weights((name, torch.zeros(1)) for name in ["a", "b"])  # a generator, read once
    replicated.sleep()
    replicated.wake_up(weights_only=True)
    assert replicated.discards_weights
    replicated.sleep(discard_weights=True)
    assert engines[0].calls[1:] == engines[1].calls[1:] == [
        ("load", ["a", "b"]), ("sleep", False), ("wake_up", True), ("sleep", True)
    ]
    engines[1].discards_weights = False  # only where every replica can
    assert not replicated.discards_weights


def test_an_engines_error_reaches_the_caller():
    class Broken(Recorder):
        def generate(self, prompts, sampling, token_limits=None):
            raise RuntimeError("engine 2 died")

    with pytest.raises(RuntimeError, match="engine 2 died"):
        ReplicatedEngine([Recorder(), Broken()]).generate([[1], [2]], Sampling())
