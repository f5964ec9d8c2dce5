"""The ``Store``: buffered writes, health and model configs, queries; its schema and jobs.

Writes only touch memory: ``write()`` appends a scrape to a buffer and ``flush()`` (called by
the collector on a timer, and automatically once ``batch_rows`` samples are waiting) sends it in
two short transactions, one resolving new series, one appending the samples to the sample log
(one row per target and metric name, ``store.samplelog``), which maintenance moves into
per-series chunks every few minutes.

If a flush fails the samples go back to the front of the buffer and the next flush retries
them, so a database restart loses nothing unless the outage outlasts the buffer bound
(``10 * batch_rows`` samples; the oldest are dropped beyond it, with a warning).  A flush that
writes samples older than the rollup watermark moves the watermark back in the same transaction
(``maintenance.rewind_watermarks``), so late samples are rolled up too.

The roles live beside it: ``store.buffer`` (the three buffers), ``store.flush`` (the sample
flush and series ids), ``store.reads`` (``Query`` and its answers), ``store.records`` (health,
model configs, probe results), ``store.migrate`` (``Store.migrations``) and ``store.jobs``
(``Store.maintenance``: rollup, compaction, retention).

Values: NaN samples are skipped at ``write()`` (with a debug log).  SQLite cannot store NaN at
all (it reads it back as NULL), and in Triton/Prometheus output NaN means "no observation yet"
(e.g. a summary quantile), which a stored aggregate would turn into NaN sums and averages.
+Inf and -Inf are stored as they are: both backends keep them exactly, and they are meaningful
(a ``le="+Inf"`` bound, a gauge at its limit).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Container, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from operator import itemgetter
from typing import Any, NamedTuple, Protocol

import numpy as np
from sqlalchemy import Connection, Engine

from tritonwatch.schemas import tables as t
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import Labels, Sample, TargetHealth
from tritonwatch.store import query, records
from tritonwatch.store.buffer import Buffer
from tritonwatch.store.engine import (
    DEFAULT_STATEMENT_TIMEOUT_S,
    build_engine,
    interrupt_connections,
    parse_url,
    redact,
    refuse_connections,
    transaction,
)
from tritonwatch.store.errors import StoreError, db_errors
from tritonwatch.store.fairlock import FairLock
from tritonwatch.store.flush import (
    SERIES_CACHE_TTL_S,
    BufferedScrape,
    SampleWriter,
    SeriesRefused,
)
from tritonwatch.store.jobs import Maintenance
from tritonwatch.store.memory import HELD_SAMPLES, HeldWindow
from tritonwatch.store.migrate import Migrations
from tritonwatch.store.reads import Query, Reader, sums_of
from tritonwatch.store.values import SeriesColumns, SeriesKey, SeriesSums

log = logging.getLogger(__name__)

#: After a failed flush, ``write()`` waits this long before flushing automatically again, so
#: that a down database does not add a connect timeout to every scrape.
AUTO_FLUSH_BACKOFF_S = 5.0
#: Series whose samples :meth:`Store.read_batches` (and so :meth:`Store.finite_sums`) reads at
#: a time.  Measured on the failure rates of 300 targets (8,400 series; ``tracemalloc``): their
#: last 5 minutes, raw, 7.4 MiB read at once, 3.5 in batches of 500; their hour of 5-minute
#: buckets (mostly raw samples still in the sample log) 11.2 MiB at once, 8.8 in batches of
#: 500, 6.6 of 250 and 4.9 of 125, the last at a third more CPU than the others.
SUMS_BATCH = 250

_NAME = itemgetter(0)
_LABELS = itemgetter(1)
_VALUE = itemgetter(2)


def open_store(
    url: str, *, batch_rows: int = 50_000, timeout_s: float = 10.0,
    statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S, read_only: bool = False,
    scratch: bool = False, timeseries: TimeSeries | None = None,
    sink: SampleSink | None = None, series_ttl_s: float = SERIES_CACHE_TTL_S,
) -> Store:
    """Open the store at ``url``: ``sqlite:///path.db`` or ``postgresql://user:pw@host/db``.

    Connects lazily: a down database fails the first statement, not this call.
    ``timeout_s`` bounds how long a statement waits for SQLite's write lock, or for a
    PostgreSQL connection (new or from the pool); ``statement_timeout_s`` is PostgreSQL's
    ``statement_timeout`` (``store.engine`` explains how a server that stops answering is
    caught).  ``read_only``: the database refuses every write (the dashboard).  ``scratch``:
    a throwaway SQLite file with no journal and no fsync (``replay``; lost on a crash).
    ``timeseries`` and ``sink``: time series live on a TSDB (``store.tsdb``) or in memory
    (``store.memory``, replay's scratch store), samples go to ``sink`` and reads to
    ``timeseries``; the database keeps the relational state only.  ``series_ttl_s``: how long
    a target's series ids are kept before they are resolved again (which marks them in use
    for retention): shorter than the raw retention, ``RetentionConfig.series_cache_ttl``.
    Raises ValueError for an unsupported URL or a negative ``series_ttl_s``.
    """
    return Store(url, batch_rows=batch_rows, timeout_s=timeout_s,
                 statement_timeout_s=statement_timeout_s, read_only=read_only,
                 scratch=scratch, timeseries=timeseries, sink=sink, series_ttl_s=series_ttl_s)


class TimeSeries(Protocol):
    """Where a store with its time series elsewhere reads them: a TSDB
    (``store.tsdb.TsdbReader``) or this process's memory (``store.memory.MemorySeries``),
    answering as the SQL ``Reader`` does."""

    def find(self, q: Query, *, window: tuple[int, int] | None = None) -> list[SeriesKey]: ...

    def read(self, q: Query) -> SeriesColumns: ...

    def increase(self, q: Query) -> list[tuple[SeriesKey, float, int, int]]: ...

    def series_page(self, q: Query, *, after: SeriesKey | None,
                    limit: int | None) -> list[SeriesKey]: ...

    def close(self) -> None: ...


class SampleSink(Protocol):
    """Where a store with its time series on a TSDB sends samples: the remote-write queue
    (``collector.remote_write``, wired by ``tritonwatch/serve.py``), NaN already left out."""

    def append_columns(self, target: str, ts: float, names: list[str], labels: list[Labels],
                       values: np.ndarray[Any, np.dtype[np.float64]]) -> None: ...

    def send_now(self) -> None:
        """Start sending what is queued (``flush()``), without waiting for it to arrive."""


class Pending(NamedTuple):
    """What a store held unwritten when :meth:`Store.drain` took it (e.g. for a spill file)."""

    scrapes: list[BufferedScrape]
    health: list[TargetHealth]
    probe_rows: list[dict[str, Any]]
    #: What a flush was still writing, not in the lists above (samples, health rows, probe
    #: results): lost if that flush never ends.
    in_flight: tuple[int, int, int] = (0, 0, 0)

    @property
    def samples(self) -> int:
        return sum(map(_scrape_samples, self.scrapes))

    def __bool__(self) -> bool:
        return bool(self.scrapes or self.health or self.probe_rows)

    def describe(self) -> str:
        """``"N samples, H health rows and P probe results"``, for log lines."""
        return (f"{self.samples} samples, {len(self.health)} health rows and "
                f"{len(self.probe_rows)} probe results")


def _scrape_samples(scrape: BufferedScrape) -> int:
    """A buffered scrape's weight: its samples that are not NaN."""
    return len(scrape[4]) - scrape[5]


