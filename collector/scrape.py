"""Fetching one target's /metrics body, with the limits a hostile or broken target needs.

Exceptions (each carries the target name and subclasses the matching builtin)::

    ConnectionError
     └── ScrapeError            target unreachable, HTTP error status, bad encoding
          ├── ScrapeTimeout     (also a TimeoutError) the whole scrape overran its deadline
          └── BodyTooLarge      the (decompressed) body exceeded max_body_bytes
    ValueError
     └── collector.parse.ParseError   the body is not Prometheus text

The deadline covers connect, headers *and* the body, so a target that trickles an endless
body is cut off at its timeout like one that never answers.  The size cap counts decompressed
bytes, so a gzip bomb is cut off too.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import httpx

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
USER_AGENT = "tritonwatch/0.1"


class ScrapeError(ConnectionError):
    def __init__(self, target: str, message: str) -> None:
        self.target = target
        self.reason = message
        super().__init__(f"scrape of {target!r} failed: {message}")


class ScrapeTimeout(ScrapeError, TimeoutError):
    pass


class BodyTooLarge(ScrapeError):
    pass


class Body(NamedTuple):
    text: str
    duration_s: float
    size: int


def redact_url(url: str) -> str:
    """The URL without user info or query string (which may hold credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


#: Sent by a cluster member on every scrape: the target's side (a proxy's log, a test) can
#: tell which collector read it.
MEMBER_HEADER = "X-Tritonwatch-Member"


#: Most URLs that get a connection pool of their own (:class:`PoolPerUrl`); any beyond share one.
MAX_URL_POOLS = 20_000
#: How long an idle scrape connection is kept open for the next scrape (seconds).  httpx's
#: default, 5 s, is shorter than any scrape interval worth having: every 15 s scrape then
#: opened a new TCP connection and closed the old one, measured at 1,000 targets as about a
#: tenth of the collector's CPU.  Prometheus keeps idle scrape connections 5 minutes; a
#: connection the target closed meanwhile is seen as readable (EOF) and not reused.
KEEPALIVE_EXPIRY_S = 330.0


class PoolPerUrl(httpx.AsyncBaseTransport):
    """A small connection pool per scraped URL (one keep-alive connection), instead of one
    pool for all.

    httpcore's pool re-examines every connection it holds each time a request starts or ends
    (a readability check and a ``getpeername`` system call each, and a count of the idle ones
    per connection): with a fleet's 64 pooled connections that was about 5 ms of CPU per
    scrape, as much as parsing and storing its 2,879 series together.  A target's own pool
    holds at most its one connection, which its scrape job (one run at a time) reuses.  The
    callers' concurrency bound (``scrape.max_concurrency``) still limits scrapes in flight.
    """

    def __init__(self, shared_connections: int = 100, max_urls: int = MAX_URL_POOLS,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._keepalive_expiry = keepalive_expiry
        self._pools: dict[tuple[bytes, bytes, int | None, bytes], httpx.AsyncHTTPTransport] = {}
        self._max_urls = max_urls
        self._shared_connections = shared_connections
        self._shared: httpx.AsyncHTTPTransport | None = None
        self._ssl: ssl.SSLContext | None = None  # one for all pools: each costs ~1 MB

    def _new_pool(self, connections: int) -> httpx.AsyncHTTPTransport:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(trust_env=False)
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=1,
                              keepalive_expiry=self._keepalive_expiry)
        return httpx.AsyncHTTPTransport(verify=self._ssl, limits=limits, trust_env=False)

    def _pool(self, url: httpx.URL) -> httpx.AsyncHTTPTransport:
        key = (url.raw_scheme, url.raw_host, url.port, url.raw_path)
        pool = self._pools.get(key)
        if pool is None:
            if len(self._pools) >= self._max_urls:
                if self._shared is None:
                    self._shared = self._new_pool(self._shared_connections)
                return self._shared
            pool = self._pools[key] = self._new_pool(4)
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._pool(request.url).handle_async_request(request)

    async def aclose(self) -> None:
        pools = list(self._pools.values())
        if self._shared is not None:
            pools.append(self._shared)
        self._pools.clear()
        self._shared = None
        for pool in pools:
            await pool.aclose()


def make_client(max_connections: int = 100, member: str | None = None) -> httpx.AsyncClient:
    # Pooled per URL (PoolPerUrl): keep-alive saves a TCP handshake per scrape, and the
    # per-request timeout below is what bounds each scrape.  ``max_connections`` bounds the
    # pool that URLs past MAX_URL_POOLS share; the callers' semaphore bounds the scrapes.
    headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT, "Accept-Encoding": "gzip"}
    # (a default member name holds the host name: one that no header can carry is left out
    # rather than failing every scrape)
    if member is not None and member.isascii() and member.isprintable():
        headers[MEMBER_HEADER] = member
    return httpx.AsyncClient(
        transport=PoolPerUrl(max_connections),
        headers=headers,
        follow_redirects=False,
        trust_env=False,
    )


async def fetch_metrics(
    client: httpx.AsyncClient,
    target: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
) -> Body:
    """GET ``url`` and return its decoded text, or raise a ScrapeError naming ``target``."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            async with client.stream(
                "GET", url, headers=dict(headers or {}), timeout=timeout
            ) as response:
                if response.status_code != 200:
                    raise ScrapeError(
                        target, f"HTTP {response.status_code} from {redact_url(url)}"
                    )
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise BodyTooLarge(
                            target, f"body exceeds max_body_bytes ({max_bytes} bytes)"
                        )
                    chunks.append(chunk)
    except TimeoutError:
        raise ScrapeTimeout(target, f"timed out after {timeout:g}s") from None
    except httpx.TimeoutException:
        raise ScrapeTimeout(target, f"timed out after {timeout:g}s") from None
    except httpx.HTTPError as exc:
        # httpx messages can include the full URL; name the redacted one instead.
        raise ScrapeError(
            target, f"{type(exc).__name__} from {redact_url(url)}: {_short(exc)}"
        ) from None
    body = b"".join(chunks)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError(target, f"body is not UTF-8 (byte {exc.start})") from None
    return Body(text, time.perf_counter() - start, size)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
