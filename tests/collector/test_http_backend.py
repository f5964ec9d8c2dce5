"""collector.http_backend (httpcore on plain asyncio) against httpcore's own backend, and the
contract httpcore relies on: reads within ``max_bytes`` that put the byte stream back together,
readability of an idle connection, TLS; and fetch_metrics' chunk-by-chunk decoding against a
plain decode."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpcore
import pytest

from tests.serving import QuietHandler, serving
from tritonwatch.collector import http_backend
from tritonwatch.collector.http_backend import AsyncioBackend
from tritonwatch.collector.scrape import ScrapeError, _decode

TLS = Path(__file__).resolve().parent.parent / "fixtures" / "tls"
BODY = os.urandom(1 << 20)


class _Handler(QuietHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


@pytest.fixture(scope="module")
def https_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with serving(server):
        yield f"https://127.0.0.1:{server.server_address[1]}/metrics"


async def _get(url: str, context: ssl.SSLContext, backend: object | None,
               times: int = 2) -> list[bytes]:
    kwargs = {} if backend is None else {"network_backend": backend}
    async with httpcore.AsyncConnectionPool(ssl_context=context, **kwargs) as pool:  # type: ignore[arg-type]
        bodies = []
        for _ in range(times):
            response = await pool.request("GET", url)
            bodies.append(response.content)
        return bodies


def test_tls_fetch_matches_httpcores_backend(https_url: str) -> None:
    trusting = ssl.create_default_context(cafile=str(TLS / "cert.pem"))
    ours = asyncio.run(_get(https_url, trusting, AsyncioBackend()))
    theirs = asyncio.run(_get(https_url, trusting, None))
    assert ours == theirs == [BODY, BODY]


def test_untrusted_certificate_is_a_connect_error(https_url: str) -> None:
    with pytest.raises(httpcore.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(_get(https_url, ssl.create_default_context(), AsyncioBackend()))
    with pytest.raises(httpcore.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(_get(https_url, ssl.create_default_context(), None))


@pytest.fixture
def peer() -> Iterator[tuple[int, list[socket.socket]]]:
    """A listening socket whose accepted connections the test drives by hand."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]),
                              daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


def test_reads_stay_within_max_bytes_and_lose_nothing(
    peer: tuple[int, list[socket.socket]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More than the high-water mark arrives unread (the socket stops reading, then
    resumes), and reads of varied sizes give back every byte in order."""
    monkeypatch.setattr(http_backend, "HIGH_WATER", 256 << 10)
    port, accepted = peer
    data = os.urandom(3 << 20)

    async def go() -> list[bytes]:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.05)
        def send() -> None:
            accepted[0].sendall(data)
            accepted[0].shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        await asyncio.sleep(0.3)  # let more than HIGH_WATER arrive before reading
        reads = []
        sizes = [1, 7, 65536, 1000, 200_000, 3, 65536]
        i = 0
        while True:
            want = sizes[i % len(sizes)]
            chunk = await stream.read(want, timeout=5)
            if not chunk:
                break
            assert len(chunk) <= want
            reads.append(chunk)
            i += 1
        sender.join(5)
        assert stream.get_extra_info("is_readable")  # at EOF
        await stream.aclose()
        return reads

    reads = asyncio.run(go())
    assert b"".join(reads) == data
    assert len(reads) > 10


def test_idle_connection_is_readable_once_the_peer_closes(
    peer: tuple[int, list[socket.socket]],
) -> None:
    port, accepted = peer

    async def go() -> tuple[bool, bool, bytes]:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        idle = stream.get_extra_info("is_readable")
        accepted[0].close()
        for _ in range(100):
            if stream.get_extra_info("is_readable"):
                break
            await asyncio.sleep(0.02)
        closed = stream.get_extra_info("is_readable")
        data = await stream.read(100, timeout=5)
        await stream.aclose()
        return idle, closed, data

    assert asyncio.run(go()) == (False, True, b"")


def test_read_timeout_is_httpcores(peer: tuple[int, list[socket.socket]]) -> None:
    port, _ = peer

    async def go() -> None:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        try:
            await stream.read(100, timeout=0.2)
        finally:
            await stream.aclose()

    with pytest.raises(httpcore.ReadTimeout):
        asyncio.run(go())


@pytest.mark.parametrize("text", ["plain ascii 1\n" * 5000,
                                  "caf\u00e9 \u20ac \U0001f600\n" * 9000, ""])
@pytest.mark.parametrize("size", [1, 2, 3, 4096, 65536])
def test_decoding_in_chunks_equals_decoding_whole(text: str, size: int) -> None:
    data = text.encode()
    chunks = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
    assert _decode(chunks, "t") == data.decode()


@pytest.mark.parametrize("bad_at", [0, 5, 70_000, 139_999])
def test_not_utf8_names_the_offset_in_the_whole_body(bad_at: int) -> None:
    data = bytearray("\u00e9".encode() * 70_000)
    data[bad_at] = 0xFF
    chunks = [bytes(data[i:i + 65536]) for i in range(0, len(data), 65536)]
    with pytest.raises(UnicodeDecodeError) as whole:
        bytes(data).decode()
    with pytest.raises(ScrapeError, match=rf"body is not UTF-8 \(byte {whole.value.start}\)"):
        _decode(chunks, "t")
