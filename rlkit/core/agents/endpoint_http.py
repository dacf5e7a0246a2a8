"""The HTTP side of the episodes' endpoint (rlkit.core.agents.openai_server): a threaded server whose
connections get a deadline for sending each request, so a client that sends nothing, or trickles a
request byte by byte, holds a thread for READ_TIMEOUT_S at most."""

from __future__ import annotations

import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ReadDeadlines:
    """Connections that are sending a request: each has `seconds` from its start (or the end of its last
    reply) until its body is read; past that its socket is shut down, which ends the handler's read."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.due: dict[socket.socket, float] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        threading.Thread(target=self._watch, name="rlkit-endpoint-deadlines", daemon=True).start()

    def start(self, connection: socket.socket) -> None:
        with self.lock:
            self.due[connection] = time.monotonic() + self.seconds

    def stop(self, connection: socket.socket) -> None:
        with self.lock:
            self.due.pop(connection, None)

    def close(self) -> None:
        self.closed.set()

    def _watch(self) -> None:
        while not self.closed.wait(min(0.25, self.seconds / 4)):
            now = time.monotonic()
            with self.lock:
                late = [connection for connection, due in self.due.items() if due <= now]
                for connection in late:
                    del self.due[connection]
            for connection in late:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:  # closed meanwhile
                    pass


class EndpointServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096  # every episode of a worker connects at once (the default 5 refuses them)

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], deadlines: ReadDeadlines
    ) -> None:
        self.deadlines = deadlines
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke or was cut at its deadline is the client's business, not a traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)
