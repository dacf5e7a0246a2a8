"""An OpenAI-compatible endpoint on the rollout worker, for agents written against the `openai` client.

Each episode's client talks to `http://127.0.0.1:PORT/episodes/<id>/v1` (loopback only), with
the server's bearer token as its api_key: a request without it gets 401 and is never read further
(another process of the machine could otherwise write into an episode's prompt). A connection has
READ_TIMEOUT_S for each request's line, headers and body, however slowly it trickles them; a body
past MAX_BODY_BYTES gets 413 unread; a request waits for the engine at most `wait_s`. A
request's messages become token ids without re-encoding what the policy wrote: when they
continue the episode's conversation (the earlier messages plus the reply this server gave,
then new messages), the prompt is the earlier ids + the reply's ids as sampled + the new
messages' ids cut from the chat template (rlkit.core.agents.chat). A request that does not
continue it starts the episode's conversation over (the earlier one is dropped from training,
counted in `restarts`).

Requests wait in a queue; the worker's thread (the one that owns the engine) generates every
waiting request in one engine call once every running episode is waiting, or once no request
has come for `batch_wait_s` (the other episodes are busy with their own work). Sampling is the
run's (rollout.temperature, ...), whatever the request asks; `max_tokens` is honoured up to
rollout.agent.max_tokens_per_turn. Samples are seeded by their place in the call (in episode
order), so a run repeats exactly when the agent code is deterministic and each turn's requests
come without a `batch_wait_s` pause.
An episode sends one request at a time (its conversation is one sequence).
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from rlkit.core.agents.chat import TurnBoundary
from rlkit.core.agents.endpoint_http import EndpointServer, ReadDeadlines
from rlkit.core.agents.tools import ToolCall, parse_tool_calls

_PATH = re.compile(r"^/episodes/(\d+)/v1/(chat/completions|models)$")
MODEL_NAME = "rlkit-policy"
# For a request's line, headers and body (a loopback client sends them in milliseconds), and for an idle
# keep-alive connection: longer than httpx's 5 s keep-alive expiry, so the openai client drops an idle
# connection before the server does (and never sends into one being closed).
READ_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 32 << 20  # a conversation of 100k tokens is ~1 MiB of JSON


@dataclass
class Conversation:
    """One episode's token-exact record: what a Trajectory is built from."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # normalized, the last reply included
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    last_turn: list[int] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    turns: int = 0
    restarts: int = 0
    truncated: bool = False


@dataclass
class Request:
    episode: int
    body: dict[str, Any]
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    context: list[int] = field(default_factory=list)
    max_tokens: int = 0
    reply: dict[str, Any] | None = None


def normalize(message: dict[str, Any]) -> dict[str, Any]:
    """What identifies a message, whatever optional fields a client adds (ids, None values)."""
    calls = [
        (c["function"]["name"], json.dumps(json.loads(c["function"]["arguments"] or "{}"), sort_keys=True))
        for c in message.get("tool_calls") or []
    ]
    return {"role": message.get("role"), "content": message.get("content") or "", "tool_calls": calls}


