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
import codecs
import logging
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import httpcore
import httpx

from tritonwatch.collector.http_backend import AsyncioBackend

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

#: What httpcore raises (httpx raises its own classes of the same names for them).
_HTTPCORE_ERRORS: tuple[type[Exception], ...] = (
    httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
    httpcore.ProxyError, httpcore.UnsupportedProtocol,
)
#: The logger httpx writes its line per request to (see _fetch_prepared).
_HTTPX_LOG = logging.getLogger("httpx")
_HTTP_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, *_HTTPCORE_ERRORS)


class PoolPerUrl(httpx.AsyncBaseTransport):
    """A small connection pool per scraped URL (one keep-alive connection), instead of one
    pool for all.

    httpcore's pool re-examines every connection it holds each time a request starts or ends
    (a readability check and a ``getpeername`` system call each, and a count of the idle ones
    per connection): with a fleet's 64 pooled connections that was about 5 ms of CPU per
    scrape, as much as parsing and storing its 2,879 series together.  A target's own pool
    holds at most its one connection, which its scrape job (one run at a time) reuses.  The
    callers' concurrency bound (``scrape.max_concurrency``) still limits scrapes in flight.

    The pools are httpcore's, on :class:`collector.http_backend.AsyncioBackend`;
    :func:`fetch_metrics` uses them directly (:meth:`pool`), and any httpx client given this
    transport goes through :meth:`handle_async_request`, as through httpx's own transport.
    """

    def __init__(self, shared_connections: int = 100, max_urls: int = MAX_URL_POOLS,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._keepalive_expiry = keepalive_expiry
        self._pools: dict[tuple[bytes, bytes, int | None, bytes], httpcore.AsyncConnectionPool] = {}
        self.max_urls = max_urls
        self._shared_connections = shared_connections
        self._shared: httpcore.AsyncConnectionPool | None = None
        self._ssl: ssl.SSLContext | None = None  # one for all pools: each costs ~1 MB
        self._backend = AsyncioBackend()

    def _new_pool(self, connections: int) -> httpcore.AsyncConnectionPool:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(trust_env=False)
        # As httpx.AsyncHTTPTransport(verify=..., limits=..., trust_env=False) builds it.
        return httpcore.AsyncConnectionPool(
            ssl_context=self._ssl, max_connections=connections, max_keepalive_connections=1,
            keepalive_expiry=self._keepalive_expiry, http1=True, http2=False,
            network_backend=self._backend,
        )

    def pool(self, url: httpx.URL) -> httpcore.AsyncConnectionPool:
        """The pool that ``url``'s requests go through."""
        key = (url.raw_scheme, url.raw_host, url.port, url.raw_path)
        pool = self._pools.get(key)
        if pool is None:
            if len(self._pools) >= self.max_urls:
                if self._shared is None:
                    self._shared = self._new_pool(self._shared_connections)
                return self._shared
            pool = self._pools[key] = self._new_pool(4)
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions,
        )
        try:
            response = await self.pool(url).handle_async_request(core)
        except _HTTPCORE_ERRORS as exc:
            raise _as_httpx(exc) from exc
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_HttpxStream(response), extensions=response.extensions)

    async def aclose(self) -> None:
        pools = list(self._pools.values())
        if self._shared is not None:
            pools.append(self._shared)
        self._pools.clear()
        self._shared = None
        for pool in pools:
            await pool.aclose()


def _as_httpx(exc: Exception) -> httpx.HTTPError:
    """httpx's exception for httpcore's ``exc``, as httpx's own transport maps it."""
    for cls in type(exc).__mro__:
        mapped = getattr(httpx, cls.__name__, None)
        if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
            return mapped(str(exc))
    return httpx.TransportError(str(exc))


class _HttpxStream(httpx.AsyncByteStream):
    """An httpcore response body as an httpx stream (httpcore's errors as httpx's)."""

    def __init__(self, response: httpcore.Response) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        stream = self._response.stream
        assert isinstance(stream, AsyncIterable)
        try:
            async for chunk in stream:
                yield chunk
        except _HTTPCORE_ERRORS as exc:
            raise _as_httpx(exc) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class _Prepared(NamedTuple):
    """A target's request, built once by httpx: what :func:`fetch_metrics` sends each scrape."""

    headers_key: tuple[tuple[str, str], ...]
    request_url: httpx.URL
    url: httpcore.URL
    headers: list[tuple[bytes, bytes]]
    pool: httpcore.AsyncConnectionPool


class ScrapeClient(httpx.AsyncClient):
    """The httpx client :func:`make_client` returns: its scrapes skip httpx's per-request work.

    Building a request (URL parsing, header merging), the cookie jar, the auth and redirect
    layers and httpx's response wrapping cost about a third of a millisecond of CPU per scrape;
    a target's request is the same every scrape, so it is built once by httpx (the client's
    headers and the target's, ``Host``, basic auth from the URL's user info) and sent straight
    to the target's httpcore pool.  Cookies a target sets are not kept (Prometheus keeps none
    either); redirects were never followed.
    """

    def __init__(self, transport: PoolPerUrl, headers: Mapping[str, str]) -> None:
        super().__init__(transport=transport, headers=headers, follow_redirects=False,
                         trust_env=False)
        self.pools = transport
        self._prepared: dict[str, _Prepared] = {}

    def prepared(self, url: str, headers: Mapping[str, str] | None) -> _Prepared:
        key = tuple(headers.items()) if headers else ()
        found = self._prepared.get(url)
        if found is not None and found.headers_key == key:
            return found
        request = self.build_request("GET", url, headers=dict(key))
        if request.url.username or request.url.password:  # as httpx's send() does
            next(httpx.BasicAuth(request.url.username, request.url.password)
                 .sync_auth_flow(request))
        u = request.url
        prepared = _Prepared(
            key, u, httpcore.URL(scheme=u.raw_scheme, host=u.raw_host, port=u.port,
                              target=u.raw_path),
            request.headers.raw, self.pools.pool(u),
        )
        if found is not None or len(self._prepared) < self.pools.max_urls:
            self._prepared[url] = prepared
        return prepared


