"""FAKE OpenAI-compatible streaming server for tests (no real LLM server runs on these machines).

``FakeOpenAIServer`` answers ``POST /v1/chat/completions`` and ``POST /v1/completions`` with
``stream: true`` as vLLM / Triton's OpenAI frontend do: a role-only first chunk (chat), one SSE
chunk per token after ``ttft_ms`` then every ``itl_ms``, a final chunk with ``finish_reason``
and ``data: [DONE]``, over a kept-alive HTTP/1.1 connection with chunked encoding.  It records
when it sent each token (``time.monotonic_ns()``) in ``sent``.

The model name picks a behaviour: ``fake-llm`` (normal), ``fake-empty`` (no tokens, then
[DONE]), ``fake-truncate`` (two tokens, then the connection is closed), ``fake-error``
(HTTP 500 with an OpenAI error body), ``fake-stream-error`` (two tokens, then an error event).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from tests.serving import QuietHandler


class _Handler(QuietHandler):
    server: FakeOpenAIServer

    def setup(self) -> None:
        super().setup()
        # Small SSE writes must leave at once (as real servers do), not wait on Nagle.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, payload: object) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self._chunk(f"data: {text}\n\n".encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._plain(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        model = str(body.get("model", ""))
        if model == "fake-error":
            self._plain(500, {"error": {"message": "fake: model crashed", "code": 500}})
            return
        n = int(body.get("max_tokens") or 16)
        srv = self.server
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "cmpl-fake", "model": model, "created": int(time.time())}
        if chat:
            self._event({**base, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if model == "fake-empty":
            n = 0
        time.sleep(srv.ttft_ms / 1000)
        for i in range(n):
            if i:
                time.sleep(srv.itl_ms / 1000)
            if model in ("fake-truncate", "fake-stream-error") and i == 2:
                if model == "fake-truncate":
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)  # cut mid-stream, no terminating chunk
                    return
                self._event({"error": {"message": "fake: out of memory", "code": 500}})
                break
            token = f" tok{i}"
            choice = ({"index": 0, "delta": {"content": token}} if chat
                      else {"index": 0, "text": token})
            t_ns = time.monotonic_ns()
            self._event({**base, "choices": [choice]})
            with srv.lock:
                srv.sent.append((model, i, t_ns))
        final = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                 else {"index": 0, "text": "", "finish_reason": "length"})
        self._event({**base, "choices": [final]})
        self._event("[DONE]")
        self._chunk(b"")

    def _plain(self, code: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeOpenAIServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ttft_ms = 20.0
        self.itl_ms = 5.0
        self.lock = threading.Lock()
        self.sent: list[tuple[str, int, int]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="session")
def fake_openai_server() -> Iterator[FakeOpenAIServer]:
    """A started FAKE OpenAI-compatible streaming server (see the module docstring)."""
    srv = FakeOpenAIServer()
    thread = threading.Thread(target=srv.serve_forever, name="fake-openai", daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)
