"""An httpcore network backend on plain asyncio, for the scrape connection pools.

httpcore's default backend on asyncio goes through anyio, and each ``read`` of a response
body there opens a cancel scope (``anyio.fail_after``), asks sniffio for the event loop and
turns the socket's reading on and off again (two ``epoll_ctl`` system calls), and slices its
buffered chunk into 64 KiB pieces by copying the rest each time.  Measured on a 75 KiB and a
380 KiB Triton payload, that was about a quarter of the CPU of fetching it.  This backend keeps
the socket reading while a response is expected, buffers what arrives, and hands it out with
one copy; the HTTP itself (requests, responses, keep-alive, pooling) stays httpcore's and h11's.

It implements httpcore's :class:`httpcore.AsyncNetworkBackend` interface (TCP and TLS, which
is what the scrape pools use) and raises httpcore's exceptions where the anyio backend does,
with the same messages where the message comes from the backend (``ConnectError: All
connection attempts failed`` for a refused connection).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpcore

#: Bytes buffered but not yet read past which the socket stops reading until ``read`` drains
#: them (a target cannot fill the collector's memory faster than a scrape consumes it).
HIGH_WATER = 1 << 20


#: Size of the buffer the socket is read into (one per backend, shared by its connections: they
#: are all read on the event loop's thread, one at a time).  Under glibc's mapping threshold as
#: ``tritonwatch serve`` sets it (256 KiB, tritonwatch.memory.tune_malloc), so the bytes handed
#: out come from the heap: asyncio's own 256 KiB reads got a fresh mapping each, and with it a
#: page fault per 4 KiB received.
READ_BUFFER = 128 << 10


class _Protocol(asyncio.BufferedProtocol):
    """Buffers what the socket receives for :class:`AsyncioStream`."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.offset = 0  # of the first unread byte in chunks[0]
        self.buffered = 0  # unread bytes in chunks
        self.eof = False
        self.error: BaseException | None = None
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.write_waiter: asyncio.Future[None] | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        # A memoryview, not the bytearray: asyncio's TLS layer fills it in slices
        # (``buf[offset:]``), and a slice of a bytearray is a copy (measured: the bytes after
        # the first TLS record of each read were lost).
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self._received(self.buffer[:nbytes].tobytes())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def _received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too: the connection is no use for another request

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        waiter, self.write_waiter = self.write_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pause_writing(self) -> None:
        self.write_waiter = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        waiter, self.write_waiter = self.write_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of the buffered bytes, each byte copied at most once."""
        first = self.chunks[0]
        if self.offset == 0 and len(first) <= max_bytes:
            self.chunks.popleft()
            if len(self.chunks) and len(first) < max_bytes:
                # Several arrived since the last read: hand them out together (fewer reads,
                # fewer h11 events), still within max_bytes.
                parts = [first]
                size = len(first)
                while self.chunks and size + len(self.chunks[0]) <= max_bytes:
                    part = self.chunks.popleft()
                    parts.append(part)
                    size += len(part)
                first = b"".join(parts)
            data = first
        else:
            end = min(len(first), self.offset + max_bytes)
            data = memoryview(first)[self.offset:end].tobytes()
            if end == len(first):
                self.chunks.popleft()
                self.offset = 0
            else:
                self.offset = end
        self.buffered -= len(data)
        if self.paused and self.buffered <= HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.buffered:
            if protocol.eof:
                if protocol.error is not None:
                    raise httpcore.ReadError("")  # no message, as anyio's backend
                return b""
            waiter = protocol.waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                raise httpcore.ReadTimeout() from None
            finally:
                protocol.waiter = None
            if not protocol.buffered:
                if protocol.error is not None:
                    raise httpcore.ReadError("")
                return b""
        return protocol.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("")  # no message, as anyio's backend
        self._transport.write(buffer)
        waiter = self._protocol.write_waiter
        if waiter is not None:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(waiter)
            except TimeoutError:
                raise httpcore.WriteTimeout() from None
            if self._protocol.error is not None:
                raise httpcore.WriteError("")

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                self._transport, self._protocol, ssl_context,
                server_hostname=server_hostname, ssl_handshake_timeout=timeout,
            )
        except TimeoutError:
            self._transport.abort()
            raise httpcore.ConnectTimeout() from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.abort()
            raise httpcore.ConnectError(str(exc)) from exc
        if transport is None:  # the connection was closed during the handshake
            raise httpcore.ConnectError("connection closed during the TLS handshake")
        self._protocol.transport = transport
        return AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # What httpcore asks of an idle pooled connection: anything received (the target
            # closed it, or sent something unasked) means it cannot carry another request.
            return self._protocol.buffered > 0 or self._protocol.eof
        if info in ("ssl_object", "socket"):
            return self._transport.get_extra_info(info)
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._buffer = memoryview(bytearray(READ_BUFFER))

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if socket_options:
            raise ValueError("socket_options are not supported by this backend")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    lambda: _Protocol(self._buffer), host, port,
                    local_addr=(local_address, 0) if local_address else None,
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout() from None
        except socket.gaierror as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        except OSError as exc:
            # anyio's message for the same failure, so a scrape error reads as before.
            raise httpcore.ConnectError("All connection attempts failed") from exc
        assert isinstance(transport, asyncio.Transport)
        return AsyncioStream(transport, protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.UnsupportedProtocol("unix sockets are not supported by this backend")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
