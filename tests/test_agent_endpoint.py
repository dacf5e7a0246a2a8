"""The agents' OpenAI-compatible endpoint keeps other processes out: a bearer token on every request,
deadlines for sending a request and for waiting on the engine, a cap on the body, loopback only."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from agent_helpers import ScriptedEngine
from transformers import AutoTokenizer

from rlkit.core.agents.loop import Limits
from rlkit.core.agents.openai_server import Conversation, EpisodeServer
from rlkit.core.rollout.base import Sampling

PATH = "/episodes/0/v1/chat/completions"
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "INJECTED"}]}).encode()


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def make_server(tok):
    servers = []

    def make(**kwargs) -> EpisodeServer:
        server = EpisodeServer(tok, Limits(2, 1, 8, 32), **{"wait_s": 5.0, **kwargs})
        server.start([0])
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _request(server: EpisodeServer, method: str, path: str, headers: dict[str, str], body: bytes | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", server.http.server_address[1], timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("WWW-Authenticate"), json.loads(response.read())
    finally:
        connection.close()


def _auth(server: EpisodeServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic cmxraXQ="}])
def test_a_request_without_the_token_is_refused_and_reaches_no_episode(make_server, headers):
    server = make_server()
    refused = {"message": "missing or wrong bearer token: the episode's client carries it as api_key",
               "type": "invalid_api_key"}
    assert _request(server, "POST", PATH, headers, BODY) == (401, "Bearer", {"error": refused})
    assert _request(server, "GET", "/episodes/0/v1/models", headers) == (401, "Bearer", {"error": refused})
    assert server.queue == [] and server.conversations == {0: Conversation()}
    # The token itself, as Bearer: accepted.
    status, _, models = _request(server, "GET", "/episodes/0/v1/models", _auth(server))
    assert status == 200 and models["data"][0]["id"] == "rlkit-policy"


def test_every_run_has_a_token_of_its_own(make_server):
    first, second = make_server(), make_server()
    assert first.token != second.token and len(first.token) >= 43  # 32 random bytes, base64
    assert _request(second, "GET", "/episodes/0/v1/models", _auth(first))[0] == 401


def _closed_after(sock: socket.socket, trickle: bytes) -> float:
    """Send `trickle` a byte every 0.1 s (then nothing) until the server closes; seconds it took."""
    start = time.monotonic()
    sock.settimeout(0.1)
    for index in range(600):
        if index < len(trickle):
            try:
                sock.sendall(trickle[index:index + 1])
            except OSError:
                break
        try:
            if sock.recv(4096) == b"":
                break
        except TimeoutError:
            continue
        except OSError:
            break
    return time.monotonic() - start


def test_slow_clients_are_dropped_at_the_read_deadline_while_a_real_request_completes(make_server, tok):
    server = make_server(read_timeout_s=1.0)
    port = server.http.server_address[1]
    a = tok.convert_tokens_to_ids("a")
    head = f"POST {PATH} HTTP/1.1\r\nAuthorization: Bearer {server.token}\r\n"
    slow = {  # (sent at once, then trickled a byte every 0.1 s)
        "silent": (b"", b""),
        "slowloris": (b"", (head + "X-Slow: 1\r\n" * 10).encode()),
        "half a body": ((head + f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY[:10], b""),
    }
    sockets = {name: socket.create_connection(("127.0.0.1", port)) for name in slow}
    for name, (at_once, _) in slow.items():
        sockets[name].sendall(at_once)
    took: dict[str, float] = {}
    threads = [threading.Thread(target=lambda n=name: took.update({n: _closed_after(sockets[n], slow[n][1])}))
               for name in slow]
    for thread in threads:
        thread.start()
    engine = threading.Thread(target=server.serve, args=(ScriptedEngine(lambda ctx: ([a], False)), Sampling(n=1)))
    engine.start()
    time.sleep(0.3)
    status, _, reply = _request(server, "POST", PATH, _auth(server), BODY)
    assert status == 200 and reply["choices"][0]["message"]["content"] == "a"
    server.finish(0)
    engine.join(timeout=10)
    for thread in threads:
        thread.join(timeout=15)
    assert set(took) == set(slow)
    # The deadline counts from the server's accept, a moment before each client thread starts its clock
    # (measured 0.9994 s for the silent one on a busy machine): 0.9 s, not 1.0, is the lower bound.
    assert all(0.9 <= seconds < 3.5 for seconds in took.values()), took
    assert server.conversations[0].turns == 1  # the real request only
    for sock in sockets.values():
        sock.close()


def test_a_body_over_the_cap_gets_413_without_being_read(make_server):
    server = make_server(max_body_bytes=1000, read_timeout_s=30.0)
    with socket.create_connection(("127.0.0.1", server.http.server_address[1]), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nAuthorization: Bearer {server.token}\r\n"
                     f"Content-Length: 1000000000\r\n\r\n".encode() + b"{" * 4096)
        response = sock.makefile("rb").read()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in head
    assert json.loads(body) == {"error": {"message": "a request body of 1000000000 bytes is over the endpoint's cap "
                                                     "of 1000", "type": "invalid_request"}}
    assert time.monotonic() - start < 5  # answered at once, not after reading a gigabyte or its deadline
    assert server.queue == [] and server.conversations == {0: Conversation()}


def test_a_request_waits_for_the_engine_at_most_wait_s(make_server):
    server = make_server(wait_s=0.3)  # nothing serves: the engine never answers
    status, _, reply = _request(server, "POST", PATH, _auth(server), BODY)
    assert (status, reply["error"]["message"]) == (504, "no reply within 0.3 s (rollout.agent.max_turns x "
                                                        "call_timeout_s)")
    assert server.queue == []


def test_the_endpoint_listens_on_loopback_only(make_server):
    server = make_server()
    host, port = server.http.socket.getsockname()
    assert host == "127.0.0.1" and server.base_url(3) == f"http://127.0.0.1:{port}/episodes/3/v1"
