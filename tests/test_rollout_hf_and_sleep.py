"""Rollout engines: the transformers engine's recorded log-probs, forced lengths, vLLM sleep/wake by parts."""

from __future__ import annotations

import gc
import os
import sys
import types

import pytest
import torch

from rlkit.core.rollout import vllm_engine
from rlkit.core.rollout.base import Sampling
from rlkit.core.rollout.hf_engine import HFEngine
from rlkit.core.rollout.vllm_engine import VLLMEngine
from rlkit.errors import ConfigError
from rlkit.recipes.loader import load_config


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir) -> HFEngine:
    return HFEngine(str(tiny_model_dir), dtype="float32", device=torch.device("cpu"))


def test_greedy_log_probs_are_the_models_own(hf_engine):
    prompts = [[5, 6, 7], [8, 9]]
    for sample in hf_engine.generate(prompts, Sampling(n=1, max_tokens=5, greedy=True)):
        prompt = prompts[sample.prompt_index]
        scored = hf_engine.score([prompt + sample.token_ids], len(prompt))[0]
        assert sample.log_probs == pytest.approx(scored, abs=1e-5)


def test_top_k_1_samples_the_argmax_with_probability_one(hf_engine):
    greedy = hf_engine.generate([[5, 6, 7]], Sampling(n=1, max_tokens=4, greedy=True))[0]
    top1 = hf_engine.generate([[5, 6, 7]], Sampling(n=2, max_tokens=4, top_k=1, seed=3))
    for sample in top1:
        assert sample.token_ids == greedy.token_ids
        assert sample.log_probs == pytest.approx([0.0] * 4, abs=1e-6)


def test_ignore_eos_generates_max_tokens(hf_engine):
    samples = hf_engine.generate([[5, 6], [7]], Sampling(n=3, max_tokens=9, ignore_eos=True, seed=1))
    assert [len(s.token_ids) for s in samples] == [9] * 6


def test_a_sample_depends_only_on_its_own_seed(hf_engine):
    # The engine contract: sample j of prompt i uses seed + i * n + j. Prompt [5, 6, 7] with
    # seed 40 alone must come out the same as prompt 1, sample 0 of a bigger batch with base
    # seed 38 (38 + 1 * 2 + 0 = 40), and as the same request in chunks of 2 rows.
    sampling = Sampling(n=1, max_tokens=8, ignore_eos=True, seed=40)
    global_rng = torch.get_rng_state()
    alone = hf_engine.generate([[5, 6, 7]], sampling)[0]
    assert torch.equal(torch.get_rng_state(), global_rng)  # the worker's RNG is not touched
    batch = [[8, 9], [5, 6, 7], [10, 11, 12, 13]]
    in_batch = hf_engine.generate(batch, Sampling(n=2, max_tokens=8, ignore_eos=True, seed=38))
    assert (in_batch[2].prompt_index, in_batch[2].token_ids) == (1, alone.token_ids)
    assert in_batch[2].log_probs == pytest.approx(alone.log_probs, abs=1e-5)
    chunked = HFEngine.__new__(HFEngine)
    chunked.__dict__.update(hf_engine.__dict__, batch_size=2)
    assert [s.token_ids for s in chunked.generate(batch, Sampling(n=2, max_tokens=8, ignore_eos=True, seed=38))] \
        == [s.token_ids for s in in_batch]
    # Not one fixed answer: other seeds give other samples.
    others = {tuple(hf_engine.generate([[5, 6, 7]], Sampling(n=1, max_tokens=8, ignore_eos=True, seed=k))[0].token_ids)
              for k in range(41, 46)}
    assert others - {tuple(alone.token_ids)}


class FakeLLM:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))


