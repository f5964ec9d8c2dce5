"""``make_client``'s fast path (ScrapeClient: a prepared request straight to httpcore on
collector.http_backend) against the httpx path it replaced, target by target.

The reference is fetch_metrics through a plain ``httpx.AsyncClient`` over httpx's own
transport (httpcore on anyio) with the collector's headers: what every scrape did before.
Each case must come out the same either way: the text and size, or the exception's class and
message.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import httpx
import pytest

from tests.serving import QuietHandler, serving
from tritonwatch.collector.scrape import (
    ACCEPT,
    MEMBER_HEADER,
    USER_AGENT,
    Body,
    PoolPerUrl,
    ScrapeClient,
    fetch_metrics,
    make_client,
)

TEXT = 'nv_inference_count{model="m",version="1"} 10\n' * 200


class _Handler(QuietHandler):
    def do_GET(self) -> None:
        path = self.path
        if path == "/ok":
            self.send_body(200, TEXT.encode())
        elif path == "/gzip":
            self.send_body(200, gzip.compress(TEXT.encode()), {"Content-Encoding": "gzip"})
        elif path == "/gzip-upper":
            self.send_body(200, gzip.compress(TEXT.encode()), {"Content-Encoding": "GZIP"})
        elif path == "/deflate":
            self.send_body(200, zlib.compress(TEXT.encode()), {"Content-Encoding": "deflate"})
        elif path == "/identity":
            self.send_body(200, TEXT.encode(), {"Content-Encoding": "identity"})
        elif path == "/gzip-big":  # 2 MiB once decompressed, a few KiB on the wire
            self.send_body(200, gzip.compress(b"#" * (2 << 20)), {"Content-Encoding": "gzip"})
        elif path == "/bad-gzip":
            self.send_body(200, b"this is not gzip", {"Content-Encoding": "gzip"})
        elif path == "/latin1":
            self.send_body(200, "caf\u00e9 1\n".encode("latin-1"))
        elif path == "/empty":
            self.send_body(200, b"")
        elif path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (TEXT[:1000], TEXT[1000:]):
                data = part.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif path == "/truncated":  # promises more than it sends, then closes
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x 1\n")
            self.close_connection = True
        elif path == "/reset":  # part of a body, then a TCP reset
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x 1\n")
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
        elif path == "/redirect":
            self.send_body(302, b"", {"Location": "/ok"})
        elif path == "/cookie":
            self.send_body(200, TEXT.encode(), {"Set-Cookie": "session=1"})
        elif path.startswith("/status/"):
            self.send_body(int(path.rsplit("/", 1)[1]), b"nope")
        elif path.startswith("/echo"):  # the request line's target and headers, as text
            lines = [f"target {path}",
                     *sorted(f"{k.lower()}: {v}" for k, v in self.headers.items())]
            self.send_body(200, ("\n".join(lines) + "\n").encode())
        else:
            self.send_body(404, b"not found")


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    with serving(server):
        yield f"http://127.0.0.1:{server.server_address[1]}"


def _reference_client(member: str | None = None) -> httpx.AsyncClient:
    headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT, "Accept-Encoding": "gzip"}
    if member is not None:
        headers[MEMBER_HEADER] = member
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(trust_env=False),
                             headers=headers, follow_redirects=False, trust_env=False)


Outcome = tuple[str, str, int] | tuple[str, str]


def _outcomes(url: str, *, timeout: float = 10, max_bytes: int = 1 << 20,
              headers: dict[str, str] | None = None, member: str | None = None,
              repeat: int = 1) -> tuple[list[Outcome], list[Outcome]]:
    """What the reference path and make_client's path made of ``url``, scrape by scrape."""

    async def run(client: httpx.AsyncClient) -> list[Outcome]:
        found: list[Outcome] = []
        async with client:
            for _ in range(repeat):
                try:
                    body = await fetch_metrics(client, "t1", url, timeout=timeout,
                                               max_bytes=max_bytes, headers=headers)
                except Exception as exc:
                    found.append((type(exc).__name__, str(exc)))
                else:
                    found.append(("Body", body.text, body.size))
        return found

    async def both() -> tuple[list[Outcome], list[Outcome]]:
        client = make_client(member=member)
        assert isinstance(client, ScrapeClient)
        return await run(_reference_client(member)), await run(client)

    return asyncio.run(both())


