"""A real HTTP server in a thread that plays good and broken Triton /metrics endpoints.

Paths: /ok (a valid Triton payload), /slow (answers after 30 s), /garbage (not Prometheus
text), /endless (a body that never ends), /status/<code>, /big (a body past the limit once
decompressed, served gzip).  A port nobody listens on plays a target that is down.
"""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

import pytest

from tests.serving import QuietHandler, serving

OK_BODY = (
    "# HELP nv_inference_count Number of inferences performed\n"
    "# TYPE nv_inference_count counter\n"
    'nv_inference_count{model="m",version="1"} 10\n'
    "# HELP nv_inference_exec_count Number of model executions performed\n"
    "# TYPE nv_inference_exec_count counter\n"
    'nv_inference_exec_count{model="m",version="1"} 5\n'
)


class _Handler(QuietHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.hits.append((self.path, time.monotonic()))
        path = self.path
        try:
            if path == "/ok":
                self.send_body(200, self.server.ok_body.encode())
            elif path == "/slow":
                time.sleep(30)
                self.send_body(200, OK_BODY.encode())
            elif path == "/garbage":
                self.send_body(
                    200, b'nv_inference_count{model="m" 12 this is not prometheus\n{{{\n')
            elif path == "/endless":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b'x{a="b"} 1\n' * 1000
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    time.sleep(0.01)
            elif path == "/big":
                body = gzip.compress(b"# " + b"a" * (8 << 20) + b"\n")
                self.send_body(200, body, {"Content-Encoding": "gzip"})
            elif path.startswith("/status/"):
                self.send_body(int(path.rsplit("/", 1)[1]), b"nope")
            elif path == "/headers":
                auth = self.headers.get("Authorization", "")
                code = 200 if auth == "Bearer s3cr3t-token-value" else 401
                self.send_body(code, OK_BODY.encode())
            else:
                self.send_body(404, b"not found")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up on us, as it should


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hits: list[tuple[str, float]]
    ok_body: str


class FakeTargets:
    def __init__(self, server: _Server) -> None:
        self.server = server
        host, port = server.server_address[:2]
        self.base = f"http://{host!s}:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    @property
    def hits(self) -> list[tuple[str, float]]:
        return self.server.hits


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_fake_targets(ok_body: str = OK_BODY) -> Iterator[FakeTargets]:
    """The fake targets on a free port, answering ``/ok`` with ``ok_body``."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.hits = []
    server.ok_body = ok_body
    with serving(server):
        yield FakeTargets(server)


@pytest.fixture
def fake_targets() -> Iterator[FakeTargets]:
    with serve_fake_targets() as targets:
        yield targets


@pytest.fixture
def down_url() -> str:
    """A URL on a port where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/metrics"


#: What :func:`keepalive_server` answers every GET with.
KEEPALIVE_BODY = b"# TYPE up gauge\nup 1\n"


@contextmanager
def keepalive_server(
    idle_timeout: float | None = None,
) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """A keep-alive HTTP/1.1 server on 127.0.0.1: its base URL, and the (path, client port) of
    each request, in order (a new port is a new connection).  With ``idle_timeout`` it closes a
    connection idle that long, as some exporters do."""
    seen: list[tuple[str, int]] = []

    class Handler(QuietHandler):
        timeout = idle_timeout

        def do_GET(self) -> None:
            seen.append((self.path, self.client_address[1]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(KEEPALIVE_BODY)))
            self.end_headers()
            self.wfile.write(KEEPALIVE_BODY)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with serving(server):
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
