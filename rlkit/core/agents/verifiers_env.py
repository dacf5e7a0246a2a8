"""`rollout.agent.loop=verifiers:ENV`: a verifiers (0.4) environment as an rlkit environment.

verifiers 0.4 splits an environment into a taskset (its tasks: prompt, system prompt, the task's own
fields), a Task class (its weighted `@vf.reward` functions and `@vf.metric`s: the rubric) and an `Env`
whose `run(task, agents)` is the episode's control flow: `agents.<seat>.run(task)` for one reply, or
`agents.<seat>.interaction(task)` and `turn(message)` for a conversation the environment answers.

rlkit plays the env's one seat with its own engine, turn by turn in the agent loop (rlkit.core.agents.loop):
the seat handed to `Env.run` is `_PolicySeat`, whose `turn()` hands the env's messages to the loop and returns
the policy's reply as a verifiers `Segment`. Token ids stay the engine's; verifiers sees text. When the
exchange closes, the Task scores the conversation (`Task.score`, as a verifiers rollout's close does), then
`Env.finalize` runs; the episode's reward is the trace's weighted sum, and each reward's score and each
metric is logged (`verifiers/reward/<name>`, `verifiers/metric/<name>`).

The data: `rlkit prep-data verifiers -o env=ENV` writes the taskset's tasks as rows whose ground truth
(`reward_model.ground_truth`) is the task's data as JSON; each episode rebuilds its Task from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any, AsyncIterator

from rlkit.errors import UserError

PREFIX = "verifiers:"
KEY = "rollout.agent.loop"


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise UserError(
            f"{KEY}=verifiers:...: cannot import verifiers 0.4 ({exc}); `make venv` installs it "
            "(see the Makefile for the packages it needs)"
        ) from None
    return vf


def is_verifiers(loop: Any) -> bool:
    """Whether rollout.agent.loop names a verifiers environment (an object from the Python API never does)."""
    return isinstance(loop, str) and loop.startswith(PREFIX)


def load_verifiers_env(spec: str) -> Any:
    """The vf.Env that `spec` ('verifiers:ID' or 'verifiers:path/file.py:fn') names; UserError naming the key."""
    from rlkit.core.rewards.custom import load_function

    vf = _vf()
    name = spec.removeprefix(PREFIX)
    where = f"{KEY}={spec}"
    try:
        if ":" in name:
            env = load_function(name, KEY)()
        else:
            env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": name}}))
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the environment's own code: any failure is the user's to fix
        raise UserError(f"{where}: loading the environment failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(env, vf.Env):
        raise UserError(f"{where}: got {type(env).__name__}, not a verifiers.v1 Env (e.g. vf.SingleAgentEnv)")
    seats = seat_names(env)
    if len(seats) != 1:
        raise UserError(
            f"{where}: the environment declares the seats {seats}; rlkit's policy plays one seat, so use an "
            "environment with exactly one AgentConfig field"
        )
    return env


def seat_names(env: Any) -> list[str]:
    """The env's seats (its config's AgentConfig fields), through vf.Agents' own discovery."""
    names: list[str] = []
    _vf().Agents(env.config, lambda name, _config: names.append(name))
    return names


def task_rows(env: Any, spec: str) -> list[tuple[list[dict[str, Any]], str]]:
    """Each task of the env's taskset as (its opening chat messages, its data as JSON)."""
    rows = []
    for task in env.taskset:
        data = task.data
        rows.append((opening_messages(data, None), json.dumps(data.model_dump(mode="json"))))
    if not rows:
        raise UserError(f"{KEY}={spec}: the environment's taskset has no task")
    return rows