def test_vllm_wakes_only_the_weights_for_a_sync_and_the_kv_cache_before_generating():
    engine = object.__new__(VLLMEngine)  # the sleep/wake bookkeeping alone, without an engine
    engine.llm, engine.sleep_mode, engine.asleep = FakeLLM(), True, set()
    engine.sleep()
    engine.wake_up(weights_only=True)   # weight sync
    engine.wake_up(weights_only=True)   # nothing left to wake for a sync
    engine.wake_up()                    # generate
    assert engine.llm.calls == [("sleep", 1), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    assert engine.asleep == set()


def test_vllm_frees_the_weights_at_sleep_level_2_when_told_they_will_be_loaded_again():
    engine = object.__new__(VLLMEngine)
    engine.llm, engine.sleep_mode, engine.asleep = FakeLLM(), True, set()
    assert engine.discards_weights
    engine.sleep(discard_weights=True)
    engine.sleep(discard_weights=True)  # asleep already
    engine.wake_up()
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ["kv_cache", "weights"])]
    engine.sleep_mode = False  # on a CPU: nothing to free
    assert not engine.discards_weights


class GcWatchingLLM:
    """vLLM's generate as the engine calls it, noting whether the garbage collector was on."""

    def __init__(self, fail: bool = False) -> None:
        self.collector_on: list[bool] = []
        self.fail = fail

    def generate(self, requests: list, params: list, use_tqdm: bool) -> list:
        self.collector_on.append(gc.isenabled())
        if self.fail:
            raise RuntimeError("engine died")
        done = types.SimpleNamespace(token_ids=[5, 6], logprobs=None, finish_reason="length")
        return [types.SimpleNamespace(outputs=[done]) for _ in requests]


def test_vllm_generate_runs_with_the_garbage_collector_off_and_restores_it():
    """No collection walks a trainer's heap while vLLM generates (docs/benchmarks.md); the collector is
    back as it was afterwards, also when the engine fails or the caller had turned it off."""
    engine = object.__new__(VLLMEngine)
    engine.llm = GcWatchingLLM()
    sampling = Sampling(n=2, max_tokens=2, seed=3, log_probs=False)
    samples = engine.generate([[1, 2], [3]], sampling)
    assert engine.llm.collector_on == [False] and gc.isenabled()
    assert [(s.prompt_index, s.token_ids) for s in samples] == [(0, [5, 6]), (0, [5, 6]), (1, [5, 6]), (1, [5, 6])]
    engine.llm = GcWatchingLLM(fail=True)
    with pytest.raises(RuntimeError, match="engine died"):
        engine.generate([[1]], sampling)
    assert engine.llm.collector_on == [False] and gc.isenabled()
    gc.disable()
    try:
        engine.llm = GcWatchingLLM()
        engine.generate([[1]], sampling)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_vllm_engine_arguments_take_engine_kwargs_last(monkeypatch):
    """rlkit's own arguments (processed log-probs, the CPU's whole prefills) unless engine_kwargs
    name them: recipes cannot (rlkit.recipes.checks), bench/vllm_logprobs.py does."""
    seen: list[dict] = []
    stand_in = types.SimpleNamespace(LLM=lambda **kwargs: seen.append(kwargs), envs=types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm", stand_in)
    # vLLM's real engine modules would be imported under the stand-in where this process has not imported them yet
    monkeypatch.setattr(vllm_engine, "import_engine_modules", lambda: None)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the engine core goes in this process all the same

    def start(engine_kwargs):
        VLLMEngine("m", dtype="float32", seed=0, max_model_len=64, device=torch.device("cpu"),
                   gpu_memory_utilization=0.3, enforce_eager=None, max_num_seqs=4, sleep_mode=False,
                   engine_kwargs=engine_kwargs)
        return seen[-1]

    default = start(None)
    assert (default["logprobs_mode"], default["enable_chunked_prefill"], default["enforce_eager"]) == (
        "processed_logprobs", False, True)
    assert default["enable_prefix_caching"] and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    overridden = start({"logprobs_mode": "raw_logprobs", "async_scheduling": False})
    assert (overridden["logprobs_mode"], overridden["async_scheduling"]) == ("raw_logprobs", False)


def test_split_placement_must_leave_devices_to_train():
    with pytest.raises(ConfigError, match="rollout.devices"):
        load_config("grpo-demo", ["rollout.placement=split", "rollout.devices=1", "trainer.n_gpus_per_node=1"])
    config = load_config("grpo-demo", ["rollout.placement=split", "rollout.devices=1", "trainer.n_gpus_per_node=2"])
    assert config.world_size == 1
