"""An engine in a child process of its own (rollout.vllm.process_per_engine): the calls, weights, failures and the
child's end, with a stand-in engine (the real vLLM engine: tests/test_rollout_engines.py's replicas test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial

import pytest
import torch

from rlkit.core.rollout import engine_process
from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling
from rlkit.core.rollout.engine_process import EngineProcess, EngineProcessError
from rlkit.core.rollout.engines import make_engine
from rlkit.core.rollout.replicas import ReplicatedEngine
from rlkit.recipes.rollout_schema import RolloutConfig


class Echo(RolloutEngine):
    """Sample k of prompt i: the prompt's tokens plus the seed, log-probs the loaded weights' sum; it says which
    process it ran in."""

    def __init__(self, fail_start: bool = False) -> None:
        if fail_start:
            raise RuntimeError("no such model: /nowhere")
        self.weight_sum = 0.0
        self.calls: list[str] = []

    def generate(self, prompts, sampling, token_limits=None):
        if sampling.max_tokens == 13:
            raise ValueError("13 tokens is unlucky")
        if sampling.max_tokens == 99:
            os._exit(7)  # the engine's process dies mid-call
        limits = token_limits or [sampling.max_tokens] * len(prompts)
        return [
            RolloutSample(i, [*prompt, sampling.seed + i * sampling.n + k][:limit], [self.weight_sum], True)
            for i, (prompt, limit) in enumerate(zip(prompts, limits))
            for k in range(sampling.n)
        ]

    def score(self, sequences, prompt_len):
        return [[float(os.getpid())] + [float(t) for t in s[prompt_len:]] for s in sequences]

    def load_weights(self, named_tensors):
        self.weight_sum = sum(float(t.sum()) for _, t in named_tensors)

    def sleep(self):
        self.calls.append("sleep")

    def wake_up(self, weights_only=False):
        self.calls.append(f"wake_up({weights_only})")

    def start_parts(self):
        return {"rollout_engine_load": 1.5}


def test_calls_weights_and_results_cross_to_the_child_and_back():
    engine = EngineProcess(partial(Echo))
    try:
        assert engine.start_parts() == {"rollout_engine_load": 1.5} and engine.honors_seeds
        samples = engine.generate([[5, 6], [7]], Sampling(n=2, max_tokens=3, seed=10), [3, 1])
        assert [(s.prompt_index, s.token_ids, s.log_probs) for s in samples] == [
            (0, [5, 6, 10], [0.0]), (0, [5, 6, 11], [0.0]), (1, [7], [0.0]), (1, [7], [0.0])
        ]
        engine.load_weights([("a", torch.ones(2, 3)), ("b", torch.full((4,), 0.5))])  # CPU tensors go by value
        assert engine.generate([[1]], Sampling(max_tokens=1))[0].log_probs == [8.0]
        pid, *tokens = engine.score([[1, 2, 3, 4]], 2)[0]
        assert pid == engine.process.pid != os.getpid() and tokens == [3.0, 4.0]
        engine.wake_up(True)
        engine.sleep()
    finally:
        engine.close()
    assert engine.process.returncode == 0


def test_a_failed_call_raises_the_childs_traceback_and_the_engine_goes_on():
    engine = EngineProcess(partial(Echo))
    try:
        with pytest.raises(EngineProcessError, match=r"in generate: Traceback(.|\n)*ValueError: 13 tokens is unlucky"):
            engine.generate([[1]], Sampling(max_tokens=13))
        assert engine.generate([[1]], Sampling(max_tokens=2, seed=4))[0].token_ids == [1, 4]
        with pytest.raises(EngineProcessError, match="no such engine call: close_door"):
            engine.call("close_door")
    finally:
        engine.close()


def test_a_start_that_fails_raises_and_leaves_no_process(monkeypatch):
    spawned: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        spawned.append(real_popen(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    with pytest.raises(EngineProcessError, match="in start: Traceback(.|\\n)*no such model: /nowhere"):
        EngineProcess(partial(Echo, fail_start=True))
    assert spawned[0].poll() == 1  # it ended by itself, having sent its error


def test_a_child_that_dies_mid_call_is_an_error_naming_the_call_and_exit_code():
    engine = EngineProcess(partial(Echo))
    try:
        with pytest.raises(EngineProcessError, match=r"ended during generate \(exit code 7\)"):
            engine.generate([[1]], Sampling(max_tokens=99))
        with pytest.raises(EngineProcessError, match="ended during sleep"):
            engine.sleep()
    finally:
        engine.close()


def test_the_child_ends_with_a_sigkilled_parent():
    """A SIGKILLed trainer must not leave its engines holding the device: the child polls its parent."""
    script = textwrap.dedent(
        """
        import time
        from functools import partial
        from test_engine_process import Echo
        from rlkit.core.rollout.engine_process import EngineProcess
        engine = EngineProcess(partial(Echo))
        print(engine.process.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])})
    child_pid = int(parent.stdout.readline())
    os.kill(child_pid, 0)  # alive while the parent lives
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the engine process {child_pid} outlived its parent by 10 s")


def test_replicas_with_process_per_engine_are_child_engines_with_their_memory_share(monkeypatch):
    built = []

    class Recorder(RolloutEngine):
        honors_seeds = True

        def __init__(self, build):
            built.append(build)

        generate = score = load_weights = None  # type: ignore[assignment]

    monkeypatch.setattr(engine_process, "EngineProcess", Recorder)
    config = RolloutConfig(name="vllm", gpu_memory_utilization=0.6, vllm={"replicas": 3, "process_per_engine": True})
    engine = make_engine(config, "/models/m", max_model_len=64, device=torch.device("cpu"), dtype="float32", seed=2,
                         sleep_mode=False)
    assert isinstance(engine, ReplicatedEngine) and len(engine.replicas) == 3 and len(built) == 3
    from rlkit.core.rollout.vllm_engine import VLLMEngine

    build = built[0]
    assert build.func is VLLMEngine and build.args == ("/models/m",)
    assert build.keywords["gpu_memory_utilization"] == pytest.approx(0.2) and build.keywords["seed"] == 2
    assert build.keywords["separate_process"] is False  # the core in the child's own process, unless asked