class EpisodeServer:
    """Serves chat completions for a worker's episodes from its engine, turn-batched."""

    def __init__(
        self,
        tokenizer: Any,
        limits: Any,
        *,
        wait_s: float,
        batch_wait_s: float = 0.2,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        """wait_s: how long a request waits for its reply (an episode's whole time is the natural bound)."""
        self.tokenizer, self.limits, self.batch_wait_s, self.wait_s = tokenizer, limits, batch_wait_s, wait_s
        self.token = secrets.token_urlsafe(32)  # the episodes' clients send it as their api_key
        self.conversations: dict[int, Conversation] = {}
        self.running: set[int] = set()
        self.queue: list[Request] = []
        self.lock = threading.Condition()
        self.http = EndpointServer(("127.0.0.1", 0), _handler(self, max_body_bytes), ReadDeadlines(read_timeout_s))
        threading.Thread(target=self.http.serve_forever, name="rlkit-openai-endpoint", daemon=True).start()

    def base_url(self, episode: int) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/episodes/{episode}/v1"

    def start(self, episodes: list[int]) -> None:
        with self.lock:
            self.conversations = {e: Conversation() for e in episodes}
            self.running = set(episodes)

    def finish(self, episode: int) -> None:
        """The episode's agent function returned (or failed): stop waiting for it."""
        with self.lock:
            self.running.discard(episode)
            self.lock.notify_all()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.http.deadlines.close()

    # -- the engine's side (the worker's thread) ------------------------------------
    def serve(self, engine: Any, sampling: Any, seed_stride: int = 1_000_003) -> None:
        """Generate for waiting requests, turn after turn, until every episode has finished."""
        from dataclasses import replace

        turn = 0
        while True:
            with self.lock:
                while self.running and not self._ready():
                    self.lock.wait(timeout=self._wait_left())
                if not self.running and not self.queue:
                    return
                batch, self.queue = sorted(self.queue, key=lambda r: r.episode), []  # seeds follow episodes
            if not batch:
                continue
            turn_sampling = replace(
                sampling, n=1, max_tokens=max(r.max_tokens for r in batch), seed=sampling.seed + turn * seed_stride
            )
            samples = engine.generate([r.context for r in batch], turn_sampling, [r.max_tokens for r in batch])
            with self.lock:
                for request, sample in zip(batch, samples):
                    self._answer(request, sample, sampling.log_probs)
            turn += 1

    def _ready(self) -> bool:
        """Every running episode waits, or no request came for batch_wait_s (the others are busy)."""
        if not self.queue:
            return False
        newest = max(r.arrived for r in self.queue)
        return {r.episode for r in self.queue} >= self.running or time.monotonic() - newest >= self.batch_wait_s

    def _wait_left(self) -> float | None:
        if not self.queue:
            return None
        return max(0.0, self.batch_wait_s - (time.monotonic() - max(r.arrived for r in self.queue)))

    def _answer(self, request: Request, sample: Any, with_log_probs: bool) -> None:
        conversation = self.conversations[request.episode]
        tokens = sample.token_ids[: request.max_tokens]
        conversation.response_ids += tokens
        conversation.loss_mask += [1] * len(tokens)
        conversation.log_probs += sample.log_probs[: len(tokens)] if with_log_probs else [0.0] * len(tokens)
        conversation.last_turn, conversation.turns = tokens, conversation.turns + 1
        cut = len(sample.token_ids) > request.max_tokens or not sample.finished
        if len(conversation.response_ids) >= self.limits.max_response_tokens and cut:
            conversation.truncated = True
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        message = _assistant_message(text)
        conversation.messages = [normalize(m) for m in request.body["messages"]] + [normalize(message)]
        request.reply = _completion(
            request.episode,
            conversation.turns,
            message,
            len(request.context),
            len(tokens),
            "length" if cut else ("tool_calls" if message.get("tool_calls") else "stop"),
        )
        request.done.set()

    # -- the client's side (HTTP threads) -------------------------------------------
    def complete(self, episode: int, body: dict[str, Any]) -> dict[str, Any]:
        """A chat completion for `body` (blocks until the engine answered)."""
        request = Request(episode, body)
        with self.lock:
            if episode not in self.running:
                raise ValueError(f"episode {episode} is over (its agent function returned or timed out)")
            if self.conversations[episode].turns >= self.limits.max_turns:  # out of turns: an empty, cut reply
                return self._refuse(episode, 0)
            context = self._context(episode, body)
            conversation = self.conversations[episode]
            room = self.limits.max_response_tokens - len(conversation.response_ids)
            per_turn = self.limits.max_tokens_per_turn
            asked = body.get("max_completion_tokens") or body.get("max_tokens") or per_turn
            request.context, request.max_tokens = context, min(int(asked), per_turn, room)
            if request.max_tokens <= 0:  # out of tokens
                return self._refuse(episode, len(context))
            self.queue.append(request)
            self.lock.notify_all()
        if not request.done.wait(self.wait_s):
            with self.lock:  # not generated: it leaves the queue (one already generating is answered unseen)
                self.queue = [r for r in self.queue if r is not request]
            raise TimeoutError(f"no reply within {self.wait_s:g} s (rollout.agent.max_turns x call_timeout_s)")
        return request.reply  # type: ignore[return-value]  (set by _answer)

    def _refuse(self, episode: int, prompt_tokens: int) -> dict[str, Any]:
        """The episode reached rollout.agent.max_turns or data.max_response_length: it is truncated there."""
        conversation = self.conversations[episode]
        conversation.truncated = True
        empty = {"role": "assistant", "content": ""}
        return _completion(episode, conversation.turns, empty, prompt_tokens, 0, "length")

    def _context(self, episode: int, body: dict[str, Any]) -> list[int]:
        """Prompt ids for the request; continues the conversation token by token where it can."""
        conversation, messages = self.conversations[episode], list(body["messages"])
        known = len(conversation.messages)
        if conversation.messages and [normalize(m) for m in messages[:known]] == conversation.messages:
            boundary = TurnBoundary(self.tokenizer, conversation.tools)
            delta = boundary.after_turn(conversation.last_turn, messages[known:])
            delta = delta[: self.limits.max_response_tokens - len(conversation.response_ids)]
            conversation.response_ids += delta
            conversation.loss_mask += [0] * len(delta)
            conversation.log_probs += [0.0] * len(delta)
            return conversation.prompt_ids + conversation.response_ids
        tools = body.get("tools") or None
        fresh = Conversation(
            tools=tools, turns=conversation.turns, restarts=conversation.restarts + bool(conversation.messages)
        )
        fresh.prompt_ids = TurnBoundary(self.tokenizer, tools).render_prompt(messages)
        if len(fresh.prompt_ids) > self.limits.max_prompt_tokens:
            raise ValueError(
                f"the messages make a prompt of {len(fresh.prompt_ids)} tokens > data.max_prompt_length="
                f"{self.limits.max_prompt_tokens}"
            )
        self.conversations[episode] = fresh
        return list(fresh.prompt_ids)


def _assistant_message(text: str) -> dict[str, Any]:
    """The reply in OpenAI's shape: Hermes tool calls become `tool_calls`, the rest is `content`."""
    calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)]
    if not calls:
        return {"role": "assistant", "content": text}
    content = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).strip()
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(calls)
        ],
    }


