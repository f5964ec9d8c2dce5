"""The ``remote_write:`` list of ``tritonwatch.yaml``: Prometheus remote-write 1.0 receivers.

Example::

    remote_write:
      - name: vm
        url: http://victoria-metrics:8428/api/v1/write
        bearer_token: ${VM_TOKEN}          # or basic_auth: {username: ..., password: ...}
        labels: {cluster: eu-1}            # added to every series that lacks the label
        queue: {shards: 4, max_samples_per_send: 2000, batch_send_deadline: 5s}
        buffer: {max_size: 2GiB}           # on disk: holds an outage, then drops oldest first

Every sample the collector stores (raw Triton series, derived SLIs, ``up`` and its siblings,
probe series) also goes to each receiver, through an on-disk buffer per receiver.  Secrets
(password, token, header values) are never logged; an error names the receiver and its URL
with userinfo and query masked.  No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, model_validator

from tritonwatch.schemas.values import ByteSize, Frozen, Headers, HttpUrl, PositiveDuration

#: Default on-disk buffer per receiver.  At the 1,000-target reference load (about 100,000
#: samples/s, about 10 bytes a sample once snappy has packed a request: measured in
#: tests/scale/test_remote_write_unit.py) 2 GiB hold about 2,100 s, so a 15-minute outage
#: loses nothing.
DEFAULT_BUFFER_BYTES = 2 * 1024**3



def one_authorization(basic_auth: object, bearer_token: str | None,
                      headers: Mapping[str, str]) -> None:
    """ValueError when more than one way of authorizing is set (basic auth, a bearer token,
    an Authorization header): which one a receiver sees would depend on the order they are
    applied in."""
    ways = [w for w, on in (("basic_auth", basic_auth is not None),
                            ("bearer_token", bearer_token is not None),
                            ("an Authorization header",
                             any(h.lower() == "authorization" for h in headers)))
            if on]
    if len(ways) > 1:
        raise ValueError(f"set one of {' and '.join(ways)}, not both")

class BasicAuth(Frozen):
    """HTTP basic authentication for one receiver."""

    username: str = Field(min_length=1, max_length=1000)
    password: str = Field(default="", max_length=10_000, repr=False)
    """Never logged; put it in the environment (``${RW_PASSWORD}``)."""


class RemoteWriteQueue(Frozen):
    """How samples leave: in parallel shards, in batches, retried with back-off."""

    shards: int = Field(default=4, ge=1, le=64)
    """Parallel senders.  A series always goes through the same shard (a stable hash of its
    labels), so its samples arrive in order, as receivers such as Prometheus require."""
    max_samples_per_send: int = Field(default=2000, ge=1, le=100_000)
    """Samples in one request, at most (Prometheus's default)."""
    batch_send_deadline: PositiveDuration = 5.0
    """A shard's partial batch is sent after at most this long."""
    min_backoff: PositiveDuration = 0.03
    """First pause after a retryable failure (5xx, 429, connection error); it doubles each
    retry up to ``max_backoff`` (Prometheus's defaults)."""
    max_backoff: PositiveDuration = 5.0
    """Longest pause between two retries of one request (a 429's ``Retry-After`` may ask for
    longer, up to 5 minutes)."""

    @model_validator(mode="after")
    def _backoff_order(self) -> RemoteWriteQueue:
        if self.min_backoff > self.max_backoff:
            raise ValueError(f"min_backoff ({self.min_backoff:g}s) must not exceed "
                             f"max_backoff ({self.max_backoff:g}s)")
        return self


class RemoteWriteBuffer(Frozen):
    """The on-disk queue of one receiver: requests wait here, compressed, until sent."""

    dir: str | None = None
    """Directory of the buffer's segment files; default ``remote-write/<name>`` beside the
    SQLite file, or ``tritonwatch-data/remote-write/<name>`` for PostgreSQL.  Each receiver
    (and each serve process) needs its own."""
    max_size: ByteSize = DEFAULT_BUFFER_BYTES
    """Bytes on disk at most.  Past it the oldest segment is dropped (counted in
    ``tritonwatch_remote_write_samples_dropped_total``); size it as samples/s x outage
    seconds x bytes per sample (README "Remote write")."""
    segment_size: ByteSize = 8 * 1024**2
    """Bytes per segment file; the buffer drops whole segments, so this is its granularity."""

    @model_validator(mode="after")
    def _segments_fit(self) -> RemoteWriteBuffer:
        if self.segment_size * 2 > self.max_size:
            raise ValueError(f"max_size ({self.max_size} bytes) must hold at least two "
                             f"segments of segment_size ({self.segment_size} bytes)")
        return self


class RemoteWriteConfig(Frozen):
    """One Prometheus remote-write receiver (VictoriaMetrics, Mimir, Thanos receive,
    Prometheus with ``--web.enable-remote-write-receiver``)."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")
    """Names the receiver in logs, metrics (``remote`` label) and its buffer directory."""
    url: HttpUrl = Field(repr=False)
    """The write endpoint (``.../api/v1/write``); logged with userinfo and query masked."""
    headers: Headers = Field(default_factory=dict, repr=False)
    """Extra HTTP headers (``X-Scope-OrgID`` for Mimir); values are never logged."""
    basic_auth: BasicAuth | None = Field(default=None, repr=False)
    bearer_token: str | None = Field(default=None, min_length=1, max_length=10_000, repr=False)
    """Sent as ``Authorization: Bearer ...``; never logged."""
    timeout: PositiveDuration = 30.0
    """Per-request deadline (Prometheus's ``remote_timeout``)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Added to every series that does not carry the label already (Prometheus's
    ``external_labels``)."""
    queue: RemoteWriteQueue = RemoteWriteQueue()
    buffer: RemoteWriteBuffer = RemoteWriteBuffer()

    @model_validator(mode="after")
    def _one_authorization(self) -> RemoteWriteConfig:
        one_authorization(self.basic_auth, self.bearer_token, self.headers)
        return self

    @model_validator(mode="after")
    def _label_names(self) -> RemoteWriteConfig:
        for key in self.labels:
            if not key or not (key[0].isascii() and (key[0].isalpha() or key[0] == "_")) or not all(
                ch.isascii() and (ch.isalnum() or ch == "_") for ch in key
            ) or key.startswith("__"):
                raise ValueError(f"labels: {key!r} is not a valid label name "
                                 "([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)")
        return self


class TimeseriesConfig(Frozen):
    """``store.timeseries``: time series on a Prometheus-compatible TSDB (VictoriaMetrics,
    Mimir, Thanos, Prometheus).  Samples go out by remote-write to ``write_url`` (the queue and
    on-disk buffer of a ``remote_write`` receiver); the alert engine, API, dashboard and
    report read them by PromQL from ``query_url``; ``store.url`` (PostgreSQL) keeps the
    relational state."""

    write_url: HttpUrl = Field(repr=False)
    """Remote-write endpoint, e.g. ``http://vminsert:8480/insert/0/prometheus/api/v1/write``."""
    query_url: HttpUrl = Field(repr=False)
    """Prometheus HTTP API root (what precedes ``/api/v1/query``), e.g.
    ``http://vmselect:8481/select/0/prometheus`` or ``http://victoria-metrics:8428``."""
    headers: Headers = Field(default_factory=dict, repr=False)
    """Sent with writes and queries (``X-Scope-OrgID`` for Mimir); values never logged."""
    basic_auth: BasicAuth | None = Field(default=None, repr=False)
    bearer_token: str | None = Field(default=None, min_length=1, max_length=10_000, repr=False)
    timeout: PositiveDuration = 30.0
    """Per-request deadline of a write and of a query."""
    max_response_size: ByteSize = 256 * 1024**2
    """A query answer larger than this is refused (the read fails with the limit named)."""
    queue: RemoteWriteQueue = RemoteWriteQueue()
    buffer: RemoteWriteBuffer = RemoteWriteBuffer()

    @model_validator(mode="after")
    def _one_authorization(self) -> TimeseriesConfig:
        one_authorization(self.basic_auth, self.bearer_token, self.headers)
        return self

    def as_remote_write(self) -> RemoteWriteConfig:
        """The remote-write receiver that carries the store's samples (named ``store``)."""
        return RemoteWriteConfig(
            name="store", url=self.write_url, headers=self.headers, basic_auth=self.basic_auth,
            bearer_token=self.bearer_token, timeout=self.timeout, queue=self.queue,
            buffer=self.buffer)

    def auth_headers(self) -> dict[str, str]:
        """Headers of a query: ``headers`` plus the bearer token (basic auth goes apart)."""
        out = dict(self.headers)
        if self.bearer_token is not None:
            out["Authorization"] = f"Bearer {self.bearer_token}"
        return out
