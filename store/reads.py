"""``Query`` (what a read asks for) and ``Reader`` (how the store answers it).

One frozen value names the series (by name or names, target, label equality, a filter), the
window and, for buckets, the step and aggregate, with the bounds a read may not exceed.
``Store.read`` answers it with columns (raw samples without ``step``, buckets with it),
``Store.finite_sums`` with a sum and a count per series, ``Store.increase`` / ``Store.rate``
with one number per counter, ``Store.series`` /
``Store.series_page`` with the series alone.  Queries see flushed samples only; times are unix
seconds, windows inclusive at both ends.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection

from tritonwatch.store import maintenance, query
from tritonwatch.store.errors import QueryError
from tritonwatch.store.values import F64, I64, SeriesColumns, SeriesKey, SeriesSums

#: The widest window a query may name (years 1 to 9999, as the API's times): an open end of a
#: :meth:`Reader.series_page` window reads as this.
MAX_SECONDS = 253_402_300_799.0


@dataclass(frozen=True)
class Query:
    """Which series, over which window, read how.

    ``match`` is label equality (``""`` matches an absent label); ``where`` a filter over
    ``(target, name, labels)`` applied in Python (``api/promql.py``).  ``step`` (seconds) and
    ``agg`` make a read bucketed: samples aggregated into ``step``-second buckets aligned to the
    epoch, each stamped with its start, empty ones left out; when ``step`` is a multiple of
    1 h or 5 min completed rollups are read instead of raw samples (raw fills in after the
    rollup watermark), so the first bucket may include data from up to one interval before
    ``start``.  ``max_series`` and ``max_samples`` bound the read itself (``LimitExceeded``
    before the samples are read; see ``query.find_series`` and ``query.bucket_columns``).
    """

    #: The one field given positionally: ``Query("nv_inference_count", start=..., end=...)``.
    name: str | None = None
    _: KW_ONLY
    names: Collection[str] | None = None
    target: str | None = None
    match: Mapping[str, str] | None = None
    where: query.SeriesFilter | None = None
    start: float | None = None
    end: float | None = None
    step: float | None = None
    agg: query.Agg | None = None
    max_series: int | None = None
    max_samples: int | None = None

    def window(self) -> tuple[int, int]:
        """``(lo_ms, hi_ms)``; QueryError unless both ends are given, finite and in order."""
        if self.start is None or self.end is None:
            raise QueryError("a read needs both start and end")
        return _window(self.start, self.end)


def page_window(q: Query) -> tuple[int, int] | None:
    """The ``(lo_ms, hi_ms)`` a page of series must have samples in (an open end reads as
    :data:`MAX_SECONDS`), None for the whole catalogue; QueryError for a ``match``, which a
    page does not take (it filters with ``where``).  Every backend's ``series_page`` starts
    here."""
    if q.match:
        raise QueryError("a page of series is selected by `where`, not `match`")
    if q.start is None and q.end is None:
        return None
    return _window(-MAX_SECONDS if q.start is None else q.start,
                   MAX_SECONDS if q.end is None else q.end)


def _window(start: float, end: float) -> tuple[int, int]:
    if not (math.isfinite(start) and math.isfinite(end)):
        raise QueryError(f"start and end must be finite, got start={start!r} end={end!r}")
    if start > end:
        raise QueryError(f"start {start!r} is after end {end!r}")
    return round(start * 1000), round(end * 1000)


class Reader:
    """Answers queries in a read transaction of the caller's; ``scratch``: memoise lookups.

    A scratch store has one writer, its own: the series a query selects change only when it
    creates series, so they are looked up once per selection until it does (replay repeats
    the same queries at every evaluation); likewise the rollup watermarks, which only its own
    flushes and maintenance move.  The writer and maintenance say when (:meth:`series_created`,
    :meth:`watermarks_moved`, :meth:`forget`).
    """

    def __init__(self, *, scratch: bool) -> None:
        self._series_memo: dict[tuple[Any, ...], list[tuple[int, SeriesKey]]] | None = (
            {} if scratch else None)
        self._series_gen = 0
        self._marks_memo: dict[int, int] | None = None

    # --- what the memos must forget -----------------------------------------------------------

    def series_created(self) -> None:
        self._series_gen += 1
        if self._series_memo is not None:
            self._series_memo.clear()

    def watermarks_moved(self) -> None:
        self._marks_memo = None

    def forget(self) -> None:
        """Maintenance moves watermarks and deletes series."""
        self.watermarks_moved()
        self.series_created()

    # --- reads -------------------------------------------------------------------------------

    def read(self, conn: Connection, q: Query) -> SeriesColumns:
        lo, hi = q.window()
        self._check(q)
        found = self.find(conn, q)
        self._check_samples(conn, q, found, lo, hi)
        return self._columns(conn, q, found, lo, hi)

    @staticmethod
    def _check(q: Query) -> None:
        if q.step is None:
            if q.agg is not None:
                raise QueryError(f"agg {q.agg!r} needs a step")
            return
        if q.agg not in query.AGGS:
            raise QueryError(f"agg must be one of {sorted(query.AGGS)}, got {q.agg!r}")
        if not math.isfinite(q.step) or round(q.step * 1000) < 1:
            raise QueryError(f"step must be a positive number of seconds, got {q.step!r}")

    def _columns(self, conn: Connection, q: Query, found: query.Candidates, lo: int,
                 hi: int, marks: dict[int, int] | None = None) -> SeriesColumns:
        """``found``'s raw samples or buckets (``q.step``) in ``[lo, hi]`` (milliseconds);
        ``marks``: the rollup watermarks, when the caller has read them in this transaction."""
        if q.step is None:
            return query.raw_columns(conn, found, lo_ms=lo, hi_ms=hi)
        return query.bucket_columns(
            conn, found, lo_ms=lo, hi_ms=hi, step_ms=round(q.step * 1000), agg=str(q.agg),
            watermarks=self._watermarks(conn) if marks is None else marks,
        )

    def _check_samples(self, conn: Connection, q: Query, found: query.Candidates, lo: int,
                       hi: int) -> None:
        """LimitExceeded if reading ``found`` would decode more than ``q.max_samples``
        (counted before any is read)."""
        if q.max_samples is None:
            return
        if q.step is None:
            query.check_samples(conn, found, lo_ms=lo, hi_ms=hi, max_samples=q.max_samples)
            return
        plan = query.plan_sources(lo_ms=lo, hi_ms=hi, step_ms=round(q.step * 1000),
                                  watermarks=self._watermarks(conn))
        query.check_bucket_rows(conn, [sid for sid, _ in found], plan,
                                max_samples=q.max_samples)

    def read_batches(self, conn: Connection, q: Query, *, batch: int) -> Iterator[SeriesColumns]:
        """What ``read(conn, q)`` answers, ``batch`` series at a time (in key order: the
        batches joined are the whole read); ``q.max_samples`` bounds the whole read.  Checks
        ``q`` before the first batch is read."""
        if batch < 1:
            raise QueryError(f"batch must be at least one series, got {batch!r}")
        lo, hi = q.window()
        self._check(q)
        found = self.find(conn, q)
        self._check_samples(conn, q, found, lo, hi)  # for the whole read, not each batch
        # The watermarks once for every batch: they are read in the same transaction (one
        # snapshot), and two statements a batch were a fifth of a bucketed read's statements.
        marks = self._watermarks(conn) if q.step is not None and found else None
        return (self._columns(conn, q, found[i:i + batch], lo, hi, marks)
                for i in range(0, len(found), batch))

    def increase(self, conn: Connection, q: Query) -> list[tuple[SeriesKey, float, int, int]]:
        lo, hi = q.window()
        found = self.find(conn, q)
        if q.max_samples is not None:
            query.check_samples(conn, found, lo_ms=lo, hi_ms=hi, max_samples=q.max_samples)
        return query.increase(conn, found, lo_ms=lo, hi_ms=hi)

    def series_page(
        self, conn: Connection, q: Query, *, after: SeriesKey | None, limit: int | None,
    ) -> list[SeriesKey]:
        window = page_window(q)
        names = q.names if q.name is None else {q.name, *(q.names or ())}
        return query.select_page(conn, names=names, target=q.target, where=q.where,
                                 after=after, limit=limit, window=window,
                                 max_samples=q.max_samples)

    def find(self, conn: Connection, q: Query) -> list[tuple[int, SeriesKey]]:
        """``(id, key)`` of the series ``q`` selects, sorted by key."""
        memo = self._series_memo
        if memo is None or q.names is not None or q.where is not None:
            return self._find(conn, q)
        key = (q.name, q.target, tuple(sorted((q.match or {}).items())), q.max_series)
        found = memo.get(key)
        if found is None:
            gen = self._series_gen
            found = self._find(conn, q)
            if gen == self._series_gen:  # no series created meanwhile
                memo[key] = found
        return found

    @staticmethod
    def _find(conn: Connection, q: Query) -> list[tuple[int, SeriesKey]]:
        return query.find_series(conn, name=q.name, names=q.names, target=q.target,
                                 match=q.match, where=q.where, max_series=q.max_series)

    def _watermarks(self, conn: Connection) -> dict[int, int]:
        if self._series_memo is None:
            return maintenance.watermarks(conn)
        marks = self._marks_memo
        if marks is None:
            marks = self._marks_memo = maintenance.watermarks(conn)
        return marks


def sums_of(batches: Iterable[SeriesColumns], after: float) -> SeriesSums:
    """:meth:`SeriesColumns.finite_sums` of each of ``batches``, joined."""
    keys: list[SeriesKey] = []
    sums: list[F64] = []
    counts: list[I64] = []
    for cols in batches:
        s, n = cols.finite_sums(after)
        keys.extend(cols.keys)
        sums.append(s)
        counts.append(n)
    if not sums:
        return SeriesSums(keys, np.empty(0, np.float64), np.empty(0, np.int64))
    return SeriesSums(keys, np.concatenate(sums), np.concatenate(counts))
