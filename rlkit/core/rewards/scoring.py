"""Batched, guarded reward scoring: every row's function runs in a persistent process pool.

Each worker process runs one call at a time, so the controller knows when every call
started: a call that outlives `reward.timeout_s` has its worker killed and replaced
(the rest of the batch goes on), and the row is reported as failed. An exception, a timeout
or a dead worker fails the row, with its index, data_source, function and error;
`reward.on_error` says whether that stops the run (at once: the batch stops at the first
failed row, before any update) or scores the row 0 and counts it in `reward/errors`.

A call that returns, but not a usable score, is invalid, whatever `reward.on_error` says: a
score (or a dict's other value) that is not a number, not finite, or (the score) beyond
+-MAX_ABS_SCORE. (A dict without a 'score' key is the function's own shape, not a value a
response can change: that is a failed row.) The row scores 0, its reason is kept
(ScoredBatch.invalid) and it counts in `reward/invalid`; the run goes on. A reward's output can
depend on the policy's text, and a policy must not be able to stop a run or send it a NaN.
A function that declares its range (registry.score_range) has its scores clamped into it;
others are not clamped. Nothing is scored in the controller's own process, where a hung
call could not be stopped.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

import rlkit.core.data.synthetic  # noqa: F401  (registers the synthetic tasks' reward)
import rlkit.core.rewards.code  # noqa: F401  (registers HumanEval's tests)
import rlkit.core.rewards.gsm8k  # noqa: F401  (registers gsm8k)
import rlkit.core.rewards.math  # noqa: F401  (registers math)
from rlkit.core.rewards.custom import FileFunction, load_function
from rlkit.core.rewards.registry import clamp, declared_range, reward_fn_for
from rlkit.errors import UserError
from rlkit.recipes.reward_schema import RewardConfig

RULE_OPTIONS = ("gsm8k_method", "format_score")  # reward.* options passed to rules declaring them
MAX_ABS_SCORE = 1e6  # a larger score is a bug or a forgery: in float32 advantages its square overflows
_STARTUP_TIMEOUT_S = 120.0
# fn(data_source, response, ground_truth, extra_info) -> float | dict
Call = tuple[Callable[..., Any], tuple[str, str, str, dict[str, Any]]]


@dataclass
class ScoredBatch:
    """One score per response, plus what to log."""

    scores: list[float]
    metrics: dict[str, float]  # reward/errors, reward/<key> means of extra dict keys, call times
    details: list[dict[str, float]] = field(default_factory=list)  # per row: its extra dict keys
    errors: list[str] = field(default_factory=list)  # failed rows' messages (on_error=zero)
    invalid: list[str] = field(default_factory=list)  # rows scored 0 for an unusable return value, and why


class RewardError(UserError):
    """A reward call failed; the message names the row, data_source, function and error."""


@dataclass
class _Outcome:
    score: float | None
    details: dict[str, float]
    error: str | None
    seconds: float
    invalid: str | None = None  # why the return value is not a usable score


class _Invalid(ValueError):
    """A return value that is not a usable score."""


def _number(value: Any, what: str, limit: float = math.inf) -> float:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise _Invalid(f"{what} is {value!r:.80} ({type(value).__name__}), not a number")
    try:
        number = float(value)
    except Exception as exc:  # noqa: BLE001 - an int too large for a float, or a __float__ that fails
        raise _Invalid(f"{what} is not a float ({type(exc).__name__}: {exc})") from None
    if not math.isfinite(number):
        raise _Invalid(f"{what} is {number}, not a finite number")
    if abs(number) > limit:
        raise _Invalid(f"{what} is {number:g}, beyond +-{limit:g}")
    return number


def _normalize(result: Any) -> tuple[float, dict[str, float]]:
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"returned a dict without a 'score' key (keys: {sorted(map(str, result))})")
        details = {str(k): _number(v, f"key {k!r}") for k, v in result.items() if k != "score"}
        return _number(result["score"], "'score'", MAX_ABS_SCORE), details
    return _number(result, "the return value", MAX_ABS_SCORE), {}


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _run(call: Call) -> _Outcome:
    fn, args = call
    start = time.perf_counter()
    try:
        result = fn(*args)
    except Exception as exc:
        return _Outcome(None, {}, _describe(exc), time.perf_counter() - start)
    seconds = time.perf_counter() - start
    try:
        return _Outcome(*_normalize(result), None, seconds)
    except _Invalid as exc:
        return _Outcome(None, {}, None, seconds, invalid=str(exc))
    except ValueError as exc:  # the function's shape, which no response changes: a bug to stop on
        return _Outcome(None, {}, f"bad return value: {exc}", seconds)


def _call_rule(rule: Callable[..., Any], options: dict[str, Any], data_source: str, response: str,
               ground_truth: str, extra_info: dict[str, Any]) -> Any:
    return rule(response, ground_truth, extra_info, **options)


def _worker_main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    conn = Connection(fd)
    conn.send("ready")
    while True:
        try:
            call = pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionError):  # the controller is gone
            return
        except Exception as exc:  # the function cannot be imported here
            conn.send(_Outcome(None, {}, f"cannot load the function in a reward worker: {_describe(exc)}", 0.0))
            continue
        if call is None:
            return
        conn.send(_run(call))


class _Worker:
    """A `python -c` child on one end of a socket pair. Not multiprocessing: that re-imports the
    caller's __main__ script in every child (and fails without an `if __name__` guard)."""

    def __init__(self) -> None:
        parent, child = socket.socketpair()
        command = f"from rlkit.core.rewards.scoring import _worker_main; _worker_main({child.fileno()})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen([sys.executable, "-c", command], pass_fds=[child.fileno()],
                                        stdin=subprocess.DEVNULL, env=env)
        child.close()
        self.conn = Connection(parent.detach())
        self.ready = False
        self.spawned = time.monotonic()
        self.row: int | None = None  # the row it is scoring
        self.started = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class _Pool:
    """Worker processes that each score one call at a time; hung or dead ones are replaced.

    Rows go to whichever worker is free, so hung calls on different workers time out at the
    same time, and a replacement starts while the other workers go on scoring.
    """

    def __init__(self, size: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.workers = [_Worker() for _ in range(size)]

    def run(self, calls: list[Call], names: list[str], *, stop_on_error: bool) -> list[_Outcome | None]:
        """One outcome per call; with `stop_on_error`, the first failure stops the batch (the
        rows not scored by then stay None)."""
        try:
            return self._run(calls, names, stop_on_error)
        finally:  # Ctrl-C, a call that cannot be sent, or an early stop: drop calls still running
            for i, worker in enumerate(self.workers):
                if worker.row is not None:
                    self._replace(i)

    def _run(self, calls: list[Call], names: list[str], stop_on_error: bool) -> list[_Outcome | None]:
        outcomes: list[_Outcome | None] = [None] * len(calls)
        todo = deque(range(len(calls)))
        while todo or any(w.row is not None for w in self.workers):
            self._dispatch(todo, calls, names)
            busy = {w.conn: w for w in self.workers if not w.ready or w.row is not None}
            now = time.monotonic()
            ends = [w.started + self.timeout_s if w.row is not None else w.spawned + _STARTUP_TIMEOUT_S
                    for w in busy.values()]
            for conn in wait(list(busy), timeout=max(0.0, min(ends) - now)):
                self._receive(busy[conn], outcomes)
            self._enforce_deadlines(outcomes)
            if stop_on_error and any(o is not None and o.error is not None for o in outcomes):
                break
        return outcomes

    def _dispatch(self, todo: deque[int], calls: list[Call], names: list[str]) -> None:
        for worker in self.workers:
            if worker.ready and worker.row is None and todo:
                row = todo.popleft()
                try:
                    worker.conn.send(calls[row])
                except Exception as exc:
                    raise RewardError(
                        f"reward function {names[row]} cannot be sent to the reward worker processes "
                        f"({_describe(exc)}); define it at module level of an importable file") from exc
                worker.row, worker.started = row, time.monotonic()

    def _enforce_deadlines(self, outcomes: list[_Outcome | None]) -> None:
        """Kill and replace workers whose call outlived reward.timeout_s; a worker that never
        started is a broken environment, not a slow reward."""
        now = time.monotonic()
        for i, worker in enumerate(self.workers):
            if worker.row is not None and now - worker.started > self.timeout_s:
                outcomes[worker.row] = _Outcome(
                    None, {}, f"timed out after {self.timeout_s:g} s (reward.timeout_s); its worker was "
                    "killed (raise reward.timeout_s if the function is only slow)", now - worker.started)
                self._replace(i)
            elif not worker.ready and now - worker.spawned > _STARTUP_TIMEOUT_S:
                raise RewardError(f"a reward worker process (pid {worker.process.pid}) did not start within "
                                  f"{_STARTUP_TIMEOUT_S:.0f} s: the machine is overloaded or `{sys.executable} -c "
                                  "'import rlkit.core.rewards.scoring'` hangs there")

    def _receive(self, worker: _Worker, outcomes: list[_Outcome | None]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            code = worker.process.wait()
            if worker.row is None:
                raise RewardError(f"a reward worker process exited while starting (exit code {code}); "
                                  f"`{sys.executable} -c 'import rlkit.core.rewards.scoring'` shows why") from None
            outcomes[worker.row] = _Outcome(None, {}, f"the reward worker process died (exit code {code})", 0.0)
            self._replace(self.workers.index(worker))
            return
        if message == "ready":
            worker.ready = True
        else:
            outcomes[worker.row] = message  # type: ignore[index]
            worker.row = None

    def _replace(self, i: int) -> None:
        self.workers[i].kill()
        self.workers[i] = _Worker()

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=1.0)  # a clean exit first; kill() reaps either way
            worker.kill()
        self.workers = []


def rule_for(data_source: str, where: str) -> Callable[..., Any]:
    """The registered rule for `data_source`; RewardError naming `where` (a row) if there is none."""
    try:
        return reward_fn_for(data_source)
    except KeyError as exc:
        raise RewardError(f"{where}: {exc.args[0]}; set reward.function=path/file.py:fn to score "
                          "it with your own function") from None


def check_reward_functions(config: RewardConfig, data_sources: list[str], where: str) -> str:
    """Before a run: reward.function imports, or every row's data_source has a rule; says which."""
    if config.function:
        return f"reward.function={FileFunction(config.function, 'reward.function').spec}"
    rules = {}
    for row, source in enumerate(data_sources):
        if source not in rules:
            rule = rule_for(source, f"{where}, row {row}")
            rules[source] = f"{rule.__module__}.{rule.__qualname__}"
    return "reward rules: " + ", ".join(f"{source} -> {name}" for source, name in rules.items())


@dataclass(frozen=True)
class _Function:
    fn: Callable[..., Any]  # picklable: sent to the worker processes
    name: str
    score_range: tuple[float, float] | None


class RewardScorer:
    """Scores batches of responses; keep one per run (its worker processes persist)."""

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self._custom: _Function | None = None
        if config.function:
            custom = FileFunction(config.function, "reward.function")
            loaded = load_function(custom.spec, "reward.function")
            self._custom = _Function(custom, custom.spec, declared_range(loaded, custom.spec))
        self._rules: dict[str, _Function] = {}
        self._pool: _Pool | None = _Pool(config.num_workers, config.timeout_s)

    def _function_for(self, data_source: str, row: int) -> _Function:
        if self._custom is not None:
            return self._custom
        if data_source not in self._rules:
            rule = rule_for(data_source, f"row {row}")
            declared = inspect.signature(rule).parameters
            options = {k: getattr(self.config, k) for k in RULE_OPTIONS if k in declared}
            name = f"{rule.__module__}.{rule.__qualname__}"
            self._rules[data_source] = _Function(functools.partial(_call_rule, rule, options), name,
                                                 declared_range(rule, name))
        return self._rules[data_source]

    def score(self, responses: list[str], data_sources: list[str], ground_truths: list[str],
              extra_infos: list[dict]) -> ScoredBatch:
        """One score per response; raises RewardError on a failed call unless on_error=zero (an invalid
        score never raises: it scores 0 and is counted)."""
        if not len(responses) == len(data_sources) == len(ground_truths) == len(extra_infos):
            raise ValueError("responses, data_sources, ground_truths and extra_infos differ in length")
        functions = [self._function_for(ds, i) for i, ds in enumerate(data_sources)]
        rows = zip(data_sources, responses, ground_truths, extra_infos, strict=True)
        calls = [(f.fn, args) for f, args in zip(functions, rows, strict=True)]
        if self._pool is None:
            raise RuntimeError("this RewardScorer is closed")
        outcomes = self._pool.run(calls, [f.name for f in functions], stop_on_error=self.config.on_error == "raise")
        return self._collect(outcomes, functions, data_sources, extra_infos)

    def _collect(self, outcomes: list[_Outcome | None], functions: list[_Function], data_sources: list[str],
                 extra_infos: list[dict]) -> ScoredBatch:
        """Scores and metrics; a failed row raises (on_error=raise: the batch stopped at it) or scores 0;
        an invalid row scores 0; a score outside its function's declared range is clamped into it."""
        errors, invalid = [], []
        for i, outcome in enumerate(outcomes):
            if outcome is None or (outcome.error is None and outcome.invalid is None):
                continue
            index = (extra_infos[i] or {}).get("index")
            dataset_row = f", dataset index {index}" if index is not None else ""
            where = f"row {i} (data_source {data_sources[i]!r}{dataset_row}, function {functions[i].name})"
            if outcome.error is not None:
                errors.append(f"reward failed on {where}: {outcome.error}")
            else:
                invalid.append(f"invalid score on {where}: {outcome.invalid}; scored 0")
        if errors and self.config.on_error == "raise":
            more = f" ({len(errors) - 1} more rows failed)" if len(errors) > 1 else ""  # those that ran by then
            raise RewardError(f"{errors[0]}{more}. Fix the function, or set reward.on_error=zero to score "
                              "failed rows 0 and count them in reward/errors")
        scored = [o for o in outcomes if o is not None]  # every row, unless the batch stopped early
        assert len(scored) == len(outcomes), "a batch stops early only to raise"
        details = [o.details for o in scored]
        metrics = {"reward/errors": float(len(errors)), "reward/invalid": float(len(invalid))}
        for key in sorted({k for d in details for k in d}):
            values = [d[key] for d in details if key in d]
            metrics[f"reward/{key}"] = sum(values) / len(values)
        if scored:
            seconds = [o.seconds for o in scored]
            metrics["reward/call_seconds_mean"] = sum(seconds) / len(seconds)
            metrics["reward/call_seconds_max"] = max(seconds)
        scores = [clamp(o.score, f.score_range) if o.score is not None else 0.0
                  for o, f in zip(scored, functions, strict=True)]
        return ScoredBatch(scores, metrics, details, errors, invalid)

    def call_each(self, data_sources: list[str], responses: list[str], ground_truths: list[str],
                  extra_infos: list[dict], wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
                  ) -> list[tuple[str, float | None, str | None]]:
        """Each row's function, wrapped by `wrap` (picklable: it runs in the workers), called once in the pool
        under reward.timeout_s, every row run whatever the others do: per row (function name, score, error).
        For `rlkit train --dry-run`, which judges each raw return value in `wrap`, before scoring does."""
        functions = [self._function_for(ds, i) for i, ds in enumerate(data_sources)]
        rows = zip(data_sources, responses, ground_truths, extra_infos, strict=True)
        calls = [(wrap(f.fn), args) for f, args in zip(functions, rows, strict=True)]
        names = [f.name for f in functions]
        if self._pool is None:
            raise RuntimeError("this RewardScorer is closed")
        outcomes = [o for o in self._pool.run(calls, names, stop_on_error=False) if o is not None]
        assert len(outcomes) == len(calls), "without stop_on_error every call runs"
        return [(name, o.score, o.error) for name, o in zip(names, outcomes, strict=True)]

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
