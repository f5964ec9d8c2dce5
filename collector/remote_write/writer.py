"""Prometheus remote-write 1.0 to one receiver: batches, shards, retries, an on-disk buffer.

Path of a sample::

    Collector ──append──▶ Encoder ──▶ per-shard Batch ──(full, or batch_send_deadline)──▶
        snappy ──▶ SegmentBuffer (disk, bounded) ──▶ shard sender ──POST──▶ receiver

* :meth:`RemoteWriter.append_columns` / :meth:`RemoteWriter.append` run in the collector's
  worker threads; they encode and, once a shard's batch holds ``max_samples_per_send``,
  compress it and append it to that shard's buffer.  Nothing waits for the network.
* One thread of its own runs an asyncio loop with one sender per shard.  A sender POSTs its
  buffer's records one after the other (so each series stays in time order), with the
  protocol's headers (``Content-Encoding: snappy``, ``Content-Type: application/x-protobuf``,
  ``X-Prometheus-Remote-Write-Version: 0.1.0``) and the receiver's own (headers, basic auth
  or bearer token).
* 2xx: sent.  5xx, 429 and connection errors or timeouts: the same request again after a
  back-off doubling from ``min_backoff`` to ``max_backoff`` (a 429's ``Retry-After`` is
  honoured up to 5 minutes); the buffer holds everything behind it meanwhile.  Any other
  status: the request can never succeed, so it is dropped, counted as failed, and logged once
  per receiver every 5 minutes with the status and the start of the body (escaped and cut,
  :func:`schemas.untrusted.log_safe`).
* The buffer is bounded (``buffer.max_size``): an outage longer than it holds drops the
  oldest data first, counted (``..._samples_dropped_total``).
* Shutdown (:meth:`close`) moves every batch to the buffer, gives the senders a few seconds,
  and leaves whatever is unsent on disk for the next start.

Self-metrics, each labelled ``remote=<name>``: ``tritonwatch_remote_write_samples_sent_total``,
``..._samples_failed_total`` (refused by a 4xx), ``..._samples_dropped_total`` (buffer full),
``..._samples_retried_total``, ``..._pending_samples`` (queue length: batches and buffer),
``..._buffer_bytes``, ``..._lag_seconds`` (age of the oldest unsent sample),
``..._last_send_timestamp_seconds``, ``..._shards``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx
import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry, Counter, Gauge

from tritonwatch.collector.remote_write.buffer import Record, SegmentBuffer
from tritonwatch.collector.remote_write.encode import Batch, Encoder
from tritonwatch.schemas.remote_write import RemoteWriteConfig
from tritonwatch.schemas.samples import Labels, Sample
from tritonwatch.schemas.untrusted import RepeatLimiter, ReplacingFilter, log_safe
from tritonwatch.schemas.values import REDACTED, redact_url_text

log = logging.getLogger(__name__)

#: The protocol's fixed headers (remote-write 1.0 specification).
PROTOCOL_HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
#: Bytes of a refusing receiver's body read and logged, at most.
ERROR_BODY_MAX = 1024
#: A 429's Retry-After is honoured up to this many seconds.
MAX_RETRY_AFTER_S = 300.0
#: How long :meth:`RemoteWriter.close` lets the senders empty the buffer, by default.
CLOSE_TIMEOUT_S = 5.0
LOG_REPEAT_S = 300.0


# Masks the receivers' URLs (userinfo and query carry secrets) in httpx's and httpcore's own
# log lines, which quote the request URL whole: each URL is replaced by its redacted form.
_URL_FILTER = ReplacingFilter()
#: Query values this long or longer are masked on their own as well (shorter ones, such as
#: ``v=1``, would mask unrelated text and are no secret).
_MIN_SECRET_PIECE = 6
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(_URL_FILTER)


class RemoteWriteMetrics:
    """The ``tritonwatch_remote_write_*`` families, once per registry, labelled by remote."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(f"tritonwatch_remote_write_{name}", doc, ["remote"],
                           registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"tritonwatch_remote_write_{name}", doc, ["remote"], registry=registry)

        self.sent = counter("samples_sent", "Samples the receiver accepted (2xx)")
        self.failed = counter("samples_failed",
                              "Samples in requests the receiver refused with a 4xx other than "
                              "429 (not retried)")
        self.dropped = counter("samples_dropped",
                               "Samples dropped unsent: the on-disk buffer was full (oldest "
                               "first) or could not be written")
        self.retried = counter("samples_retried",
                               "Samples in requests sent again after a 5xx, 429 or connection "
                               "error")
        self.pending = gauge("pending_samples", "Samples waiting to be sent (batches and "
                             "on-disk buffer)")
        self.buffer_bytes = gauge("buffer_bytes", "Bytes of the on-disk buffer")
        self.lag = gauge("lag_seconds", "Age of the oldest unsent sample (0 when none waits)")
        self.last_send = gauge("last_send_timestamp_seconds",
                               "When the receiver last accepted a request (unix seconds)")
        self.shards = gauge("shards", "Parallel senders")


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, RemoteWriteMetrics] = (
    weakref.WeakKeyDictionary())