def build_verifiers(source: str | None = None, *, env: str = "", test_size: int = 0) -> dict[str, list[dict]]:
    """`rlkit prep-data verifiers -o env=ID`: the taskset's tasks as rows (the last `test_size` as the test
    split); data_source `verifiers/<env>`."""
    if not env:
        raise UserError("prep-data verifiers: name the environment: -o env=ID (or -o env=path/file.py:fn)")
    tasks = task_rows(load_verifiers_env(PREFIX + env), PREFIX + env)
    rows = [
        {
            "data_source": f"verifiers/{env}",
            "prompt": messages,
            "ability": "verifiers",
            "reward_model": {"style": "verifiers", "ground_truth": data},
            "extra_info": {"index": index},
        }
        for index, (messages, data) in enumerate(tasks)
    ]
    cut = len(rows) - max(0, min(test_size, len(rows)))
    for split, part in (("train", rows[:cut]), ("test", rows[cut:])):
        for row in part:
            row["extra_info"]["split"] = split
    return {"train": rows[:cut], "test": rows[cut:]}


def opening_messages(data: Any, message: Any) -> list[dict[str, Any]]:
    """What opens an exchange of task data `data`: its system prompt, then its prompt (or, for a prompt-less
    task, the environment's first message), as chat message dicts."""
    opening: list[dict[str, Any]] = []
    if data.system_prompt:
        opening.append({"role": "system", "content": data.system_prompt})
    return opening + as_dicts(data.prompt if data.prompt is not None else message)


def as_dicts(messages: Any) -> list[dict[str, Any]]:
    if messages is None:
        return []
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in messages]


class VerifiersEpisode:
    """One episode of a vf.Env, as rlkit's environment protocol (reset/step/truncate): `Env.run` runs as a
    task on the agent loop's event loop and pauses whenever it waits for the policy."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.episode_metrics: dict[str, float] = {}
        self._wants: asyncio.Future | None = None  # the env's messages, waiting for the policy's reply
        self._reply: asyncio.Future | None = None
        self._cut = False  # the loop ended the episode: every later turn is terminated
        self._run: asyncio.Task | None = None
        self.trace: Any = None  # the policy's vf.Trace, scored, once Env.run() and finalize ended

    async def reset(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        vf = _vf()
        task_cls = type(self.env.taskset).task_type()
        try:
            data = task_cls.data_type().model_validate_json(row["ground_truth"])
        except ValueError as exc:
            raise ValueError(
                f"the row's ground truth is not a {task_cls.__name__}'s data as JSON ({exc}); build the data "
                "with `rlkit prep-data verifiers -o env=...`"
            ) from None
        task = task_cls(data, self.env.taskset.config.task)
        self._wants = asyncio.get_running_loop().create_future()
        self._run = asyncio.ensure_future(self._play(vf, task))
        wanted = await self._next()
        if wanted is None:
            raise ValueError(f"{type(self.env).__name__}.run() ended without asking the policy anything")
        return None if wanted == as_dicts(row["prompt"]) else wanted

    async def step(self, action: str) -> tuple[list[dict[str, Any]] | None, float | None, bool]:
        self._answer(action)
        wanted = await self._next()
        if wanted is not None:
            return wanted, None, False
        return None, self._reward(), True

    async def truncate(self, action: str | None) -> float:
        """The loop cut the episode (max_turns or the token limit): the pending turn gets `action` (the cut turn,
        None when step() already had it), every later turn comes back terminated, and the rubric scores it."""
        self._cut = True
        self._answer(action)  # the env's run is waiting for this reply: from here on, it only ends
        await self._next()
        return self._reward()

    def _answer(self, action: str | None) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_result(action)

    async def _next(self) -> list[dict[str, Any]] | None:
        """The env's next messages for the policy, or None once Env.run() has ended (its error raised)."""
        assert self._run is not None and self._wants is not None
        try:
            await asyncio.wait({self._run, self._wants}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the guard's deadline: the episode is abandoned
            self._run.cancel()
            raise
        if self._wants.done():
            wanted, self._wants = self._wants.result(), asyncio.get_running_loop().create_future()
            return wanted
        self._run.result()
        return None

    async def ask(self, messages: list[dict[str, Any]]) -> str | None:
        """Called by the seat: hand `messages` to the policy; its reply, or None when the episode was cut."""
        if self._cut:
            return None
        assert self._wants is not None
        self._reply = asyncio.get_running_loop().create_future()
        self._wants.set_result(messages)
        return await self._reply

    async def _play(self, vf: Any, task: Any) -> None:
        seat = None

        def make(name: str, _config: Any) -> _PolicySeat:
            nonlocal seat
            seat = _PolicySeat(self, vf, name)
            return seat

        agents = vf.Agents(self.env.config, make)
        await self.env.setup(agents)
        await self.env.run(task, agents)
        if seat is None or seat.trace is None:
            raise ValueError(f"{type(self.env).__name__}.run() ran no agent")
        episode = vf.Episode(env=vf.EnvInfo(id=self.env.config.env_id), task=seat.trace.task, traces=[seat.trace])
        await self.env.finalize(task, episode)
        self.trace = seat.trace

    def _reward(self) -> float:
        trace = self.trace
        metrics = {f"verifiers/reward/{k}": r.score for k, r in trace.rewards.items() if r is not None}
        metrics.update({f"verifiers/metric/{k}": v for k, v in trace.metrics.items() if v is not None})
        self.episode_metrics = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        return float(trace.reward)


class _PolicySeat:
    """The seat rlkit's policy plays: the `agents.<name>` that Env.run() sees (run, interaction, trainable)."""

    def __init__(self, episode: VerifiersEpisode, vf: Any, name: str) -> None:
        self.episode, self.vf, self.name = episode, vf, name
        self.trainable = True
        self.trace: Any = None

    async def run(self, task: Any, **_: Any) -> Any:
        """One reply to the task's prompt (verifiers: one harness segment), scored."""
        async with self.interaction(task) as exchange:
            await exchange.turn()
            exchange.trace.stop("agent_completed")
        return exchange.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> AsyncIterator[_Exchange]:
        """A conversation the env drives with turn(message); leaving it scores the trace (Task.score)."""
        if self.trace is not None:
            raise ValueError(
                "the environment opened a second exchange with the policy; rlkit trains one conversation per episode"
            )
        vf = self.vf
        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name=self.name),
        )
        self.trace = trace
        exchange = _Exchange(self.episode, vf, task, trace)
        yield exchange
        trace.stop("user_closed")  # keeps a condition set before (agent_completed, max_turns)
        await task.score(trace)
        trace.is_completed, trace.ok = True, True


