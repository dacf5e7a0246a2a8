"""A rollout engine run whole in a child process of its own (rollout.vllm.process_per_engine).

vLLM's engine has two halves: the engine core (scheduler, KV-cache bookkeeping, the model) and the client that
turns each step's outputs into results, which costs Python per token (about twice as much with log-probs,
docs/benchmarks.md). With rollout.vllm.replicas the cores already run in processes of their own, but every
replica's client runs in the rollout worker, so all of them take turns on one interpreter. Here each engine,
client and core together, runs in a child of the worker: N replicas use N interpreters, and the worker only
sends prompts and weights and receives token ids and log-probs.

The child is a `python -c` process on one end of a socket pair (not multiprocessing, which re-imports the
caller's __main__ script in every child). It builds the engine from a picklable callable, answers one call at
a time, and exits when the worker's process is gone, so a SIGKILLed trainer does not leave an engine holding
the device. Weights cross as vllm_worker.pack_weights packs them: CUDA tensors as CUDA IPC handles (the child
reads the trainer's memory), CPU tensors by value.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterable, Sequence

import torch

from rlkit.core.rollout.base import RolloutEngine, RolloutSample, Sampling

_CLOSE = "close"


class EngineProcessError(RuntimeError):
    """The engine in a child process failed a call, failed to start, or ended."""


class EngineProcess(RolloutEngine):
    """`build()`'s engine in a child process; the RolloutEngine calls are forwarded to it one at a time.

    `build`: a picklable callable (e.g. functools.partial of an engine class) that the child calls to make its
    engine. Returns once the engine has started; raises EngineProcessError with the child's traceback if not."""

    def __init__(self, build: Callable[[], RolloutEngine]) -> None:
        parent, child = socket.socketpair()
        command = f"from rlkit.core.rollout.engine_process import serve; serve({child.fileno()}, {os.getpid()})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", command], pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.lock = threading.Lock()  # one call at a time on the socket
        try:
            self.conn.send_bytes(pickle.dumps(build))
            started = self._reply("start")
        except BaseException:  # a failed start ends the child by itself; Ctrl-C here ends it too
            self._stop(wait_s=30 if self.process.poll() is None else 0)
            raise
        self.reported_start: dict[str, float] = started["start_parts"]
        self.honors_seeds = started["honors_seeds"]
        self.on_gpu: bool = started["on_gpu"]

    # -- the engine's calls ---------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        return self.call("generate", prompts, sampling, None if token_limits is None else list(token_limits))

    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        return self.call("score", sequences, prompt_len)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from rlkit.core.rollout.vllm_worker import pack_weights

        packed, shared = pack_weights(named_tensors)
        self.call("load_weights", packed)
        del shared  # the child holds no reference to them any more: their memory may go back
        if self.on_gpu:
            torch.cuda.ipc_collect()

    def sleep(self) -> None:
        self.call("sleep")

    def wake_up(self, weights_only: bool = False) -> None:
        self.call("wake_up", weights_only)

    def start_parts(self) -> dict[str, float]:
        return self.reported_start

    # -- the channel ----------------------------------------------------------------------
    def call(self, method: str, *args: Any) -> Any:
        """`method(*args)` on the child's engine; its result, or EngineProcessError with the child's traceback."""
        with self.lock:
            try:
                self.conn.send_bytes(pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL))
            except OSError as exc:
                raise self._ended(method) from exc
            return self._reply(method)

    def _reply(self, method: str) -> Any:
        try:
            status, value = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise self._ended(method) from exc
        if status == "error":
            raise EngineProcessError(f"rollout engine process {self.process.pid}, in {method}: {value}")
        return value

    def _ended(self, method: str) -> EngineProcessError:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return EngineProcessError(f"rollout engine process {self.process.pid} ended during {method} (exit code {code})")

    def close(self) -> None:
        """Ask the child to end, and kill it if it has not within 30 s."""
        if self.process.poll() is None:
            try:
                with self.lock:
                    self.conn.send_bytes(pickle.dumps((_CLOSE, ())))
            except OSError:  # it is already on its way out
                pass
        self._stop(wait_s=30)

    def _stop(self, wait_s: float) -> None:
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()

    def __del__(self) -> None:
        """The child goes with its last reference (an in-process run's workers are dropped at its end)."""
        if getattr(self, "conn", None) is not None and not self.conn.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - at interpreter exit the modules may already be gone
                pass


def serve(fd: int, parent_pid: int) -> None:
    """The child's side: build the engine, then answer calls until told to close or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it ends this process
    threading.Thread(target=_exit_with, args=(parent_pid,), name="rlkit-exit-with-parent", daemon=True).start()
    conn = Connection(fd)
    try:
        engine = pickle.loads(conn.recv_bytes())()
        on_gpu = bool(getattr(engine, "on_gpu", False))
        started = {"start_parts": engine.start_parts(), "honors_seeds": engine.honors_seeds, "on_gpu": on_gpu}
        conn.send_bytes(pickle.dumps(("ok", started)))
    except BaseException:  # noqa: BLE001 - sent to the parent, which raises it
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        os._exit(1)
    while True:
        try:
            method, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the parent is gone
            os._exit(1)
        if method == _CLOSE:
            # os._exit: vLLM's teardown at interpreter exit can hang on its threads; the device memory goes with
            # the process either way.
            os._exit(0)
        try:
            reply = ("ok", _run(engine, method, args))
        except Exception:  # noqa: BLE001 - sent to the parent, which raises it
            reply = ("error", traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def _run(engine: RolloutEngine, method: str, args: tuple) -> Any:
    if method == "load_weights":
        if hasattr(engine, "load_packed_weights"):  # vLLM's: the bytes go on to its worker, wherever that runs
            return engine.load_packed_weights(args[0])
        from rlkit.core.rollout.vllm_worker import unpack_weights

        return engine.load_weights(unpack_weights(args[0]))
    if method not in ("generate", "score", "sleep", "wake_up"):
        raise ValueError(f"no such engine call: {method}")
    return getattr(engine, method)(*args)


def _exit_with(parent_pid: int, poll_seconds: float = 1.0) -> None:
    """End this process once the parent is gone (this process is then re-parented)."""
    while os.getppid() == parent_pid:
        time.sleep(poll_seconds)
    os._exit(1)