def _completion(
    episode: int, turn: int, message: dict[str, Any], prompt_tokens: int, completion_tokens: int, finish_reason: str
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{episode}-{turn}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


def _handler(episodes: EpisodeServer, max_body_bytes: int) -> type[BaseHTTPRequestHandler]:
    expected = f"Bearer {episodes.token}".encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: an episode's requests reuse its connection

        def setup(self) -> None:
            super().setup()
            self.server.deadlines.start(self.connection)

        def finish(self) -> None:
            self.server.deadlines.stop(self.connection)
            super().finish()

        def do_GET(self) -> None:  # noqa: N802 - the http.server interface
            if not self._authorized():
                return
            self.server.deadlines.stop(self.connection)  # nothing more to read
            match = _PATH.match(self.path)
            if not match or match.group(2) != "models":
                return self._send(404, _error(f"no such path {self.path}", "not_found"))
            self._send(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "rlkit"}]})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorized() or (data := self._body()) is None:
                return
            match = _PATH.match(self.path)
            if not match or match.group(2) != "chat/completions" or int(match.group(1)) not in episodes.conversations:
                return self._send(404, _error(f"no such path {self.path}", "not_found"))
            try:
                reply = episodes.complete(int(match.group(1)), json.loads(data))
            except TimeoutError as exc:
                return self._send(504, _error(str(exc), "timeout"))
            except Exception as exc:  # noqa: BLE001 - a bad request is the client's error, never the worker's
                return self._send(400, _error(f"{type(exc).__name__}: {exc}", "invalid_request"))
            self._send(200, reply)

        def _authorized(self) -> bool:
            """The server's token, compared in constant time; without it nothing more is read."""
            if hmac.compare_digest(self.headers.get("Authorization", "").encode("latin-1"), expected):
                return True
            self._refuse(
                401,
                _error("missing or wrong bearer token: the episode's client carries it as api_key", "invalid_api_key"),
            )
            return False

        def _body(self) -> bytes | None:
            """The request's body; None once a refusal went out, or when the client stopped sending."""
            length = self.headers.get("Content-Length", "")
            if not length.isdigit():
                self._refuse(411, _error("a chat completion request needs a Content-Length", "invalid_request"))
                return None
            if int(length) > max_body_bytes:
                self._refuse(
                    413,
                    _error(
                        f"a request body of {length} bytes is over the endpoint's cap of {max_body_bytes}",
                        "invalid_request",
                    ),
                )
                return None
            data = self.rfile.read(int(length))
            self.server.deadlines.stop(self.connection)
            if len(data) < int(length):  # cut at its read deadline, or the client went away
                self.close_connection = True
                return None
            return data

        def _refuse(self, status: int, payload: dict[str, Any]) -> None:
            """Answer without reading the body, then close (the unread bytes must not become a request)."""
            self.close_connection = True
            self._send(status, payload)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            if not self.close_connection:
                self.server.deadlines.start(self.connection)  # the next request's time starts now

        def log_message(self, *args: Any) -> None:  # requests are not worth a log line each
            pass

    return Handler