def make_client(max_connections: int = 100, member: str | None = None) -> ScrapeClient:
    # Pooled per URL (PoolPerUrl): keep-alive saves a TCP handshake per scrape, and the
    # per-request timeout below is what bounds each scrape.  ``max_connections`` bounds the
    # pool that URLs past MAX_URL_POOLS share; the callers' semaphore bounds the scrapes.
    headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT, "Accept-Encoding": "gzip"}
    # (a default member name holds the host name: one that no header can carry is left out
    # rather than failing every scrape)
    if member is not None and member.isascii() and member.isprintable():
        headers[MEMBER_HEADER] = member
    return ScrapeClient(PoolPerUrl(max_connections), headers)


async def fetch_metrics(
    client: httpx.AsyncClient,
    target: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
) -> Body:
    """GET ``url`` and return its decoded text, or raise a ScrapeError naming ``target``.

    Through a :class:`ScrapeClient`, the target's prepared request goes straight to its pool;
    any other httpx client sends it the usual way (the same checks either way).
    """
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            if isinstance(client, ScrapeClient):
                chunks, size = await _fetch_prepared(
                    client.prepared(url, headers), target, url, timeout, max_bytes)
            else:
                chunks, size = await _fetch_httpx(client, target, url, timeout, max_bytes,
                                                  headers)
    except TimeoutError:
        raise ScrapeTimeout(target, f"timed out after {timeout:g}s") from None
    except (httpx.TimeoutException, httpcore.TimeoutException):
        raise ScrapeTimeout(target, f"timed out after {timeout:g}s") from None
    except _HTTP_ERRORS as exc:
        # httpx messages can include the full URL; name the redacted one instead.
        raise ScrapeError(
            target, f"{type(exc).__name__} from {redact_url(url)}: {_short(exc)}"
        ) from None
    return Body(_decode(chunks, target), time.perf_counter() - start, size)


def _decode(chunks: list[bytes], target: str) -> str:
    """The body's text.  Decoded chunk by chunk and the texts joined: one allocation of the
    body's size instead of two (joined bytes, then text), each of which, for a body past
    glibc's mapping threshold, is a fresh mapping whose every page faults in."""
    try:
        if len(chunks) == 1:
            return chunks[0].decode("utf-8")
        decoder = codecs.getincrementaldecoder("utf-8")()
        parts = [decoder.decode(chunk) for chunk in chunks]
        parts.append(decoder.decode(b"", final=True))
        return "".join(parts)
    except UnicodeDecodeError:
        # The incremental decoder counts from its chunk: the offset in the whole body.
        try:
            b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError(target, f"body is not UTF-8 (byte {exc.start})") from None
        raise  # pragma: no cover  (decoded whole after failing in parts: cannot happen)


async def _fetch_prepared(prepared: _Prepared, target: str, url: str, timeout: float,
                          max_bytes: int) -> tuple[list[bytes], int]:
    request = httpcore.Request(
        b"GET", prepared.url, headers=prepared.headers,
        extensions={"timeout": {"connect": timeout, "read": timeout, "write": timeout,
                                "pool": timeout}},
    )
    response = await prepared.pool.handle_async_request(request)
    if _HTTPX_LOG.isEnabledFor(logging.INFO):
        # httpx's own line per request, which ``-vvv`` shows (and quieter levels leave out).
        ext = response.extensions
        reason = ext.get("reason_phrase", b"").decode("ascii", errors="ignore")
        _HTTPX_LOG.info('HTTP Request: %s %s "%s %d %s"', "GET", prepared.request_url,
                        ext.get("http_version", b"HTTP/1.1").decode("ascii", errors="ignore"),
                        response.status,
                        reason or httpx.codes.get_reason_phrase(response.status))
    try:
        if response.status != 200:
            raise ScrapeError(target, f"HTTP {response.status} from {redact_url(url)}")
        body: AsyncIterable[bytes]
        if _encoded(response.headers):
            # Decoded by httpx, as before (gzip and whatever else httpx decodes).
            body = httpx.Response(200, headers=response.headers,
                                  stream=_HttpxStream(response)).aiter_bytes()
        else:
            assert isinstance(response.stream, AsyncIterable)
            body = response.stream
        return await _read_limited(body, target, max_bytes)
    finally:
        await response.aclose()


def _encoded(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the response names a content encoding other than identity."""
    for name, value in headers:
        if name.lower() == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            return True
    return False


async def _fetch_httpx(client: httpx.AsyncClient, target: str, url: str, timeout: float,
                       max_bytes: int, headers: Mapping[str, str] | None,
                       ) -> tuple[list[bytes], int]:
    async with client.stream(
        "GET", url, headers=dict(headers or {}), timeout=timeout
    ) as response:
        if response.status_code != 200:
            raise ScrapeError(target, f"HTTP {response.status_code} from {redact_url(url)}")
        return await _read_limited(response.aiter_bytes(), target, max_bytes)


async def _read_limited(body: AsyncIterable[bytes], target: str,
                        max_bytes: int) -> tuple[list[bytes], int]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(target, f"body exceeds max_body_bytes ({max_bytes} bytes)")
        chunks.append(chunk)
    return chunks, size


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
