"""Small OpenEnv environments for the openenv loop's tests, and openenv's own server for them on localhost."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Callable, Iterator

from openenv.core import Action, Environment, Observation, State, create_fastapi_app


class SayAction(Action):
    message: str


class SayObservation(Observation):
    text: str = ""


class SayDigit(Environment):
    """Asks "digit?"; after the policy's first turn (any text, reward 0.25) names the digit seed % 10; the second
    turn ends the episode with reward 1 where it says that digit, else 0. Episodes whose seed is `fail_seed`
    raise in step, those whose seed is `hang_seed` sleep there. Like an environment holding a thread-bound
    resource (a sqlite connection, a browser), step refuses a thread other than reset's."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    closed = 0  # instances closed, over the class
    step_threads: set[int] = set()  # the threads steps ran on, over the class

    def __init__(self, fail_seed: int | None = None, hang_seed: int | None = None) -> None:
        super().__init__()
        self.fail_seed, self.hang_seed = fail_seed, hang_seed
        self.seed, self.turn = 0, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> SayObservation:
        self.seed, self.turn, self.thread = seed or 0, 0, threading.get_ident()
        return SayObservation(text="digit?")

    def step(self, action: SayAction, timeout_s: float | None = None, **kwargs) -> SayObservation:
        if threading.get_ident() != self.thread:
            raise RuntimeError("step on another thread than reset's")
        type(self).step_threads.add(self.thread)
        if self.seed == self.fail_seed:
            raise ValueError(f"cannot play seed {self.seed}")
        if self.seed == self.hang_seed:
            time.sleep(30)
        self.turn += 1
        digit = str(self.seed % 10)
        if self.turn == 1:
            return SayObservation(text=digit, reward=0.25)
        return SayObservation(reward=float(action.message.strip() == digit), done=True)

    @property
    def state(self) -> State:
        return State(step_count=self.turn)

    def close(self) -> None:
        type(self).closed += 1


class SayDigitOnOneThread(SayDigit):
    REQUIRES_SINGLE_THREAD_EXECUTOR = True
    step_threads: set[int] = set()


class AddAction(Action):
    value: int


class AddObservation(Observation):
    total: int = 0
    target: int = 0


class AddUp(Environment):
    """Integer actions: the total grows by each; done at the target (reward 1) or past it (reward 0)."""

    def reset(self, seed: int | None = None) -> AddObservation:  # no **kwargs: others are dropped for it
        self.total, self.target = 0, seed or 0
        return AddObservation(total=0, target=self.target)

    def step(self, action: AddAction, **kwargs) -> AddObservation:
        self.total += action.value
        done = self.total >= self.target
        return AddObservation(total=self.total, target=self.target, done=done,
                              reward=float(self.total == self.target) if done else None)

    @property
    def state(self) -> State:
        return State()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(factory: Callable[[], Environment], action_cls: type = SayAction, observation_cls: type = SayObservation,
          max_sessions: int = 16) -> Iterator[str]:
    """openenv's FastAPI app for `factory` under uvicorn on a free localhost port, for the block; its URL."""
    import uvicorn

    app = create_fastapi_app(factory, action_cls, observation_cls, max_concurrent_envs=max_sessions)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=_free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the OpenEnv test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
