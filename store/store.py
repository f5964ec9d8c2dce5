"""The ``Store``: buffered writes, health and model configs, queries, rollups, retention.

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

Values: NaN samples are skipped at ``write()`` (with a debug log).  SQLite cannot store NaN at
all (it reads it back as NULL), and in Triton/Prometheus output NaN means "no observation yet"
(e.g. a summary quantile), which a stored aggregate would turn into NaN sums and averages.
+Inf and -Inf are stored as they are: both backends keep them exactly, and they are meaningful
(a ``le="+Inf"`` bound, a gauge at its limit).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Container, Iterable, Mapping
from contextlib import AbstractContextManager, closing
from operator import itemgetter
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import Connection, Engine, literal, select, tuple_

from tritonwatch.schemas import tables as t
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import Labels, Sample, TargetHealth
from tritonwatch.schemas.untrusted import db_text
from tritonwatch.store import maintenance, migrate, query, samplelog
from tritonwatch.store.chunks import sort_keep_last
from tritonwatch.store.engine import (
    DEFAULT_STATEMENT_TIMEOUT_S,
    build_engine,
    interrupt_connections,
    parse_url,
    redact,
    refuse_connections,
    transaction,
)
from tritonwatch.store.errors import QueryError, StoreError, db_errors
from tritonwatch.store.values import SeriesColumns, SeriesData, SeriesKey
from tritonwatch.store.write import (
    REFUSED,
    UNRESOLVED,
    Layout,
    SeriesKeyTuple,
    dialect_insert,
    name_index,
    next_seq,
    resolve_series,
    sample_columns,
    target_groups,
    within_series_limits,
)

log = logging.getLogger(__name__)

#: The series-id cache is dropped this often so that each writer re-resolves (and so marks as
#: in use, see ``maintenance.delete_empty_series``) every series it writes.  Raw retention must
#: be longer than this.
SERIES_CACHE_TTL_S = 600.0

#: Series resolved per statement (and transaction), and the most series whose layouts expire
#: in one flush.
RESOLVE_SLICE = 20_000

#: Samples a flush encodes before inserting them (whole targets, one log row each).
FLUSH_GROUP_SAMPLES = 65_536

#: After a failed flush, ``write()`` waits this long before flushing automatically again, so
#: that a down database does not add a connect timeout to every scrape.
AUTO_FLUSH_BACKOFF_S = 5.0


# Arbitrary constant key for pg_advisory_xact_lock around schema creation.
_PG_LOCK_SCHEMA = 0x7477_0000

#: One buffered scrape, column-wise: (target, ts_ms, sample names, label tuples, values, how
#: many values are NaN).
BufferedScrape = tuple[
    str, int, list[str], list[Labels], np.ndarray[Any, np.dtype[np.float64]], int
]
_Chunk = BufferedScrape

#: Told, after a flush that dropped samples of series a target's series limit refused:
#: ``(target, series refused, samples dropped)``.  Called in the flushing thread.
SeriesRefused = Callable[[str, int, int], None]

_NAME = itemgetter(0)
_LABELS = itemgetter(1)
_VALUE = itemgetter(2)


def open_store(
    url: str, *, batch_rows: int = 50_000, timeout_s: float = 10.0,
    statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S, read_only: bool = False,
    scratch: bool = False,
) -> Store:
    """Open the store at ``url``: ``sqlite:///path.db`` or ``postgresql://user:pw@host/db``.

    Connects lazily: a down database fails the first statement, not this call.
    ``timeout_s`` bounds how long a statement waits for SQLite's write lock, or for a
    PostgreSQL connection (new or from the pool); ``statement_timeout_s`` is PostgreSQL's
    ``statement_timeout`` (``store.engine`` explains how a server that stops answering is
    caught).  ``read_only``: the database refuses every write (the dashboard).  ``scratch``:
    a throwaway SQLite file with no journal and no fsync (``replay``; lost on a crash).
    Raises ValueError for an unsupported URL.
    """
    return Store(url, batch_rows=batch_rows, timeout_s=timeout_s,
                 statement_timeout_s=statement_timeout_s, read_only=read_only,
                 scratch=scratch)


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
        return sum(len(values) - nan for _, _, _, _, values, nan in self.scrapes)

    def __bool__(self) -> bool:
        return bool(self.scrapes or self.health or self.probe_rows)

    def describe(self) -> str:
        """``"N samples, H health rows and P probe results"``, for log lines."""
        return (f"{self.samples} samples, {len(self.health)} health rows and "
                f"{len(self.probe_rows)} probe results")


class Store:
    """Buffered writes and the query layer over one database.  Thread-safe."""

    def __init__(
        self, url: str, *, batch_rows: int = 50_000, timeout_s: float = 10.0,
        statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
        read_only: bool = False, scratch: bool = False,
    ) -> None:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows!r}")
        parsed = parse_url(url)
        #: The URL with its password masked: safe for logs and error messages.
        self.url_redacted = redact(parsed)
        self._engine = build_engine(
            parsed, timeout_s=timeout_s, statement_timeout_s=statement_timeout_s,
            read_only=read_only, scratch=scratch,
        )
        self._batch_rows = batch_rows
        self._max_rows = 10 * batch_rows
        # A scratch store has one writer, this object: the series a query selects change only
        # when it creates series, so they are looked up once per (name, target, match) until
        # it does (replay repeats the same queries at every evaluation).
        self._series_memo: dict[tuple[Any, ...], list[tuple[int, SeriesKey]]] | None = (
            {} if scratch else None)
        self._series_gen = 0
        # Likewise the rollup watermarks, which only its own flushes and maintenance move.
        self._marks_memo: dict[int, int] | None = None
        self._lock = threading.Lock()  # guards the buffer
        self._flush_lock = threading.Lock()  # one flush at a time; guards the series cache
        self._buffer: deque[_Chunk] = deque()
        self._rows = 0
        self._layouts: dict[str, Layout] = {}  # per target, the last scrape's series and ids
        self._retry_after = 0.0
        self._closed = False
        self._probe_rows: list[dict[str, Any]] = []  # guarded by _lock, flushed with samples
        self._health_rows: list[TargetHealth] = []  # guarded by _lock, flushed with samples
        self._health_up: dict[tuple[str, str], bool] | None = None  # stored up, per source
        self._series_limits: dict[str, int] = {}  # guarded by _flush_lock
        self._on_refused: SeriesRefused | None = None
        # Samples, health rows and probe results a flush has taken out of the buffer and not
        # yet settled (guarded by _lock): what drain() cannot save if that flush never ends.
        self._in_flight = [0, 0, 0]
        # Set at shutdown: maintenance stops at its next batch boundary (request_stop).
        self._stopping = threading.Event()

    def __repr__(self) -> str:
        return f"Store({self.url_redacted!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    @property
    def sql_engine(self) -> Engine:
        """The SQLAlchemy engine, for the other modules of ``store/`` (e.g. ``store.alerts``)."""
        return self._engine

    @property
    def buffered(self) -> int:
        """Samples written but not yet flushed."""
        with self._lock:
            return self._rows

    # --- lifecycle ---------------------------------------------------------------------------

    def create_schema(self) -> None:
        """Create missing tables (idempotent, safe from several processes at once).

        A database of an older schema is upgraded in place: raw samples of version 1 (a
        ``samples`` row per sample) are moved into chunks in bounded transactions, which
        resume where they stopped if interrupted (``store.migrate``).
        """
        with self._db("create schema"):
            with transaction(self._engine, write=True) as conn:
                # Two processes starting at once would race to CREATE the same tables.
                maintenance.advisory_lock(conn, _PG_LOCK_SCHEMA)
                t.metadata.create_all(conn)
                stored = maintenance.get_meta(conn, "schema_version")
                if stored is None:
                    maintenance.set_meta(conn, "schema_version", str(t.SCHEMA_VERSION))
                elif int(stored) > t.SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.url_redacted}: schema version {stored} is newer than this "
                        f"tritonwatch understands ({t.SCHEMA_VERSION}); upgrade tritonwatch",
                        url=self.url_redacted,
                    )
            if stored is not None and int(stored) < t.SCHEMA_VERSION:
                log.info(
                    "store: upgrading %s from schema version %s to %d",
                    self.url_redacted, stored, t.SCHEMA_VERSION,
                )
            if migrate.has_legacy_samples(self._engine):
                migrate.samples_to_chunks(self._engine, lock_key=_PG_LOCK_SCHEMA)
            if stored is not None and int(stored) < t.SCHEMA_VERSION:
                with transaction(self._engine, write=True) as conn:
                    maintenance.advisory_lock(conn, _PG_LOCK_SCHEMA)
                    if int(stored) < 4:
                        # Under the lock, with the bump: a second process upgrading at once
                        # finds version 4 and marks nothing twice (harmless anyway).
                        migrate.recompress_chunks(conn)
                    maintenance.set_meta(conn, "schema_version", str(t.SCHEMA_VERSION))

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
            self._engine.dispose()

    # --- shutdown ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask maintenance (rollups, compaction, retention) to stop at its next batch boundary.

        Each batch commits on its own and the next run resumes where this one stopped, so
        stopping loses no work but the batch in progress (rolled back).  Flushes and reads
        are not affected.
        """
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

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
            pending = Pending(list(self._buffer), self._health_rows, self._probe_rows,
                              (self._in_flight[0], self._in_flight[1], self._in_flight[2]))
            self._buffer, self._rows = deque(), 0
            self._health_rows, self._probe_rows = [], []
        return pending

    def restore(self, pending: Pending) -> None:
        """Buffer what :meth:`drain` took (e.g. read back from a spill file), oldest first,
        ahead of anything buffered since; written by the next :meth:`flush`.

        The buffer's bound applies as to :meth:`write` (the oldest samples beyond it are
        dropped, with a warning).
        """
        if self._closed:
            raise StoreError(f"{self.url_redacted}: store is closed", url=self.url_redacted)
        with self._lock:
            scrapes = deque(pending.scrapes)
            scrapes.extend(self._buffer)
            self._buffer = scrapes
            self._rows += pending.samples
            self._trim_locked()
            self._health_rows[:0] = pending.health
            self._probe_rows[:0] = pending.probe_rows

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
        if self._closed:
            raise StoreError(f"{self.url_redacted}: store is closed", url=self.url_redacted)
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
        with self._lock:
            self._buffer.append((target, round(ts * 1000), names, labels, values, nan))
            self._rows += n - nan
            self._trim_locked()
            due = self._rows >= self._batch_rows
        if due and time.monotonic() >= self._retry_after:
            self._auto_flush()
        return n - nan

    def limit_series(
        self, limits: Mapping[str, int], on_refused: SeriesRefused | None = None
    ) -> None:
        """Cap the distinct series each target of ``limits`` may have in the store.

        A flush creates no series that would take a target past its limit: the samples of
        those series are dropped (``on_refused`` is told how many), the target's existing
        series keep being written.  A refused series is asked about again when its target's
        layout is resolved again (every ``SERIES_CACHE_TTL_S``, or after retention removed
        series), so room freed by retention is taken up.  Targets not in ``limits``, and
        limits of 0, are not capped.  Replaces any earlier limits.
        """
        with self._flush_lock:
            self._series_limits = {target: n for target, n in limits.items() if n > 0}
            self._on_refused = on_refused
            self._layouts.clear()  # resolved under the old limits

    def flush(self) -> int:
        """Write everything buffered; returns the number of samples written.

        On failure the samples stay buffered (up to the bound) and StoreError is raised.
        """
        with self._flush_lock:
            written = self._flush_locked()
            self._flush_health_locked()
            self._flush_probe_rows_locked()
            return written

    def _auto_flush(self) -> None:
        # Skip, rather than wait, if another thread is already flushing: it is writing our
        # samples' predecessors, and a scrape must not stall behind the database.
        if not self._flush_lock.acquire(blocking=False):
            return
        try:
            self._flush_locked()
        except StoreError as exc:
            log.warning("store: automatic flush failed, samples kept for retry: %s", exc)
        finally:
            self._flush_lock.release()

    def _flush_locked(self) -> int:
        with self._lock:
            chunks, self._buffer = self._buffer, deque()
            taken, self._rows = self._rows, 0
            self._in_flight[0] = taken
        if not chunks:
            return 0
        try:
            with self._db("flush"):
                written = self._write_chunks(chunks)
        except StoreError:
            with self._lock:
                # Put them back in front of anything written meanwhile, oldest first.
                chunks.extend(self._buffer)
                self._buffer = chunks
                self._rows += taken
                self._trim_locked()
            self._retry_after = time.monotonic() + AUTO_FLUSH_BACKOFF_S
            raise
        finally:
            with self._lock:
                self._in_flight[0] = 0
        self._retry_after = 0.0
        return written

    def _trim_locked(self) -> None:
        dropped = 0
        while self._rows > self._max_rows and len(self._buffer) > 1:
            _, _, _, _, values, nan = self._buffer.popleft()
            self._rows -= len(values) - nan
            dropped += len(values) - nan
        if dropped:
            log.warning(
                "store: buffer over %d samples while %s is unavailable; dropped the oldest %d",
                self._max_rows,
                self.url_redacted,
                dropped,
            )

    def _write_chunks(self, chunks: Iterable[_Chunk]) -> int:
        layouts = self._layouts
        now = time.monotonic()
        self._expire_layouts(now)
        # 1. Series ids.  A scrape listing the same series as its target's previous one (the
        # steady state) reuses that layout's ids; only a changed scrape hashes its keys.
        current: dict[str, Layout] = {}
        # Layouts with series to create, and which positions need an id.
        stale: dict[int, tuple[Layout, np.ndarray[Any, np.dtype[np.bool_]]]] = {}
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]] = []
        for target, ts_ms, names, labels, values, nan in chunks:
            prev = current.get(target) or layouts.get(target)
            lay = prev if prev is not None and prev.same(names, labels) else Layout(
                target, names, labels, prev, now=now
            )
            if lay.unresolved:
                # Series are created for values only: one that has only ever been NaN has none.
                need = lay.ids == UNRESOLVED
                if nan:
                    need &= ~np.isnan(values)
                if need.any():
                    entry = stale.get(id(lay))
                    if entry is None:
                        stale[id(lay)] = (lay, need)
                    else:
                        entry[1][:] |= need  # the same layout in an earlier buffered scrape
            current[target] = lay
            work.append((lay, ts_ms, values, nan))
        if not work:
            return 0
        if stale:
            self._resolve_layouts(list(stale.values()))
        layouts.update(current)
        refusals = self._refusals(work)
        if not sum(len(values) - nan for _, _, values, nan in work):
            return 0
        # 2. Per target, three columns: each series' samples together, in time order, encoded
        # as chunks (one per series, two if its samples straddle a full hour, see
        # ``store.chunks``) and packed into a ``sample_log`` row per name, all with this flush's new
        # write sequence number; the rows go in per group of targets, so that a flush never
        # holds all of its encoded samples at once (a 1,000-target flush built whole was a
        # 70 MB RSS spike every flush interval).  Readers take the log's chunks where they
        # overlap stored samples (the last write); maintenance moves them into
        # ``sample_chunks`` (``store.samplelog``).  A retried flush whose first commit did
        # succeed after all stores the same samples twice; the merge folds them together.
        written = 0
        lowest: int | None = None
        with transaction(self._engine, write=True) as conn:
            seq = next_seq(conn)
            rows: list[dict[str, Any]] = []
            size = 0
            for target_work in target_groups(work, 1):  # one target per group
                sids, tss, vals = self._columns(target_work)
                if not len(sids):
                    continue
                lays = list({id(w[0]): w[0] for w in target_work}.values())
                rows += samplelog.target_rows(
                    lays[0].target, seq, (sids, tss, vals), name_index(lays)
                )
                written += len(sids)
                size += len(sids)
                first = int(tss.min())
                lowest = first if lowest is None else min(lowest, first)
                if size >= FLUSH_GROUP_SAMPLES:
                    samplelog.insert(conn, rows)
                    rows, size = [], 0
            samplelog.insert(conn, rows)
            # Samples older than the rollup watermark (a buffer flushed after an outage, or a
            # lagging second writer) move it back in this same transaction, so they are rolled
            # up before raw retention may delete them.
            if lowest is not None:
                self._marks_memo = None
                maintenance.rewind_watermarks(conn, lowest)
        if refusals and self._on_refused is not None:
            for target, (series, samples) in refusals.items():
                self._on_refused(target, series, samples)
        return written

    @staticmethod
    def _refusals(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
    ) -> dict[str, tuple[int, int]]:
        """Per target whose series limit refused series: (series refused, samples dropped)."""
        out: dict[str, tuple[int, int]] = {}
        for lay, _, values, nan in work:
            if not lay.refused:
                continue
            refused = lay.ids == REFUSED
            if nan:
                refused &= ~np.isnan(values)
            series, samples = out.get(lay.target, (0, 0))
            out[lay.target] = (max(series, lay.refused), samples + int(refused.sum()))
        return out

    @staticmethod
    def _columns(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]],
               np.ndarray[Any, np.dtype[np.float64]]]:
        """``work``'s samples as sorted columns without NaN (see ``sample_columns``)."""
        columns = sample_columns([(lay, ts_ms, values) for lay, ts_ms, values, _ in work])
        if columns is None:
            return Store._sorted_columns(work)
        sids, tss, vals = columns
        return Store._dropped(work, sids, tss, vals)

    @staticmethod
    def _dropped(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
        sids: np.ndarray[Any, np.dtype[np.int64]],
        tss: np.ndarray[Any, np.dtype[np.int64]],
        vals: np.ndarray[Any, np.dtype[np.float64]],
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]],
               np.ndarray[Any, np.dtype[np.float64]]]:
        """The columns without NaN samples and samples of refused series (no id)."""
        nan = any(w[3] for w in work)
        refused = any(w[0].refused for w in work)
        if not (nan or refused):
            return sids, tss, vals
        keep = ~np.isnan(vals) if nan else sids >= 0
        if nan and refused:
            keep &= sids >= 0
        return sids[keep], tss[keep], vals[keep]

    @staticmethod
    def _sorted_columns(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]],
               np.ndarray[Any, np.dtype[np.float64]]]:
        """The general case of ``sample_columns``: every sample, sorted by ``(id, ts)``."""
        sids = np.concatenate([lay.ids for lay, _, _, _ in work])
        tss = np.repeat(
            np.fromiter((w[1] for w in work), np.int64, len(work)),
            [len(lay.ids) for lay, _, _, _ in work],
        )
        vals = np.concatenate([w[2] for w in work])
        sids, tss, vals = Store._dropped(work, sids, tss, vals)
        # Key order makes the inserts sequential in the (series_id, ts) B-tree; of two samples
        # with the same key (a series listed twice, or two label orders of one series) the one
        # written last is kept.
        kept = sort_keep_last(sids, tss, vals)
        return kept.ids, kept.ts, kept.values

    def _resolve_layouts(
        self, stale: list[tuple[Layout, np.ndarray[Any, np.dtype[np.bool_]]]]
    ) -> None:
        """Give ``stale`` layouts the ids of their new series, a group of layouts at a time.

        A fleet's first flush (or the refresh after retention) creates hundreds of thousands
        of series; resolving them a group at a time, each group's keys and ids dropped before
        the next, bounds what is held in memory at once (measured: it was the collector's peak
        RSS at 1,000 targets).
        """
        group: list[Layout] = []
        keys: set[SeriesKeyTuple] = set()
        for lay, need in stale:
            group.append(lay)
            keys.update(lay.keys_at(np.flatnonzero(need).tolist()))
            if len(keys) >= RESOLVE_SLICE:
                resolved = self._resolve(keys)
                for member in group:
                    member.fill(resolved)
                group, keys = [], set()
        if group:
            resolved = self._resolve(keys)
            for member in group:
                member.fill(resolved)

    def _resolve(self, keys: set[SeriesKeyTuple]) -> dict[SeriesKeyTuple, int]:
        # In slices, each its own transaction (keys sorted within each, so two writers lock
        # index entries in the same order and cannot deadlock).
        ordered = sorted(keys)
        resolved: dict[SeriesKeyTuple, int] = {}
        for lo in range(0, len(ordered), RESOLVE_SLICE):
            with transaction(self._engine, write=True) as conn:
                allowed, refused = within_series_limits(
                    conn, ordered[lo : lo + RESOLVE_SLICE], limits=self._series_limits
                )
                ids = resolve_series(conn, allowed, now_ms=round(time.time() * 1000))
            self._series_gen += 1
            if self._series_memo is not None:
                self._series_memo.clear()
            resolved.update(ids)  # only once committed
            resolved.update(dict.fromkeys(refused, REFUSED))
        return resolved

    def _find_series(
        self, conn: Connection, *, name: str | None, target: str | None,
        match: Mapping[str, str] | None, max_series: int | None = None,
    ) -> list[tuple[int, SeriesKey]]:
        memo = self._series_memo
        if memo is None:
            return query.find_series(conn, name=name, target=target, match=match,
                                     max_series=max_series)
        key = (name, target, tuple(sorted((match or {}).items())), max_series)
        found = memo.get(key)
        if found is None:
            gen = self._series_gen
            found = query.find_series(conn, name=name, target=target, match=match,
                                      max_series=max_series)
            if gen == self._series_gen:  # no series created meanwhile
                memo[key] = found
        return found

    def _watermarks(self, conn: Connection) -> dict[int, int]:
        if self._series_memo is None:
            return maintenance.watermarks(conn)
        marks = self._marks_memo
        if marks is None:
            marks = self._marks_memo = maintenance.watermarks(conn)
        return marks

    def _forget_scratch_memos(self) -> None:
        # Maintenance moves watermarks and deletes series.
        self._marks_memo = None
        self._series_gen += 1
        if self._series_memo is not None:
            self._series_memo.clear()

    def _expire_layouts(self, now: float) -> None:
        """Forget layouts resolved more than SERIES_CACHE_TTL_S ago, a few per flush.

        Their next scrape resolves its series again, which marks them in use for retention.
        A budget of keys per flush spreads the re-resolution of a large fleet over many
        flushes instead of one long burst every TTL.
        """
        budget = RESOLVE_SLICE
        expired = [(lay.born, target, len(lay.ids)) for target, lay in self._layouts.items()
                   if now - lay.born > SERIES_CACHE_TTL_S]
        for _, target, size in sorted(expired):
            if budget <= 0:
                break
            del self._layouts[target]
            budget -= size

    def write_health(self, h: TargetHealth) -> None:
        """Record the latest scrape outcome of ``(h.target, h.source)``, logging up/down flips.

        Buffered like samples (a scrape never waits for the database): written by the next
        ``flush()``, and by ``health()`` / ``health_log()`` before they read.
        """
        if self._closed:
            raise StoreError(f"{self.url_redacted}: store is closed", url=self.url_redacted)
        with self._lock:
            self._health_rows.append(h)
            over = len(self._health_rows) - self._max_rows
            if over > 0:
                del self._health_rows[:over]

    def _flush_health_locked(self) -> int:
        with self._lock:
            pending, self._health_rows = self._health_rows, []
            self._in_flight[1] = len(pending)
        if not pending:
            return 0
        th, thl = t.target_health, t.target_health_log
        try:
            with self._db("write health"), transaction(self._engine, write=True) as conn:
                known = self._health_up
                if known is None:
                    known = {
                        (r.target, r.source): bool(r.up)
                        for r in conn.execute(select(th.c.target, th.c.source, th.c.up))
                    }
                known = dict(known)
                latest: dict[tuple[str, str], dict[str, Any]] = {}
                flips: list[dict[str, Any]] = []
                for h in pending:
                    values = _health_row(h)
                    key = (h.target, h.source)
                    prev = known.get(key)
                    if prev is None or prev != h.up:
                        flips.append(values)
                    known[key] = h.up
                    latest[key] = values
                stmt = dialect_insert(conn, th)
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[th.c.target, th.c.source],
                        set_={k: stmt.excluded[k] for k in _HEALTH_UPDATED},
                    ),
                    list(latest.values()),
                )
                if flips:
                    conn.execute(dialect_insert(conn, thl).on_conflict_do_nothing(), flips)
        except StoreError:
            with self._lock:
                self._health_rows[:0] = pending
            raise
        finally:
            with self._lock:
                self._in_flight[1] = 0
        self._health_up = known
        return len(pending)

    def health(
        self,
        *,
        targets: Container[str] | None = None,
        after: tuple[str, str] | None = None,
        limit: int | None = None,
    ) -> list[TargetHealth]:
        """The latest outcome of every (target, source), sorted; only of ``targets`` if given,
        at most ``limit`` of them after the (target, source) ``after`` (one page)."""
        th = t.target_health
        stmt = select(th).order_by(th.c.target, th.c.source)
        if after is not None:
            stmt = stmt.where(tuple_(th.c.target, th.c.source)
                              > tuple_(literal(after[0]), literal(after[1])))
        return self._read_health(stmt, targets=targets, limit=limit)

    def health_log(
        self, target: str | None = None, *, since: float | None = None
    ) -> list[TargetHealth]:
        """Up/down transitions (and each source's first report), oldest first."""
        thl = t.target_health_log
        stmt = select(thl).order_by(thl.c.ts, thl.c.target, thl.c.source)
        if target is not None:
            stmt = stmt.where(thl.c.target == target)
        if since is not None:
            stmt = stmt.where(thl.c.ts >= round(since * 1000))
        return self._read_health(stmt)

    def _read_health(
        self,
        stmt: Any,
        *,
        targets: Container[str] | None = None,
        limit: int | None = None,
    ) -> list[TargetHealth]:
        with self._flush_lock:
            self._flush_health_locked()
        out: list[TargetHealth] = []
        with self._db("read health"), transaction(self._engine, write=False) as conn:
            # Streamed and cut at ``limit``: the table keeps every target ever scraped.
            with closing(conn.execute(stmt.execution_options(yield_per=1000))) as rows:
                for r in rows:
                    if targets is not None and r.target not in targets:
                        continue
                    out.append(TargetHealth(r.target, r.source, r.ts / 1000, bool(r.up),
                                            r.duration_s, r.samples, r.error))
                    if limit is not None and len(out) >= limit:
                        break
        return out

    def put_model_config(
        self, target: str, model: str, config: Mapping[str, Any], fetched_at: float
    ) -> None:
        """Store the latest configuration of ``model`` on ``target`` (replacing the previous)."""
        mc = t.model_configs
        values = {
            "target": target,
            "model": model,
            "fetched_at": round(fetched_at * 1000),
            "config": json.dumps(config, sort_keys=True, separators=(",", ":")),
        }
        with self._db("write model config"), transaction(self._engine, write=True) as conn:
            stmt = dialect_insert(conn, mc).values(**values)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[mc.c.target, mc.c.model],
                    set_={"fetched_at": stmt.excluded.fetched_at, "config": stmt.excluded.config},
                )
            )

    def model_configs(self, target: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
        """``{(target, model): config}`` for one target or all."""
        mc = t.model_configs
        stmt = select(mc.c.target, mc.c.model, mc.c.config)
        if target is not None:
            stmt = stmt.where(mc.c.target == target)
        with self._db("read model configs"), transaction(self._engine, write=False) as conn:
            return {(r.target, r.model): json.loads(r.config) for r in conn.execute(stmt)}

    def model_config_times(self, target: str | None = None) -> dict[tuple[str, str], float]:
        """``{(target, model): fetched_at}``: when each stored config was last written (the
        collector writes a config only when it changed, so this is its latest change, or the
        first read of a collector process)."""
        mc = t.model_configs
        stmt = select(mc.c.target, mc.c.model, mc.c.fetched_at)
        if target is not None:
            stmt = stmt.where(mc.c.target == target)
        with self._db("read model configs"), transaction(self._engine, write=False) as conn:
            return {(r.target, r.model): r.fetched_at / 1000 for r in conn.execute(stmt)}

    # --- probe results ------------------------------------------------------------------------

    def write_probe_results(self, results: Iterable[ProbeResult]) -> int:
        """Buffer probe results for ``probe_results``; written by the next ``flush()``.

        Like samples, rows of a failed flush stay buffered (up to ``10 * batch_rows``).
        """
        if self._closed:
            raise StoreError(f"{self.url_redacted}: store is closed", url=self.url_redacted)
        rows = [_probe_row(r) for r in results]
        with self._lock:
            self._probe_rows.extend(rows)
            over = len(self._probe_rows) - self._max_rows
            if over > 0:
                del self._probe_rows[:over]
                log.warning("store: dropped the oldest %d probe results", over)
        return len(rows)

    def _flush_probe_rows_locked(self) -> int:
        with self._lock:
            rows, self._probe_rows = self._probe_rows, []
            self._in_flight[2] = len(rows)
        if not rows:
            return 0
        try:
            with self._db("flush probe results"), transaction(self._engine, write=True) as conn:
                conn.execute(t.probe_results.insert(), rows)
        except StoreError:
            with self._lock:
                self._probe_rows[:0] = rows
            raise
        finally:
            with self._lock:
                self._in_flight[2] = 0
        return len(rows)

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
        tbl = t.probe_results
        stmt = select(tbl)
        if probe is not None:
            stmt = stmt.where(tbl.c.probe == probe)
        if start is not None:
            stmt = stmt.where(tbl.c.ts >= round(start * 1000))
        if end is not None:
            stmt = stmt.where(tbl.c.ts <= round(end * 1000))
        order = (tbl.c.ts.desc(), tbl.c.id.desc()) if newest_first else (tbl.c.ts, tbl.c.id)
        stmt = stmt.order_by(*order).limit(limit)
        with self._db("query probe results"), transaction(self._engine, write=False) as conn:
            return [
                ProbeResult(
                    probe=r.probe, target=r.target, model=r.model, protocol=r.protocol,
                    ts=r.ts / 1000, ok=bool(r.ok), tokens=r.tokens, ttft_s=r.ttft_s,
                    itl_s=r.itl_s, tpot_s=r.tpot_s, e2e_s=r.e2e_s, error_kind=r.error_kind,
                    error_code=r.error_code, error_message=r.error_message,
                    request_id=r.request_id,
                )
                for r in conn.execute(stmt)
            ]

    # --- queries -----------------------------------------------------------------------------
    #
    # Queries see flushed samples only.  Times are unix seconds, windows inclusive at both ends.

    def series(
        self,
        name: str | None = None,
        *,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
    ) -> list[SeriesKey]:
        """Known series, sorted; ``match`` is label equality (``""`` matches an absent label)."""
        with self._db("query series"), transaction(self._engine, write=False) as conn:
            found = self._find_series(conn, name=name, target=target, match=match)
        return [key for _, key in found]

    def series_page(
        self,
        name: str | None = None,
        *,
        target: str | None = None,
        after: SeriesKey | None = None,
        limit: int,
    ) -> list[SeriesKey]:
        """At most ``limit`` series after ``after``, ordered by target, name and stored label
        text (``query.series_page``): the catalogue one page at a time."""
        with self._db("query series"), transaction(self._engine, write=False) as conn:
            return query.series_page(conn, name=name, target=target, after=after, limit=limit)

    def select_series(
        self,
        *,
        names: Collection[str] | None = None,
        target: str | None = None,
        where: query.SeriesFilter | None = None,
        after: SeriesKey | None = None,
        limit: int | None = None,
        start: float | None = None,
        end: float | None = None,
        max_samples: int | None = None,
    ) -> list[SeriesKey]:
        """Series passing ``where`` (and with a sample in ``[start, end]`` when either is
        given), at most ``limit`` after ``after``, in :meth:`series_page`'s order
        (``query.select_page``)."""
        window = None
        if start is not None or end is not None:
            window = _window(-MAX_SECONDS if start is None else start,
                             MAX_SECONDS if end is None else end)
        with self._db("query series"), transaction(self._engine, write=False) as conn:
            return query.select_page(conn, names=names, target=target, where=where,
                                     after=after, limit=limit, window=window,
                                     max_samples=max_samples)

    def select_columns(
        self,
        *,
        start: float,
        end: float,
        names: Collection[str] | None = None,
        target: str | None = None,
        where: query.SeriesFilter | None = None,
        max_series: int | None = None,
        max_samples: int | None = None,
    ) -> SeriesColumns:
        """Raw samples in ``[start, end]`` of the series passing ``where``, bounded as
        :meth:`bucket_columns` is (``LimitExceeded`` before reading)."""
        lo, hi = _window(start, end)
        with self._db("query range"), transaction(self._engine, write=False) as conn:
            found = query.find_series(conn, name=None, names=names, target=target, match=None,
                                      where=where, max_series=max_series)
            if max_samples is not None:
                query.check_samples(conn, found, lo_ms=lo, hi_ms=hi, max_samples=max_samples)
            return query.raw_columns(conn, found, lo_ms=lo, hi_ms=hi)

    def range(
        self,
        name: str,
        *,
        start: float,
        end: float,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
    ) -> list[SeriesData]:
        """Raw samples of each matching series in ``[start, end]``; empty series left out."""
        return self.range_columns(name, start=start, end=end, target=target,
                                  match=match).series()

    def range_columns(
        self,
        name: str,
        *,
        start: float,
        end: float,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
    ) -> SeriesColumns:
        """:meth:`range` as two columns for all series (:class:`store.values.SeriesColumns`):
        for readers of thousands of series, which would otherwise get a Python float per
        point."""
        lo, hi = _window(start, end)
        with self._db("query range"), transaction(self._engine, write=False) as conn:
            found = self._find_series(conn, name=name, target=target, match=match)
            return query.raw_columns(conn, found, lo_ms=lo, hi_ms=hi)

    def increase(
        self,
        name: str,
        *,
        start: float,
        end: float,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
    ) -> list[tuple[SeriesKey, float]]:
        """Reset-aware increase of each counter over its samples in ``[start, end]``.

        A drop is a counter reset: the new value counts as the increase since the reset, as in
        Prometheus.  Series with fewer than two samples in the window are left out.
        """
        return [(key, inc) for key, inc, _, _ in self._increase(name, start, end, target, match)]

    def rate(
        self,
        name: str,
        *,
        start: float,
        end: float,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
    ) -> list[tuple[SeriesKey, float]]:
        """Per-second rate: increase divided by the time between the first and last sample.

        Unlike PromQL ``rate()`` there is no extrapolation to the window edges: the result is
        exactly what the samples show, which is what derived SLIs computed from consecutive
        scrapes agree with.
        """
        return [
            (key, inc / ((last - first) / 1000))
            for key, inc, first, last in self._increase(name, start, end, target, match)
        ]

    def _increase(
        self,
        name: str,
        start: float,
        end: float,
        target: str | None,
        match: Mapping[str, str] | None,
    ) -> list[tuple[SeriesKey, float, int, int]]:
        lo, hi = _window(start, end)
        with self._db("query increase"), transaction(self._engine, write=False) as conn:
            found = self._find_series(conn, name=name, target=target, match=match)
            return query.increase(conn, found, lo_ms=lo, hi_ms=hi)

    def buckets(
        self,
        name: str,
        *,
        start: float,
        end: float,
        step: float,
        agg: query.Agg,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
    ) -> list[SeriesData]:
        """Samples of each series aggregated into ``step``-second buckets (aligned to the epoch).

        Each point is stamped with its bucket's start; empty buckets are left out.  When
        ``step`` is a multiple of 1 h or 5 min, completed rollups are read instead of raw
        samples (raw fills in after the rollup watermark); rollups hold whole intervals, so
        the first bucket may then include data from up to one interval before ``start``.
        """
        return self.bucket_columns(name, start=start, end=end, step=step, agg=agg,
                                   target=target, match=match).series()

    def bucket_columns(
        self,
        name: str,
        *,
        start: float,
        end: float,
        step: float,
        agg: query.Agg,
        target: str | None = None,
        match: Mapping[str, str] | None = None,
        max_series: int | None = None,
        max_samples: int | None = None,
    ) -> SeriesColumns:
        """:meth:`buckets` as two columns for all series (:class:`store.values.SeriesColumns`).

        ``max_series`` and ``max_samples`` bound the read itself (``LimitExceeded`` before the
        samples are read; see ``query.find_series`` and ``query.bucket_columns``)."""
        lo, hi = _window(start, end)
        if agg not in query.AGGS:
            raise QueryError(f"agg must be one of {sorted(query.AGGS)}, got {agg!r}")
        if not math.isfinite(step) or round(step * 1000) < 1:
            raise QueryError(f"step must be a positive number of seconds, got {step!r}")
        with self._db("query buckets"), transaction(self._engine, write=False) as conn:
            found = self._find_series(conn, name=name, target=target, match=match,
                                      max_series=max_series)
            return query.bucket_columns(
                conn,
                found,
                lo_ms=lo,
                hi_ms=hi,
                step_ms=round(step * 1000),
                agg=agg,
                watermarks=self._watermarks(conn),
                max_samples=max_samples,
            )

    # --- maintenance -------------------------------------------------------------------------

    def rollup(self, now: float) -> int:
        """Build 5 m and 1 h rollups of buckets completed since the last run; returns rows.

        First moves the flushes' log into chunks (``store.samplelog``); then compacts the raw
        chunks of hours that ended ``maintenance.COMPACT_AFTER_MS`` before ``now`` (neither
        counted in the result).  After :meth:`request_stop` it ends at the next batch
        boundary (``store.maintenance``, "Stopping").
        """
        self._forget_scratch_memos()
        now_ms = round(now * 1000)
        stop = self._stopping.is_set
        t0 = time.perf_counter()
        with self._db("move the sample log into chunks"):
            moved = samplelog.transpose(self._engine, gate=self._flush_lock, stop=stop)
        t1 = time.perf_counter()
        written = removed = 0
        try:
            with self._db("rollup"):
                written = maintenance.rollup(
                    self._engine, now_ms=now_ms, gate=self._flush_lock, stop=stop
                )
            t2 = time.perf_counter()
            with self._db("compact"):
                removed = maintenance.compact(
                    self._engine, now_ms=now_ms, gate=self._flush_lock, stop=stop
                )
        except maintenance.Stopped:
            log.info("store: maintenance stopped at a batch boundary (shutting down); the next "
                     "run resumes it")
            return written
        # Each phase timed: which one a slow or memory-hungry maintenance run spent itself on.
        log.debug("store: moved %d samples from the log into chunks in %.2f s; %d rollup rows "
                  "in %.2f s; compaction removed %d chunks in %.2f s", moved, t1 - t0, written,
                  t2 - t1, removed, time.perf_counter() - t2)
        return written

    def count_samples(self) -> int:
        """Raw samples stored (all series, all time).

        A sample stored twice and not compacted yet (a re-sent scrape, a retried flush whose
        commit had succeeded) counts twice; queries return it once.
        """
        with self._db("count samples"), transaction(self._engine, write=False) as conn:
            return query.count_samples(conn)

    def apply_retention(
        self, now: float, *, raw_s: float, rollup_5m_s: float, rollup_1h_s: float
    ) -> int:
        """Delete samples and rollup rows past their retention, then series left empty.

        Returns the number of sample and rollup rows deleted.  Deletes at most ``batch_rows``
        rows per transaction.  Raw samples not yet rolled up are kept (see
        ``maintenance.apply_retention``).  After :meth:`request_stop` it ends at the next
        batch boundary.
        """
        self._forget_scratch_memos()
        for setting, value in (
            ("raw_s", raw_s),
            ("rollup_5m_s", rollup_5m_s),
            ("rollup_1h_s", rollup_1h_s),
        ):
            if not value > 0:
                raise QueryError(f"retention `{setting}` must be positive, got {value!r}")
        now_ms = round(now * 1000)
        with self._db("apply retention"):
            try:
                deleted = maintenance.apply_retention(
                    self._engine,
                    now_ms=now_ms,
                    raw_ms=round(raw_s * 1000),
                    rollup_5m_ms=round(rollup_5m_s * 1000),
                    rollup_1h_ms=round(rollup_1h_s * 1000),
                    batch_rows=self._batch_rows,
                    gate=self._flush_lock,
                    stop=self._stopping.is_set,
                )
            except maintenance.Stopped:
                log.info("store: retention stopped at a batch boundary (shutting down); the "
                         "next run resumes it")
                return 0
            if self.stopping:  # one statement over every series: not at shutdown
                return deleted
            # Under the flush lock: a flush of this process may have just resolved a series
            # that now looks empty; it must insert its samples before the series can go.
            with self._flush_lock:
                gone = maintenance.delete_empty_series(
                    self._engine, resolved_before_ms=now_ms - round(raw_s * 1000)
                )
                if gone:
                    self._layouts.clear()  # their ids may be gone: resolve everything again
        log.info("store: retention deleted %d rows and %d empty series", deleted, gone)
        return deleted

    # --- errors ------------------------------------------------------------------------------

    def _db(self, action: str) -> AbstractContextManager[None]:
        """Driver and SQLAlchemy errors as StoreError naming the redacted URL."""
        return db_errors(action, self.url_redacted)


#: The widest window a query may name (years 1 to 9999, as the API's times): an open end of
#: ``select_series`` reads as this.
MAX_SECONDS = 253_402_300_799.0


def _window(start: float, end: float) -> tuple[int, int]:
    if not (math.isfinite(start) and math.isfinite(end)):
        raise QueryError(f"start and end must be finite, got start={start!r} end={end!r}")
    if start > end:
        raise QueryError(f"start {start!r} is after end {end!r}")
    return round(start * 1000), round(end * 1000)


_HEALTH_UPDATED = ("ts", "up", "duration_s", "samples", "error")


# Texts a target or a model server wrote (error messages, codes) go through ``db_text``: one
# NUL byte in them made PostgreSQL refuse the whole health transaction, every flush, so every
# target's health froze.  Names come from the validated configuration.


def _health_row(h: TargetHealth) -> dict[str, Any]:
    return {
        "target": h.target, "source": h.source, "ts": round(h.ts * 1000), "up": h.up,
        "duration_s": h.duration_s, "samples": h.samples, "error": db_text(h.error),
    }


def _probe_row(r: ProbeResult) -> dict[str, Any]:
    return {
        "probe": r.probe, "target": r.target, "model": r.model, "protocol": r.protocol,
        "ts": round(r.ts * 1000), "ok": r.ok, "tokens": r.tokens, "ttft_s": r.ttft_s,
        "itl_s": r.itl_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s, "tokens_per_s": r.tokens_per_s,
        "error_kind": r.error_kind, "error_code": db_text(r.error_code, 200),
        "error_message": db_text(r.error_message), "request_id": db_text(r.request_id, 200),
    }