class _Exchange:
    """verifiers' Interaction surface over the agent loop: turn(message) -> Segment."""

    def __init__(self, episode: VerifiersEpisode, vf: Any, task: Any, trace: Any) -> None:
        self.episode, self.vf, self.task, self.trace = episode, vf, task, trace
        self.over = False

    async def turn(self, message: Any = None) -> Any:
        vf = self.vf
        if self.over:
            return vf.Segment(messages=[], terminated=True)
        first = not self.trace.nodes
        if first and self.task.data.prompt is not None and message is not None:  # verifiers' own contract
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        new = opening_messages(self.task.data, message) if first else as_dicts(message)
        if not new:
            raise ValueError("turn() needs a message here: the task has no prompt to open the exchange with")
        for item in new:
            self._add(vf.MessageNode(message=_parse(vf, item)))
        reply = await self.episode.ask(new)
        if reply is None:
            self.over = True
            self.trace.stop("max_turns")
            return vf.Segment(messages=[], terminated=True)
        answer = vf.AssistantMessage(content=reply)
        self._add(vf.MessageNode(message=answer, sampled=True))
        return vf.Segment(messages=[answer])

    def _add(self, node: Any) -> None:
        node.parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(node)


def _parse(vf: Any, message: dict[str, Any]) -> Any:
    kinds = {
        "system": vf.SystemMessage,
        "user": vf.UserMessage,
        "assistant": vf.AssistantMessage,
        "tool": vf.ToolMessage,
    }
    return kinds[message["role"]].model_validate(message)
