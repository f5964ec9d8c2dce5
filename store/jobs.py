"""``Maintenance`` (``Store.maintenance``): the store's periodic jobs and their stop flag.

Rollup (after moving the flushes' sample log into chunks), compaction and retention run here,
each in bounded transactions behind the store's flush lock (``store.maintenance``,
``store.retention``), so a flush gets its turn between two of them.  :meth:`request_stop` at
shutdown ends a run at its next batch boundary; the next run resumes it.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager

from sqlalchemy import Engine

from tritonwatch.store import maintenance, retention, samplelog
from tritonwatch.store.errors import QueryError, db_errors
from tritonwatch.store.fairlock import FairLock
from tritonwatch.store.flush import SampleWriter
from tritonwatch.store.reads import Reader

log = logging.getLogger(__name__)


class Maintenance:
    """Rollup, compaction and retention of one store's database."""

    def __init__(
        self, engine: Engine, url_redacted: str, *, batch_rows: int, gate: FairLock,
        reader: Reader, writer: SampleWriter,
    ) -> None:
        self._engine = engine
        self._url = url_redacted
        self._batch_rows = batch_rows
        self._gate = gate  # the store's flush lock
        self._reader = reader  # its memos forget what maintenance moves and deletes
        self._writer = writer  # its layouts forget series retention deleted
        self._stopping = threading.Event()

    def _db(self, action: str) -> AbstractContextManager[None]:
        return db_errors(action, self._url)

    def request_stop(self) -> None:
        """Ask maintenance to stop at its next batch boundary.

        Each batch commits on its own and the next run resumes where this one stopped, so
        stopping loses no work but the batch in progress (rolled back).  Flushes and reads
        are not affected.
        """
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def rollup(self, now: float) -> int:
        """Build 5 m and 1 h rollups of buckets completed since the last run; returns rows.

        First moves the flushes' log into chunks (``store.samplelog``); then compacts the raw
        chunks of hours that ended ``maintenance.COMPACT_AFTER_MS`` before ``now`` (neither
        counted in the result).  After :meth:`request_stop` it ends at the next batch
        boundary (``store.maintenance``, "Stopping").
        """
        self._reader.forget()
        now_ms = round(now * 1000)
        stop = self._stopping.is_set
        t0 = time.perf_counter()
        with self._db("move the sample log into chunks"):
            moved = samplelog.transpose(self._engine, gate=self._gate,
                                         before_ms=samplelog.move_before(now_ms), stop=stop)
        t1 = time.perf_counter()
        written = removed = 0
        try:
            with self._db("rollup"):
                written = maintenance.rollup(
                    self._engine, now_ms=now_ms, gate=self._gate, stop=stop
                )
            t2 = time.perf_counter()
            with self._db("compact"):
                removed = maintenance.compact(
                    self._engine, now_ms=now_ms, gate=self._gate, stop=stop
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

    def apply_retention(
        self, now: float, *, raw_s: float, rollup_5m_s: float, rollup_1h_s: float
    ) -> int:
        """Delete samples and rollup rows past their retention, then series left empty.

        Returns the number of sample and rollup rows deleted.  Deletes at most ``batch_rows``
        rows per transaction.  Raw samples not yet rolled up are kept (see
        ``retention.apply_retention``).  After :meth:`request_stop` it ends at the next
        batch boundary.
        """
        self._reader.forget()
        for setting, value in (
            ("raw_s", raw_s),
            ("rollup_5m_s", rollup_5m_s),
            ("rollup_1h_s", rollup_1h_s),
        ):
            if not value > 0:
                raise QueryError(f"retention `{setting}` must be positive, got {value!r}")
        now_ms = round(now * 1000)
        with self._db("apply retention"):
            # The log's hours reaching past raw retention are moved first, and so cut like the
            # rest (maintenance moves hours once they are 5 minutes old; a late flush may be
            # older).
            samplelog.transpose(
                self._engine, gate=self._gate,
                before_ms=samplelog.hours_through(now_ms - round(raw_s * 1000)),
                stop=self._stopping.is_set,
            )
            try:
                deleted = retention.apply_retention(
                    self._engine,
                    now_ms=now_ms,
                    raw_ms=round(raw_s * 1000),
                    rollup_5m_ms=round(rollup_5m_s * 1000),
                    rollup_1h_ms=round(rollup_1h_s * 1000),
                    batch_rows=self._batch_rows,
                    gate=self._gate,
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
            with self._gate:
                gone = retention.delete_empty_series(
                    self._engine, resolved_before_ms=now_ms - round(raw_s * 1000)
                )
                if gone:
                    self._writer.forget_layouts()  # their ids may be gone: resolve again
        log.info("store: retention deleted %d rows and %d empty series", deleted, gone)
        return deleted