@pytest.mark.parametrize("path", [
    "/ok", "/gzip", "/gzip-upper", "/deflate", "/identity", "/empty", "/chunked", "/latin1",
    "/bad-gzip", "/truncated", "/reset", "/redirect", "/status/401", "/status/500", "/missing",
    "/echo",
])
def test_same_outcome_as_the_httpx_path(base: str, path: str) -> None:
    reference, fast = _outcomes(base + path, repeat=2)
    assert fast == reference
    if path in ("/ok", "/gzip", "/deflate", "/chunked"):
        assert fast[0] == ("Body", TEXT, len(TEXT))  # gzip and deflate bodies decoded


def test_gzip_body_is_limited_once_decompressed(base: str) -> None:
    reference, fast = _outcomes(base + "/gzip-big", max_bytes=1 << 20)
    assert fast == reference
    assert fast[0][0] == "BodyTooLarge" and "max_body_bytes (1048576 bytes)" in fast[0][1]
    reference, fast = _outcomes(base + "/gzip-big", max_bytes=4 << 20)
    assert fast == reference and fast[0][2:] == (2 << 20,)


def test_request_headers_match_the_httpx_path(base: str) -> None:
    """The collector's headers, the member's, the target's own (overriding a default
    case-insensitively), Host, Connection and the URL's target, query included."""
    headers = {"Authorization": "Bearer abc", "accept": "text/plain", "X-Extra": "1"}
    reference, fast = _outcomes(base + "/echo?a=1&b=%20", headers=headers, member="m1",
                                repeat=2)
    assert fast == reference
    text = fast[0][1]
    assert isinstance(text, str)
    assert "target /echo?a=1&b=%20\n" in text
    assert "accept: text/plain\n" in text and "accept-encoding: gzip\n" in text
    assert "authorization: Bearer abc\n" in text and "x-extra: 1\n" in text
    assert "x-tritonwatch-member: m1\n" in text and f"user-agent: {USER_AGENT}\n" in text


def test_user_info_in_the_url_is_sent_as_basic_auth(base: str) -> None:
    url = base.replace("http://", "http://us%40er:p%3Ass@") + "/echo"
    reference, fast = _outcomes(url)
    assert fast == reference
    assert "authorization: Basic dXNAZXI6cDpzcw==\n" in str(fast[0][1])  # "us@er:p:ss"


def test_changed_target_headers_are_sent_from_the_next_scrape(base: str) -> None:
    async def go() -> list[str]:
        async with make_client() as client:
            texts = []
            for token in ("one", "two"):
                body = await fetch_metrics(client, "t", base + "/echo", timeout=10,
                                           max_bytes=1 << 20, headers={"X-Token": token})
                texts.append(body.text)
            return texts

    first, second = asyncio.run(go())
    assert "x-token: one\n" in first and "x-token: two\n" in second


def test_down_target_fails_alike() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    reference, fast = _outcomes(f"http://127.0.0.1:{port}/metrics")
    assert fast == reference
    assert fast[0][0] == "ScrapeError" and "ConnectError" in fast[0][1]


def test_timeout_cuts_a_target_that_never_answers() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # and never answer
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        reference, fast = _outcomes(f"http://127.0.0.1:{listener.getsockname()[1]}/m",
                                    timeout=0.3)
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
    assert fast == reference == [("ScrapeTimeout", "scrape of 't1' failed: timed out after 0.3s")]


def test_redirects_are_not_followed_and_cookies_not_kept(base: str) -> None:
    async def go() -> tuple[Body, str]:
        async with make_client() as client:
            first = await fetch_metrics(client, "t", base + "/cookie", timeout=10,
                                        max_bytes=1 << 20)
            echo = await fetch_metrics(client, "t", base + "/echo", timeout=10,
                                       max_bytes=1 << 20)
            return first, echo.text

    first, echo = asyncio.run(go())
    assert first.text == TEXT and "cookie" not in echo
    reference, fast = _outcomes(base + "/redirect")
    assert fast == reference and "HTTP 302" in str(fast[0][1])


def test_pools_past_the_bound_prepare_without_keeping(base: str) -> None:
    """Past PoolPerUrl's bound, requests still go out (through the shared pool), and the
    client keeps no prepared request for them."""

    async def go() -> tuple[list[str], int]:
        client = ScrapeClient(PoolPerUrl(shared_connections=2, max_urls=2), {})
        async with client:
            texts = [(await fetch_metrics(client, f"t{i}", f"{base}/echo/{i}", timeout=10,
                                          max_bytes=1 << 20)).text for i in range(5)]
            return texts, len(client._prepared)

    texts, kept = asyncio.run(go())
    assert [t.splitlines()[0] for t in texts] == [f"target /echo/{i}" for i in range(5)]
    assert kept == 2
