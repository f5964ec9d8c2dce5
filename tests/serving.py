"""What the suite's servers share: a request handler for fakes that speaks HTTP/1.1 and keeps
the test output clean, a context manager that serves one on a daemon thread, and the stop of a
real server run as a subprocess."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from socketserver import BaseServer
from typing import Any, TypeVar

S = TypeVar("S", bound=BaseServer)


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # the request log would drown pytest's output

    def send_body(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        """Answer ``code`` with ``body`` (its Content-Length set) and ``headers``."""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def serving(server: S) -> Iterator[S]:
    """``server`` answering on a daemon thread for the block; shut down and closed after, its
    thread joined (10 s at most)."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def terminate(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM ``proc`` and wait ``grace_s`` for it; past that, kill it (and wait 10 s)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