class Store:
    """Buffered writes and the query layer over one database.  Thread-safe.

    Its schema is :attr:`migrations` (``store.migrate``), its periodic jobs
    :attr:`maintenance` (``store.jobs``).
    """

    def __init__(
        self, url: str, *, batch_rows: int = 50_000, timeout_s: float = 10.0,
        statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
        read_only: bool = False, scratch: bool = False,
        timeseries: TimeSeries | None = None, sink: SampleSink | None = None,
        series_ttl_s: float = SERIES_CACHE_TTL_S,
    ) -> None:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows!r}")
        if not series_ttl_s >= 0:
            raise ValueError(f"series_ttl_s must be 0 or more seconds, got {series_ttl_s!r}")
        parsed = parse_url(url)
        #: The URL with its password masked: safe for logs and error messages.
        self.url_redacted = redact(parsed)
        self._engine = build_engine(
            parsed, timeout_s=timeout_s, statement_timeout_s=statement_timeout_s,
            read_only=read_only, scratch=scratch,
        )
        self._batch_rows = batch_rows
        max_rows = 10 * batch_rows
        self._lock = threading.Lock()  # guards the three buffers, so drain() takes them at once
        # One flush at a time; guards the writer's layouts; the write gate (store.fairlock).
        self._flush_lock = FairLock()
        self._samples: Buffer[BufferedScrape] = Buffer(
            owner=self.url_redacted, bound=max_rows, lock=self._lock, weight=_scrape_samples,
            on_drop=lambda n: log.warning(
                "store: buffer over %d samples while %s is unavailable; dropped the oldest %d",
                max_rows, self.url_redacted, n),
        )
        self._health: Buffer[TargetHealth] = Buffer(
            owner=self.url_redacted, bound=max_rows, lock=self._lock)
        self._probes: Buffer[dict[str, Any]] = Buffer(
            owner=self.url_redacted, bound=max_rows, lock=self._lock,
            on_drop=lambda n: log.warning("store: dropped the oldest %d probe results", n),
        )
        self._buffers = (self._samples, self._health, self._probes)
        self._retry_after = 0.0
        self._closed = False
        self._health_up: records.HealthUp | None = None  # stored up, per (target, source)
        self._reader = Reader(scratch=scratch)
        #: A scratch store's latest health by ``(after, limit)``: it has one writer, its own,
        #: so an answer holds until its next health write (replay reads it every evaluation).
        self._health_memo: dict[tuple[Any, ...], list[TargetHealth]] | None = (
            {} if scratch else None)
        self._health_gen = 0
        #: With a TSDB, samples go to ``_sink`` and time-series reads to ``_tsdb``; rollups,
        #: compaction and retention of samples are then the TSDB's (the SQL tables stay empty).
        self._tsdb = timeseries
        self._sink = sink
        self._held: HeldWindow | None = None  # within ``held()``
        self._writer = SampleWriter(self._engine, self._reader, ttl_s=series_ttl_s)
        #: Creates the schema and upgrades an older one (``store.migrate``).
        self.migrations = Migrations(self._engine, self.url_redacted)
        #: Rollup, compaction and retention (``store.jobs``).
        self.maintenance = Maintenance(
            self._engine, self.url_redacted, batch_rows=batch_rows, gate=self._flush_lock,
            reader=self._reader, writer=self._writer,
        )

    def __repr__(self) -> str:
        return f"Store({self.url_redacted!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def series_ttl_s(self) -> float:
        """Seconds a target's series ids are kept before they are resolved again."""
        return self._writer.ttl_s

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    @property
    def buffered(self) -> int:
        """Samples written but not yet flushed."""
        return self._samples.total

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        """Flush what is buffered (unless ``flush`` is False), then release the connections.

        Raises StoreError if that last flush fails (the samples are then lost; ``serve``
        drains them into a spill file first, see :meth:`drain`).
        """
        if self._closed:
            return
        try:
            if flush:
                self.flush()
        finally:
            self._closed = True
            for buffer in self._buffers:
                buffer.close()
            self._engine.dispose()
            if self._tsdb is not None:
                self._tsdb.close()

    def interrupt(self) -> int:
        """End the database calls in progress now, and fail later ones at once until
        :meth:`resume`: PostgreSQL connections are cut (busy and idle), so a thread blocked on
        a server that stopped answering gets a StoreError (a flush puts its samples back in
        the buffer) instead of waiting for a new connection.  Returns the connections cut.

        On SQLite nothing is cut: its waits end with its busy timeout.
        """
        refuse_connections(self._engine)
        cut = interrupt_connections(self._engine)
        if cut:
            log.warning("store: cut %d connection(s) to %s", cut, self.url_redacted)
        return cut

    def resume(self) -> None:
        """Connect again after :meth:`interrupt`."""
        refuse_connections(self._engine, False)

    def abort(self) -> None:
        """:meth:`interrupt` for good: what is still buffered stays for :meth:`drain`."""
        self.interrupt()

    def drain(self) -> Pending:
        """Take everything buffered out of the store (samples, health, probe results).

        For a store that cannot be written: the caller saves it elsewhere (``store.spill``)
        and :meth:`restore` puts it back later.
        """
        with self._lock:
            scrapes, s = self._samples.drain_locked()
            health, h = self._health.drain_locked()
            probes, p = self._probes.drain_locked()
        return Pending(scrapes, health, probes, (s, h, p))

    def restore(self, pending: Pending) -> None:
        """Buffer what :meth:`drain` took (e.g. read back from a spill file), oldest first,
        ahead of anything buffered since; written by the next :meth:`flush`.

        The buffers' bound applies as to :meth:`write` (the oldest entries beyond it are
        dropped, with a warning).
        """
        self._samples.restore(pending.scrapes)
        self._health.restore(pending.health)
        self._probes.restore(pending.probe_rows)

    # --- writes ------------------------------------------------------------------------------

    def write(self, target: str, ts: float, samples: Iterable[Sample]) -> int:
        """Buffer one scrape of ``target`` taken at ``ts`` (unix s); returns samples buffered.

        Never touches the database unless the buffer is full, and even then a failing
        automatic flush is logged, not raised: the samples stay buffered for the next flush.
        """
        items = list(samples)
        values = np.fromiter(map(_VALUE, items), np.float64, len(items))
        return self.write_columns(
            target, ts, list(map(_NAME, items)), list(map(_LABELS, items)), values
        )

    def write_columns(
        self,
        target: str,
        ts: float,
        names: list[str],
        labels: list[Labels],
        values: np.ndarray[Any, np.dtype[np.float64]],
    ) -> int:
        """:meth:`write` for a scrape given as columns: ``names[i]{labels[i]} = values[i]``.

        The lists are kept as given until the flush (callers pass lists they never mutate);
        passing the same list objects scrape after scrape lets the flush recognise an unchanged
        series list without comparing it.
        """
        self._samples.check_open()
        n = len(values)
        if not (len(names) == len(labels) == n):
            raise ValueError(
                f"write_columns: {len(names)} names, {len(labels)} label sets, {n} values"
            )
        if not n:
            return 0
        nan = int(np.count_nonzero(np.isnan(values)))
        if nan:
            log.debug("store: skipped %d NaN samples of %s", nan, target)
            if nan == n:
                return 0
        if self._sink is not None:
            if nan:
                keep = ~np.isnan(values)
                at = np.flatnonzero(keep).tolist()
                names, labels, values = [names[i] for i in at], [labels[i] for i in at], \
                    values[keep]
            self._sink.append_columns(target, ts, names, labels, values)
            return n - nan
        buffered = self._samples.add([(target, round(ts * 1000), names, labels, values, nan)])
        if buffered >= self._batch_rows and time.monotonic() >= self._retry_after:
            self._auto_flush()
        return n - nan

    def write_health(self, h: TargetHealth) -> None:
        """Record the latest scrape outcome of ``(h.target, h.source)``, logging up/down flips.

        Buffered like samples (a scrape never waits for the database): written by the next
        ``flush()``, and by ``health()`` / ``health_log()`` before they read.
        """
        self._health.add([h])

    def write_probe_results(self, results: Iterable[ProbeResult]) -> int:
        """Buffer probe results for ``probe_results``; written by the next ``flush()``.

        Like samples, rows of a failed flush stay buffered (up to ``10 * batch_rows``).
        """
        self._probes.check_open()
        rows = [records.probe_row(r) for r in results]
        self._probes.add(rows)
        return len(rows)

    def put_model_config(
        self, target: str, model: str, config: Mapping[str, Any], fetched_at: float
    ) -> None:
        """Store the latest configuration of ``model`` on ``target`` (replacing the previous)."""
        with write_transaction(self, "write model config") as conn:
            records.put_model_config(conn, target, model, config, fetched_at)

    def limit_series(
        self, limits: Mapping[str, int], on_refused: SeriesRefused | None = None
    ) -> None:
        """Cap the distinct series each target of ``limits`` may have in the store.

        A flush creates no series that would take a target past its limit: the samples of
        those series are dropped (``on_refused`` is told how many), the target's existing
        series keep being written.  A refused series is asked about again when its target's
        layout is resolved again (every :attr:`series_ttl_s`, or after retention removed
        series), so room freed by retention is taken up.  Targets not in ``limits``, and
        limits of 0, are not capped.  Replaces any earlier limits.
        """
        with self._flush_lock:
            self._writer.limit_series(limits, on_refused)

    def flush(self) -> int:
        """Write everything buffered; returns the number of samples written.

        On failure the samples stay buffered (up to the bound) and StoreError is raised.
        """
        with self._flush_lock:
            written = self._flush_samples_locked()
            if self._sink is not None:
                # Readers (the alert engine flushes first) see the samples once they arrive.
                self._sink.send_now()
            self._flush_health_locked()
            self._flush_probes_locked()
            return written

    def _auto_flush(self) -> None:
        # Skip, rather than wait, if another thread is already flushing: it is writing our
        # samples' predecessors, and a scrape must not stall behind the database.
        if not self._flush_lock.acquire(blocking=False):
            return
        try:
            self._flush_samples_locked()
        except StoreError as exc:
            log.warning("store: automatic flush failed, samples kept for retry: %s", exc)
        finally:
            self._flush_lock.release()

    def _flush_samples_locked(self) -> int:
        try:
            with self._samples.flushing() as scrapes:
                if not scrapes:
                    return 0
                with self._db("flush"):
                    written = self._writer.write(scrapes)
        except StoreError:
            self._retry_after = time.monotonic() + AUTO_FLUSH_BACKOFF_S
            raise
        self._retry_after = 0.0
        return written

    def _flush_health_locked(self) -> int:
        with self._health.flushing() as pending:
            if not pending:
                return 0
            with self._db("write health"), transaction(self._engine, write=True) as conn:
                known = records.write_health(conn, pending, self._health_up)
        self._health_up = known
        self._health_gen += 1
        if self._health_memo is not None:
            self._health_memo.clear()
        return len(pending)

    def _flush_probes_locked(self) -> int:
        with self._probes.flushing() as rows:
            if not rows:
                return 0
            with self._db("flush probe results"), transaction(self._engine, write=True) as conn:
                conn.execute(t.probe_results.insert(), rows)
        return len(rows)

    # --- health, model configs, probe results --------------------------------------------------

    def health(
        self,
        *,
        targets: Container[str] | None = None,
        after: tuple[str, str] | None = None,
        limit: int | None = None,
    ) -> list[TargetHealth]:
        """The latest outcome of every (target, source), sorted; only of ``targets`` if given,
        at most ``limit`` of them after the (target, source) ``after`` (one page)."""
        memo = self._health_memo if targets is None else None
        if memo is None:
            return self._read_health(records.health_stmt(after), targets=targets, limit=limit)
        with self._flush_lock:
            self._flush_health_locked()
            gen = self._health_gen
            got = memo.get((after, limit))
        if got is None:
            got = self._read_health(records.health_stmt(after), limit=limit)
            with self._flush_lock:
                if gen == self._health_gen:  # no health written meanwhile
                    memo[(after, limit)] = got
        return list(got)

    def health_log(
        self, target: str | None = None, *, since: float | None = None
    ) -> list[TargetHealth]:
        """Up/down transitions (and each source's first report), oldest first."""
        return self._read_health(records.health_log_stmt(target, since))

    def _read_health(
        self, stmt: Any, *, targets: Container[str] | None = None, limit: int | None = None,
    ) -> list[TargetHealth]:
        with self._flush_lock:
            self._flush_health_locked()
        with self._db("read health"), transaction(self._engine, write=False) as conn:
            return records.read_health(conn, stmt, targets=targets, limit=limit)

    def model_configs(self, target: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
        """``{(target, model): config}`` for one target or all."""
        with self._db("read model configs"), transaction(self._engine, write=False) as conn:
            return records.model_configs(conn, target)

    def model_config_times(self, target: str | None = None) -> dict[tuple[str, str], float]:
        """``{(target, model): fetched_at}``: when each stored config's content was first
        written (writing the same content again keeps the time, so this is its latest change,
        or when the model's config was first read at all)."""
        with self._db("read model configs"), transaction(self._engine, write=False) as conn:
            return records.model_configs(conn, target, times=True)

    def probe_results(
        self,
        *,
        probe: str | None = None,
        start: float | None = None,
        end: float | None = None,
        limit: int = 10_000,
        newest_first: bool = False,
    ) -> list[ProbeResult]:
        """Flushed probe results, oldest first (``newest_first``: the newest ``limit``, newest
        first), optionally of one probe within ``[start, end]``."""
        with self._db("query probe results"), transaction(self._engine, write=False) as conn:
            return records.probe_results(conn, probe=probe, start=start, end=end, limit=limit,
                                         newest_first=newest_first)

    # --- queries (``store.reads``: flushed samples only) --------------------------------------

    def read(self, q: Query) -> SeriesColumns:
        """Samples of each series ``q`` selects in ``[q.start, q.end]`` as columns
        (:class:`store.values.SeriesColumns`; ``.series()`` for one list per series): raw, or
        aggregated into buckets when ``q.step`` is given (:class:`store.reads.Query`).  Series
        without samples in the window are left out."""
        got = self._read_elsewhere(q)
        return got if got is not None else self._read_sql(q)

    def _read_elsewhere(self, q: Query) -> SeriesColumns | None:
        """What the TSDB or the held window answers to ``q``; None: the database answers."""
        if self._tsdb is not None:
            return self._tsdb.read(q)
        held = self._held
        return None if held is None else held.read(q)

    def _read_sql(self, q: Query) -> SeriesColumns:
        with self._read_transaction(q) as conn:
            return self._reader.read(conn, q)

    @contextmanager
    def _read_transaction(self, q: Query) -> Iterator[Connection]:
        with self._db("query buckets" if q.step is not None else "query range"), \
                transaction(self._engine, write=False) as conn:
            yield conn

    def read_batches(self, q: Query, *, batch: int = SUMS_BATCH) -> Iterator[SeriesColumns]:
        """What :meth:`read` answers, ``batch`` series at a time, in key order (the batches
        joined are the whole read): a rule that reduces every series of a name to a few
        numbers per group (``alerts.history.group_grid``) holds one batch's samples at a
        time, not every series' (the requests of 1,000 targets by failure reason: 35,000
        series).  ``q.max_samples`` bounds the whole read.  A TSDB or a held window answers
        in one batch.  Iterate it at once: on the database, the read's transaction stays open
        until the last batch (one snapshot for all of them)."""
        got = self._read_elsewhere(q)
        if got is not None:
            yield got
            return
        with self._read_transaction(q) as conn:
            yield from self._reader.read_batches(conn, q, batch=batch)

    def finite_sums(self, q: Query, *, after: float = -math.inf,
                    batch: int = SUMS_BATCH) -> SeriesSums:
        """Per series ``q`` selects: the sum and the number of its finite samples (with a
        ``step``, of its buckets) in the window stamped after ``after``; series without any in
        the window are left out.  What ``read(q).finite_sums(after)`` answers, with only
        ``batch`` series' samples read into memory at a time (:meth:`read_batches`): a rule's
        mean of every target's last minutes (the failure rates by reason of 1,000 targets:
        28,000 series, some 24 MiB of columns at once) costs one batch's columns, not all of
        them."""
        return sums_of(self.read_batches(q, batch=batch), after)

    def increase(self, q: Query) -> list[tuple[SeriesKey, float]]:
        """Reset-aware increase of each counter ``q`` selects over its samples in the window.

        A drop is a counter reset: the new value counts as the increase since the reset, as in
        Prometheus.  Series with fewer than two samples in the window are left out.
        """
        return [(key, inc) for key, inc, _, _ in self._increase(q)]

    def rate(self, q: Query) -> list[tuple[SeriesKey, float]]:
        """Per-second rate: increase divided by the time between the first and last sample.

        Unlike PromQL ``rate()`` there is no extrapolation to the window edges: the result is
        exactly what the samples show, which is what derived SLIs computed from consecutive
        scrapes agree with.
        """
        return [(key, inc / ((last - first) / 1000)) for key, inc, first, last in self._increase(q)]

    def _increase(self, q: Query) -> list[tuple[SeriesKey, float, int, int]]:
        if self._tsdb is not None:
            return self._tsdb.increase(q)
        held = self._held
        if held is not None:
            got = held.increase(q)
            if got is not None:
                return got
        with self._db("query increase"), transaction(self._engine, write=False) as conn:
            return self._reader.increase(conn, q)

    @contextmanager
    def held(self, *, max_samples: int = HELD_SAMPLES) -> Iterator[HeldWindow | None]:
        """Within it, time-series reads are answered from memory: each metric name's raw
        samples are read once per 6-hour span a read touches, up to ``max_samples`` in all
        (``store.memory.HeldWindow`` says which reads, with the same answers).  For reads of
        history that repeat (``backtest``), not for data still being written: samples flushed
        after their span was read are not seen until the end of the block.  A TSDB store
        answers as it does without it (None)."""
        if self._tsdb is not None:
            yield None
            return
        window = HeldWindow(self._read_sql, max_samples=max_samples)
        self._held = window
        try:
            yield window
        finally:
            self._held = None

    def series(self, q: Query | None = None) -> list[SeriesKey]:
        """The series ``q`` selects (all without it), sorted by key; its window is ignored."""
        if self._tsdb is not None:
            return self._tsdb.find(q or Query())
        with self._db("query series"), transaction(self._engine, write=False) as conn:
            return [key for _, key in self._reader.find(conn, q or Query())]

    def series_page(
        self, q: Query | None = None, *, after: SeriesKey | None = None, limit: int | None = None,
    ) -> list[SeriesKey]:
        """At most ``limit`` (None: all) series ``q`` selects after ``after``, ordered by
        target, name and stored label text: the catalogue one page at a time (keyset paging,
        ``query.select_page``).  With ``q.start`` or ``q.end``, only series with a sample in
        the window (at most ``q.max_samples`` read).  Selects by ``where``, not ``match``."""
        if self._tsdb is not None:
            return self._tsdb.series_page(q or Query(), after=after, limit=limit)
        with self._db("query series"), transaction(self._engine, write=False) as conn:
            return self._reader.series_page(conn, q or Query(), after=after, limit=limit)

    def count_samples(self) -> int:
        """Raw samples stored (all series, all time).

        A sample stored twice and not compacted yet (a re-sent scrape, a retried flush whose
        commit had succeeded) counts twice; queries return it once.
        """
        with self._db("count samples"), transaction(self._engine, write=False) as conn:
            return query.count_samples(conn)

    # --- errors ------------------------------------------------------------------------------

    def _db(self, action: str) -> AbstractContextManager[None]:
        """Driver and SQLAlchemy errors as StoreError naming the redacted URL."""
        return db_errors(action, self.url_redacted)


@contextmanager
def write_transaction(store: Store, action: str) -> Iterator[Connection]:
    """A write transaction of a writer of this process other than the flush (alert states and
    events, reports, model configs), behind the store's write gate; errors as StoreError
    naming ``action``.

    On SQLite the gate is the flush lock, which maintenance also takes around each of its
    transactions.  SQLite has one writer at a time, and a writer that finds the lock taken
    polls for it (the busy handler sleeps up to 100 ms between tries) while a thread that
    commits and begins again takes it back at once: behind compaction's back-to-back
    transactions (160 s of them each hour at 1,000 targets) an alert evaluation's save gave
    up after the busy timeout ("database is locked").  Waiting on the lock (handed out in
    the order asked, ``store.fairlock``), it gets the next turn.  PostgreSQL writers do not
    exclude each other: nothing to hold there.  Never entered while holding the flush lock.
    """
    gate: AbstractContextManager[Any] = (
        store._flush_lock if store._engine.dialect.name == "sqlite" else nullcontext())
    with db_errors(action, store.url_redacted), gate, \
            transaction(store._engine, write=True) as conn:
        yield conn


def engine_of(store: Store) -> Engine:
    """The store's SQLAlchemy engine: package-private, for the other modules of ``store/``
    (``store.alerts``, ``store.reports``), which share its connections.  Nothing outside
    ``store/`` may hold it: SQL stays in this package (tests that corrupt a database on
    purpose reach it through ``tests/store_sql.py``)."""
    return store._engine
