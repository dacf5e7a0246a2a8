"""OpenEnv environments (PyPI `openenv-core`) as rlkit environments: rollout.agent.loop=openenv:<env>.

<env> is an OpenEnv `Environment` subclass run in the worker's process ('path/file.py:ClassName' or
'package.module:ClassName', built with rollout.agent.env_kwargs), or the base URL of a running OpenEnv
server (http://, https://, ws://, wss://; one WebSocket session per episode through openenv's
`GenericEnvClient`). Either way an episode sees the same dicts, those openenv's server puts on the wire:
an action is the Action's fields, an observation the Observation's fields without done, reward and metadata.

The adapter turns text into those dicts and back (rollout.agent.openenv_adapter, a class of yours
defining any of these; rlkit's defaults for the others):
  reset_kwargs(row) -> dict          reset()'s keyword arguments; default {"seed": row["index"]}, so the
                                     rollout.n episodes of a row play the same task (a GRPO group)
  action(text, row) -> dict          the policy's turn as the Action's fields; default: the text in the
                                     Action's one required string field
  observation(fields, row) -> str | message(s) | None
                                     the next user turn; default: the Observation's one string field,
                                     else its fields as JSON. After reset, None keeps the row's prompt.
Each episode is then an rlkit environment (rlkit.core.agents.envs) run by the token-exact AgentLoop: the
episode's reward is the sum of step()'s rewards (reset's is not the policy's doing and is not counted).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import queue
import threading
import typing
import urllib.error
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from rlkit.errors import UserError

PREFIX = "openenv:"
KEY = "rollout.agent.loop"
ADAPTER_KEY = "rollout.agent.openenv_adapter"
HOOKS = ("reset_kwargs", "action", "observation")
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
_SCHEMA_TIMEOUT_S = 10.0


def is_openenv(loop: Any) -> bool:
    """Whether rollout.agent.loop names an OpenEnv environment (an object from the Python API never does)."""
    return isinstance(loop, str) and loop.startswith(PREFIX)


def _openenv() -> Any:
    """openenv.core, or a UserError saying how to install it (its client and server need only part of its
    declared dependencies: the Makefile's install line)."""
    try:
        return importlib.import_module("openenv.core")
    except ImportError as exc:
        raise UserError(
            f"{KEY}=openenv:...: the openenv-core package cannot be imported ({exc}); install openenv-core==0.3.0 "
            "as the Makefile does (`make venv`)"
        ) from None


@dataclass
class Target:
    """What rollout.agent.loop=openenv:<env> names, resolved: a local class or a server URL, and its actions'
    JSON schema."""

    spec: str
    action_schema: dict[str, Any]
    env_cls: type | None = None  # in-process
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    action_cls: type | None = None
    url: str | None = None  # a running server

    @property
    def where(self) -> str:
        return f"{KEY}={PREFIX}{self.spec}"


def resolve(spec: str, env_kwargs: dict[str, Any]) -> Target:
    """The environment `spec` names, checked; a UserError naming rollout.agent.loop otherwise."""
    where = f"{KEY}={PREFIX}{spec}"
    if not spec:
        raise UserError(
            f"{where}: name an OpenEnv environment: path/file.py:ClassName, package.module:ClassName "
            "or a server's URL (http://host:port)"
        )
    if spec.startswith(_URL_SCHEMES):
        if env_kwargs:
            raise UserError(f"rollout.agent.env_kwargs={env_kwargs} are not used by a server ({where}): drop them")
        return Target(spec, _server_action_schema(spec, where), url=spec.rstrip("/"))
    cls = _load_class(spec, where)
    try:
        inspect.signature(cls).bind(**env_kwargs)
    except TypeError as exc:
        raise UserError(
            f"rollout.agent.env_kwargs={env_kwargs} do not fit {cls.__name__}{inspect.signature(cls)}: {exc}"
        ) from None
    action_cls = _action_class(cls, where)
    return Target(spec, action_cls.model_json_schema(), env_cls=cls, env_kwargs=env_kwargs, action_cls=action_cls)


def _load_class(spec: str, where: str) -> type:
    from rlkit.core.rewards.custom import load_function

    module_text, _, name = spec.rpartition(":")
    if module_text.endswith(".py") or "/" in module_text:
        cls = load_function(spec, where)
    else:
        if not module_text or not name.isidentifier():
            raise UserError(f"{where}: write path/file.py:ClassName, package.module:ClassName or a URL")
        try:
            module = importlib.import_module(module_text)
        except Exception as exc:  # noqa: BLE001 - the user's module: any failure to import it is theirs to fix
            raise UserError(f"{where}: cannot import {module_text} ({type(exc).__name__}: {exc})") from None
        cls = getattr(module, name, None)
    environment = _openenv().Environment
    if not (inspect.isclass(cls) and issubclass(cls, environment)):
        raise UserError(f"{where}: {name!r} is not a subclass of openenv's Environment")
    if inspect.isabstract(cls):
        raise UserError(f"{where}: {cls.__name__} leaves {sorted(cls.__abstractmethods__)} abstract")
    return cls


def _action_class(cls: type, where: str) -> type:
    """The Action subclass cls.step takes: its annotation, else the class's Environment[Action, ...] argument."""
    action_base = _openenv().Action
    candidates: list[Any] = []
    try:
        candidates.append(typing.get_type_hints(cls.step).get("action"))
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: try the generic arguments
        pass
    for base in getattr(cls, "__orig_bases__", ()):
        candidates += list(typing.get_args(base))[:1]
    for candidate in candidates:
        if inspect.isclass(candidate) and issubclass(candidate, action_base) and candidate is not action_base:
            return candidate
    raise UserError(
        f"{where}: cannot tell which Action {cls.__name__}.step takes; annotate it as "
        f"def step(self, action: MyAction, ...) with MyAction a subclass of openenv's Action"
    )


def _server_action_schema(url: str, where: str) -> dict[str, Any]:
    """The server's action JSON schema (GET /schema), or a UserError saying the server does not answer."""
    http = "http" + url[2:] if url.startswith("ws") else url
    try:
        with urllib.request.urlopen(f"{http.rstrip('/')}/schema", timeout=_SCHEMA_TIMEOUT_S) as response:
            return json.loads(response.read())["action"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise UserError(
            f"{where}: no OpenEnv server answers at {url} (GET /schema: {exc}); start the server first "
            "(e.g. `uvicorn my_env.server.app:app --port 8000`) or fix the URL"
        ) from None


def text_field(action_schema: dict[str, Any]) -> str | None:
    """The one field of an Action that the policy's text can fill (the one required string field, or the one
    string field where none is required and nothing else is); None where there is no such single field."""
    properties = {k: v for k, v in action_schema.get("properties", {}).items() if k != "metadata"}
    required = [k for k in action_schema.get("required", []) if k != "metadata"]
    strings = [k for k, v in properties.items() if v.get("type") == "string"]
    if any(k not in strings for k in required):
        return None
    candidates = [k for k in strings if k in required] or strings
    return candidates[0] if len(candidates) == 1 else None


def load_adapter(spec: str | None) -> Any:
    """An instance of the user's adapter class (None: rlkit's defaults), checked to define at least one hook,
    each callable with its arguments."""
    if spec is None:
        return None
    from rlkit.core.rewards.custom import load_function

    cls = load_function(spec, ADAPTER_KEY)
    if not inspect.isclass(cls):
        raise UserError(f"{ADAPTER_KEY}={spec!r} names a function; name a class defining any of {', '.join(HOOKS)}")
    arguments = {"reset_kwargs": ("row",), "action": ("text", "row"), "observation": ("fields", "row")}
    defined = [hook for hook in HOOKS if callable(getattr(cls, hook, None))]
    if not defined:
        raise UserError(f"{ADAPTER_KEY}={spec!r}: {cls.__name__} defines none of {', '.join(HOOKS)}")
    for hook in defined:
        try:
            inspect.signature(getattr(cls, hook)).bind(None, *arguments[hook])
        except TypeError:
            raise UserError(
                f"{ADAPTER_KEY}={spec!r}: define it as def {hook}(self, {', '.join(arguments[hook])})"
            ) from None
    try:
        return cls()
    except Exception as exc:  # noqa: BLE001 - the user's constructor: any failure is theirs to fix
        raise UserError(f"{ADAPTER_KEY}={spec!r}: {cls.__name__}() failed: {type(exc).__name__}: {exc}") from None


class Adapter:
    """The user's hooks where defined, rlkit's defaults elsewhere."""

    def __init__(self, target: Target, user: Any) -> None:
        self.user = user
        self.field = None
        if not callable(getattr(user, "action", None)):
            self.field = text_field(target.action_schema)
            if self.field is None:
                fields = {k: v.get("type", "?") for k, v in target.action_schema.get("properties", {}).items()}
                raise UserError(
                    f"{target.where}: its action {target.action_schema.get('title', 'Action')} has fields "
                    f"{fields}, not one required string field for the policy's text; write "
                    f"{ADAPTER_KEY}=path/file.py:MyAdapter with action(self, text, row) -> dict (docs/agents.md)"
                )

    def reset_kwargs(self, row: dict[str, Any]) -> dict[str, Any]:
        if callable(getattr(self.user, "reset_kwargs", None)):
            return self.user.reset_kwargs(row)
        return {"seed": row["index"]}

    def action(self, text: str, row: dict[str, Any]) -> dict[str, Any]:
        if self.field is None:
            return self.user.action(text, row)
        return {self.field: text}

    def observation(self, fields: dict[str, Any], row: dict[str, Any]) -> Any:
        if callable(getattr(self.user, "observation", None)):
            return self.user.observation(fields, row)
        texts = [v for v in fields.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(fields, default=str)

    def step_result(self, fields: dict[str, Any], reward: Any, done: bool, row: dict[str, Any]) -> tuple:
        """(observation, reward, done) as rlkit's environment contract has it; the observation is only
        asked of the adapter while the episode goes on."""
        return (None if done else self.observation(fields, row)), reward, done


def _accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `fn` takes, as openenv's server passes them to reset()."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return kwargs
    names = {p.name for p in parameters}
    return {k: v for k, v in kwargs.items() if k in names}


class LocalEpisode:
    """One episode on an environment object in this process. Its calls (the constructor's too) run on one thread
    of its own, as openenv's server runs a session's, so an environment may keep thread-bound resources (one
    thread for every episode where the class sets REQUIRES_SINGLE_THREAD_EXECUTOR, as the server does); the
    adapter's hooks run there too, off the guard's event loop. A hung call holds up its episode's thread only."""

    def __init__(self, target: Target, adapter: Adapter, shared: CallThread | None) -> None:
        self.adapter, self.action_cls, self.shared = adapter, target.action_cls, shared
        self.thread = shared or CallThread()
        self.env = self.thread.submit(lambda: target.env_cls(**target.env_kwargs)).result()
        self.row: dict[str, Any] = {}

    async def reset(self, row: dict[str, Any]) -> Any:
        self.row = row
        return await self._on_thread(self._reset)

    async def step(self, text: str) -> tuple:
        return await self._on_thread(self._step, text)

    async def close(self) -> None:
        try:
            await self._on_thread(self.env.close)
        finally:
            if self.shared is None:
                self.thread.stop()

    def _reset(self) -> Any:
        observation = self.env.reset(**_accepted(self.env.reset, self.adapter.reset_kwargs(self.row)))
        return self.adapter.observation(_wire(observation)["observation"], self.row)

    def _step(self, text: str) -> tuple:
        from openenv.core.env_server.serialization import deserialize_action

        result = _wire(self.env.step(deserialize_action(self.adapter.action(text, self.row), self.action_cls)))
        return self.adapter.step_result(result["observation"], result["reward"], result["done"], self.row)

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self.thread.submit(fn, *args))


class CallThread:
    """One daemon thread that runs the calls submitted to it in order. Daemon: a call that never returns keeps
    its thread but never keeps the process from exiting (a ThreadPoolExecutor's thread would)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="rlkit-openenv", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - the caller's outcome, whatever the environment raised
                future.set_exception(exc)


def _wire(observation: Any) -> dict[str, Any]:
    """An Observation as openenv's server sends it: {"observation": its fields, "reward", "done"}."""
    from openenv.core.env_server.serialization import serialize_observation

    return serialize_observation(observation)


class RemoteEpisode:
    """One episode in a WebSocket session of a running server (the server makes its environment)."""

    def __init__(self, target: Target, adapter: Adapter, timeout_s: float) -> None:
        self.url, self.adapter, self.timeout_s = target.url or "", adapter, timeout_s
        self.client: Any = None
        self.row: dict[str, Any] = {}

    async def reset(self, row: dict[str, Any]) -> Any:
        from openenv.core.generic_client import GenericEnvClient

        self.row = row
        self.client = GenericEnvClient(self.url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s)
        try:
            await self.client.connect()
        except ConnectionError as exc:
            raise ConnectionError(f"the OpenEnv server at {self.url} is unreachable: {exc}") from None
        result = await self._call(self.client.reset(**self.adapter.reset_kwargs(row)))
        return self.adapter.observation(result.observation, row)

    async def step(self, text: str) -> tuple:
        result = await self._call(self.client.step(self.adapter.action(text, self.row)))
        return self.adapter.step_result(result.observation, result.reward, result.done, self.row)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def _call(self, request: Any) -> Any:
        """The request's result; its failure as the server explained it, with the fix where it is capacity."""
        from websockets.exceptions import ConnectionClosed

        try:
            return await request
        except ConnectionClosed as exc:  # the server may have sent why before closing: a session it refused
            problem = await self._last_word() or f"the server closed the session ({exc})"
        except RuntimeError as exc:  # the client's "Server error: ... (code: ...)"
            problem = str(exc)
        if "CAPACITY_REACHED" in problem:
            problem += (
                f": the server at {self.url} allows fewer sessions than a rollout worker runs episodes at once; "
                "start it with a larger max_concurrent_envs (create_app(..., max_concurrent_envs=N))"
            )
        raise RuntimeError(problem)

    async def _last_word(self) -> str | None:
        """The error message the server sent before it closed, still buffered in the connection (openenv's
        client reads replies only after a send, which the closed connection refused)."""
        try:
            data = json.loads(await asyncio.wait_for(self.client._ws.recv(), timeout=1.0)).get("data", {})
            return f"Server error: {data['message']} (code: {data['code']})"
        except Exception:  # noqa: BLE001 - nothing readable was left: the caller says the session closed
            return None


def episode_factory(loop: str, env_kwargs: dict[str, Any], adapter_spec: str | None, timeout_s: float) -> Callable:
    """make_env for the AgentLoop: a fresh episode object per episode (rollout.agent.loop=openenv:<env>)."""
    target = resolve(loop[len(PREFIX) :], env_kwargs)
    adapter = Adapter(target, load_adapter(adapter_spec))
    if target.url is not None:
        return lambda: RemoteEpisode(target, adapter, timeout_s)
    single_thread = getattr(target.env_cls, "REQUIRES_SINGLE_THREAD_EXECUTOR", False)
    shared = CallThread() if single_thread else None
    return lambda: LocalEpisode(target, adapter, shared)


def check_openenv(agent: Any) -> None:
    """rollout.agent for loop=openenv:<env>, checked before any worker starts (AgentConfig `agent`): the keys it
    does not use, the environment or server, the adapter and the default action's field."""
    if agent.env or agent.tools:
        raise UserError(
            f"rollout.agent.env and rollout.agent.tools are not used by {KEY}={agent.loop} (the OpenEnv environment "
            "answers every turn); drop them"
        )
    target = resolve(agent.loop[len(PREFIX) :], agent.env_kwargs)
    Adapter(target, load_adapter(agent.openenv_adapter))