_METRICS_LOCK = threading.Lock()


def metrics_for(registry: CollectorRegistry) -> RemoteWriteMetrics:
    # Several receivers share one registry: the families are registered once.
    with _METRICS_LOCK:
        found = _METRICS.get(registry)
        if found is None:
            found = _METRICS[registry] = RemoteWriteMetrics(registry)
        return found


def classify(status: int) -> str:
    """``"ok"``, ``"retry"`` (5xx, 429) or ``"fail"`` (every other status)."""
    if 200 <= status < 300:
        return "ok"
    if status >= 500 or status == 429:
        return "retry"
    return "fail"


def default_buffer_dir(store_url: str, name: str) -> Path:
    """``remote-write/<name>`` beside a SQLite file, else under ``tritonwatch-data``."""
    from tritonwatch.schemas.config import DEFAULT_DATA_DIR

    if store_url.startswith("sqlite:///"):
        return Path(store_url.removeprefix("sqlite:///")).parent / "remote-write" / name
    return DEFAULT_DATA_DIR / "remote-write" / name


class RemoteWriter:
    """Sends every appended sample to one receiver (see the module docstring)."""

    def __init__(
        self,
        config: RemoteWriteConfig,
        buffer_dir: Path,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.url_redacted = redact_url_text(config.url)
        if self.url_redacted != config.url:
            # httpx logs the URL as it sends it: without the userinfo (sent as a header).
            parts = urlsplit(config.url)
            userinfo, _, host = parts.netloc.rpartition("@")
            bare = urlunsplit(parts._replace(netloc=host))
            replacements = {config.url: self.url_redacted, bare: self.url_redacted}
            # The pieces too: another filter on the same logger (alerts/notify masks secret
            # query parameters) may have rewritten part of the URL first, and then the whole
            # URL no longer matches while its password or other query values still would.
            if userinfo:
                replacements[f"{userinfo}@"] = f"{REDACTED}@"
            for _, value in parse_qsl(parts.query):
                if len(value) >= _MIN_SECRET_PIECE:
                    replacements[value] = REDACTED
            _URL_FILTER.add(replacements)
        self.clock = clock
        self._transport = transport
        queue = config.queue
        shards = queue.shards
        # One sub-directory per shard; each is drained in order by its own sender.
        self.buffers = [
            SegmentBuffer(buffer_dir / f"shard-{k:02d}", max_bytes=max(
                2 * config.buffer.segment_size, config.buffer.max_size // shards),
                segment_bytes=config.buffer.segment_size)
            for k in range(shards)
        ]
        self._leftover = self._leftover_buffers(buffer_dir, shards)
        self._encoder = Encoder(shards, config.labels)
        self._batches = [Batch() for _ in range(shards)]
        self._batch_started: list[float | None] = [None] * shards
        self._lock = threading.Lock()
        self._limiter = RepeatLimiter(LOG_REPEAT_S)
        self._dropped_reported = 0
        metrics = metrics_for(registry or CollectorRegistry())
        self.m = metrics
        self._sent = metrics.sent.labels(self.name)
        self._failed = metrics.failed.labels(self.name)
        self._dropped = metrics.dropped.labels(self.name)
        self._retried = metrics.retried.labels(self.name)
        self._last_send = metrics.last_send.labels(self.name)
        metrics.pending.labels(self.name).set_function(lambda: float(self.pending()[0]))
        metrics.buffer_bytes.labels(self.name).set_function(
            lambda: float(sum(b.size for b in self.buffers)))
        metrics.lag.labels(self.name).set_function(self.lag)
        metrics.shards.labels(self.name).set(shards)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: list[asyncio.Event] = []
        self._stop: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()

    @staticmethod
    def _leftover_buffers(directory: Path, shards: int) -> dict[int, list[Path]]:
        # A buffer written with more shards than now: its shards' senders drain them first.
        found: dict[int, list[Path]] = {}
        if directory.is_dir():
            for path in sorted(directory.glob("shard-*")):
                suffix = path.name.removeprefix("shard-")
                if suffix.isdigit() and int(suffix) >= shards:
                    found.setdefault(int(suffix) % shards, []).append(path)
        return found

    # --- in: the collector's threads -----------------------------------------------------

    def append_columns(self, target: str, ts: float, names: list[str], labels: list[Labels],
                       values: NDArray[np.float64]) -> None:
        """One scrape, column-wise (``Store.write_columns``'s arguments)."""
        with self._lock:
            self._encoder.encode_columns(target, ts, names, labels, values, self._batches)
            self._after_add()

    def append(self, target: str, ts: float, samples: Iterable[Sample]) -> None:
        """Samples one by one (``Store.write``'s arguments)."""
        items = list(samples)
        if not items:
            return
        with self._lock:
            self._encoder.encode(target, ts, [s.name for s in items], [s.labels for s in items],
                                 [s.value for s in items], self._batches)
            self._after_add()

    def _after_add(self) -> None:
        now = time.monotonic()
        limit = self.config.queue.max_samples_per_send
        for k, batch in enumerate(self._batches):
            if batch.samples and self._batch_started[k] is None:
                self._batch_started[k] = now
            if batch.samples >= limit:
                self._seal(k)

    def _seal(self, k: int) -> None:
        """Move shard ``k``'s batch to its buffer, in requests of at most
        ``max_samples_per_send`` samples.  Called with the lock held."""
        batch = self._batches[k]
        self._batches[k] = Batch()
        self._batch_started[k] = None
        limit = self.config.queue.max_samples_per_send
        oldest = batch.oldest_ms or 0
        import cramjam  # here: only a configured receiver needs it (1.4 MB resident)

        for start in range(0, len(batch.parts), limit):
            parts = batch.parts[start:start + limit]
            body = bytes(cramjam.snappy.compress_raw(b"".join(parts)))
            try:
                self.buffers[k].append(body, len(parts), oldest)
            except OSError as exc:
                self._dropped.inc(len(parts))
                suppressed = self._limiter.check(("disk", k))
                if suppressed is not None:
                    log.error("remote-write %s: buffer %s could not be written (%s); %d "
                              "samples dropped%s", self.name, self.buffers[k].dir, exc,
                              len(parts), self._limiter.note(suppressed))
        self._count_buffer_drops()
        self._notify(k)

    def _count_buffer_drops(self) -> None:
        total = sum(b.dropped_samples for b in self.buffers)
        if total > self._dropped_reported:
            self._dropped.inc(total - self._dropped_reported)
            self._dropped_reported = total

    def seal_due(self, *, force: bool = False) -> None:
        """Send the batches older than ``batch_send_deadline`` (all of them with ``force``)."""
        deadline = self.config.queue.batch_send_deadline
        now = time.monotonic()
        with self._lock:
            for k, started in enumerate(self._batch_started):
                if started is not None and (force or now - started >= deadline):
                    self._seal(k)

    def forget_target(self, target: str) -> None:
        with self._lock:
            self._encoder.forget(target)

    # --- state ---------------------------------------------------------------------------

    def pending(self) -> tuple[int, int | None]:
        """(samples waiting, oldest such sample in ms or None)."""
        with self._lock:
            samples = sum(b.samples for b in self._batches)
            olds = [b.oldest_ms for b in self._batches if b.oldest_ms is not None]
        for buf in self.buffers:
            count, oldest = buf.pending()
            samples += count
            if oldest is not None:
                olds.append(oldest)
        return samples, (min(olds) if olds else None)

    def lag(self) -> float:
        _, oldest = self.pending()
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest / 1000.0)

    # --- out: the sender thread ----------------------------------------------------------

    def start(self) -> None:
        """Start the sender thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"remote-write-{self.name}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _notify(self, k: int) -> None:
        loop = self._loop
        if loop is not None and k < len(self._wake):
            with contextlib.suppress(RuntimeError):  # the loop has just closed
                loop.call_soon_threadsafe(self._wake[k].set)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = [asyncio.Event() for _ in self.buffers]
        self._stop = asyncio.Event()
        headers = dict(PROTOCOL_HEADERS)
        headers["User-Agent"] = "tritonwatch-remote-write/1"
        headers.update(self.config.headers)
        if self.config.bearer_token:
            headers["Authorization"] = f"Bearer {self.config.bearer_token}"
        auth = None
        if self.config.basic_auth is not None:
            auth = httpx.BasicAuth(self.config.basic_auth.username,
                                   self.config.basic_auth.password)
        client_args: dict[str, object] = {}
        if self._transport is not None:
            client_args["transport"] = self._transport
        async with httpx.AsyncClient(headers=headers, auth=auth,
                                     timeout=self.config.timeout,
                                     limits=httpx.Limits(max_connections=len(self.buffers)),
                                     **client_args) as client:  # type: ignore[arg-type]
            self._ready.set()
            tasks = [asyncio.create_task(self._sender(client, k))
                     for k in range(len(self.buffers))]
            tasks.append(asyncio.create_task(self._deadlines()))
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _deadlines(self) -> None:
        tick = min(1.0, self.config.queue.batch_send_deadline / 2)
        while True:
            await asyncio.sleep(tick)
            await asyncio.to_thread(self.seal_due)

    async def _sender(self, client: httpx.AsyncClient, k: int) -> None:
        sources = [SegmentBuffer(path, max_bytes=self.buffers[k].max_bytes,
                                 segment_bytes=self.buffers[k].segment_bytes)
                   for path in self._leftover.get(k, [])]
        for old in sources:
            await self._drain(client, k, old, leftover=True)
        await self._drain(client, k, self.buffers[k], leftover=False)

    async def _drain(self, client: httpx.AsyncClient, k: int, buf: SegmentBuffer,
                     *, leftover: bool) -> None:
        wake = self._wake[k]
        while True:
            record = await asyncio.to_thread(buf.peek)
            if record is None:
                if leftover:
                    buf.close()
                    with contextlib.suppress(OSError):
                        for path in buf.dir.iterdir():
                            path.unlink()
                        buf.dir.rmdir()
                    return
                wake.clear()
                # Re-check after clearing: an append between peek and clear set the event.
                if buf.pending()[0] == 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), timeout=1.0)
                continue
            await self._send(client, k, buf, record)

    async def _send(self, client: httpx.AsyncClient, k: int, buf: SegmentBuffer,
                    record: Record) -> None:
        """Send ``record`` until the receiver takes it or refuses it for good."""
        queue = self.config.queue
        backoff = queue.min_backoff
        attempt = 0
        while True:
            attempt += 1
            if attempt > 1:
                self._retried.inc(record.samples)
            pause = backoff
            try:
                async with client.stream("POST", self.config.url,
                                         content=record.payload) as response:
                    status = response.status_code
                    verdict = classify(status)
                    body = b""
                    if verdict != "ok":
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) >= ERROR_BODY_MAX:
                                break
                    retry_after = response.headers.get("Retry-After", "")
            except httpx.HTTPError as exc:
                verdict, status, body, retry_after = "retry", 0, b"", ""
                reason = f"{type(exc).__name__}: {log_safe(str(exc), 200)}"
            else:
                reason = f"HTTP {status}: {log_safe(body.decode('utf-8', 'replace'), 500)}"
            if verdict == "ok":
                buf.commit(record)
                self._sent.inc(record.samples)
                self._last_send.set(self.clock())
                if attempt > 1:
                    log.info("remote-write %s: %s takes samples again after %d attempts",
                             self.name, self.url_redacted, attempt)
                    self._limiter.forget(("retry", k))
                return
            if verdict == "fail":
                buf.commit(record)
                self._failed.inc(record.samples)
                suppressed = self._limiter.check(("fail", status))
                if suppressed is not None:
                    log.error("remote-write %s: %s refused a request of %d samples (not "
                              "retried): %s%s", self.name, self.url_redacted, record.samples,
                              reason, self._limiter.note(suppressed))
                return
            if status == 429 and retry_after.strip().isdigit():
                pause = max(pause, min(float(retry_after.strip()), MAX_RETRY_AFTER_S))
            suppressed = self._limiter.check(("retry", k))
            if suppressed is not None:
                log.warning("remote-write %s: %s failed (%s); retrying with back-off, samples "
                            "are kept in %s%s", self.name, self.url_redacted, reason, buf.dir,
                            self._limiter.note(suppressed))
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, queue.max_backoff)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Move every batch to the buffer, let the senders work up to ``timeout`` seconds
        while anything is unsent, then stop them; what is left stays on disk."""
        self.seal_due(force=True)
        deadline = time.monotonic() + timeout
        while self._thread is not None and time.monotonic() < deadline and self.pending()[0]:
            time.sleep(0.05)
        loop, stop = self._loop, self._stop
        if self._thread is not None and loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
            self._thread.join(10)
        self._thread = None
        for buf in self.buffers:
            buf.close()
        left = self.pending()[0]
        if left:
            log.warning("remote-write %s: %d samples not yet sent to %s stay in %s for the "
                        "next start", self.name, left, self.url_redacted,
                        self.buffers[0].dir.parent)


class RemoteWrite:
    """Every configured receiver; what the collector calls beside each store write."""

    def __init__(self, writers: Sequence[RemoteWriter]) -> None:
        self.writers = list(writers)

    @classmethod
    def from_config(cls, configs: Sequence[RemoteWriteConfig], store_url: str, *,
                    registry: CollectorRegistry) -> RemoteWrite:
        return cls([
            RemoteWriter(c, Path(c.buffer.dir) if c.buffer.dir
                         else default_buffer_dir(store_url, c.name), registry=registry)
            for c in configs
        ])

    def __bool__(self) -> bool:
        return bool(self.writers)

    def append_columns(self, target: str, ts: float, names: list[str], labels: list[Labels],
                       values: NDArray[np.float64]) -> None:
        for writer in self.writers:
            writer.append_columns(target, ts, names, labels, values)

    def append(self, target: str, ts: float, samples: Sequence[Sample]) -> None:
        for writer in self.writers:
            writer.append(target, ts, samples)

    def forget_target(self, target: str) -> None:
        for writer in self.writers:
            writer.forget_target(target)

    def send_now(self) -> None:
        """Seal every partial batch for sending now (``Store.flush`` on a TSDB store), rather
        than after ``batch_send_deadline``; returns without waiting for the send."""
        for writer in self.writers:
            writer.seal_due(force=True)

    def start(self) -> None:
        for writer in self.writers:
            writer.start()

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        for writer in self.writers:
            writer.close(timeout)
