"""Rollups, compaction, and the ``meta`` key/value helpers they and retention use.

The jobs commit in bounded steps so that a SQLite writer (one at a time) never waits long
behind them, and so that an interrupted run resumes where it stopped.

Raw samples are stored as per-series chunks (``store.chunks``): rollups decode and aggregate
them in numpy, retention deletes whole chunks and rewrites the one straddling its cutoff, and
:func:`compact` (run after each rollup) merges the many small chunks that flushes write into
one per series and hour.

Late samples.  A rollup summarises the buckets below its watermark once; samples committed
below the watermark later (a buffer flushed after a database outage, a second collector sharing
PostgreSQL whose flush lags) would never be summarised, and raw retention would then delete
them.  So every flush that writes samples older than the 5 m watermark moves it back to the
start of the earliest affected bucket, in the flush's own transaction (:func:`rewind_watermarks`),
and the 1 h watermark back to the start of that bucket's hour; the next rollup summarises those
buckets again (the upsert makes that safe).  Buckets whose source rows retention has begun to
delete are never summarised again (the ``*_horizon_ms`` keys): a partial bucket would overwrite
a complete rollup row.

Stopping.  Every function here takes ``stop``, a callable asked between batches (the store's
shutdown flag, ``Store.maintenance.request_stop``): once it answers True the run ends at that batch
boundary.  What was committed stays, the batch in progress is rolled back, and the next run
resumes from the watermarks, exactly as after a crash; so shutdown never waits for a run over
a large store (1.38 M series took a shutdown 36 s) and nothing is left half done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    case,
    delete,
    func,
    or_,
    select,
)

from tritonwatch.schemas import tables as t
from tritonwatch.store.chunks import (
    I64_MAX,
    I64_MIN,
    MAX_SAMPLES,
    WINDOW_MS,
    compress,
    encode,
    window_start,
)
from tritonwatch.store.engine import transaction
from tritonwatch.store.query import ROLLUP_1H_MS, ROLLUP_5M_MS, aggregate, merge_rows, raw_samples
from tritonwatch.store.write import PG_LOCK_ROLLUP, dialect_insert, insert_chunks

log = logging.getLogger(__name__)

WATERMARK_5M = "rollup_5m_watermark_ms"
WATERMARK_1H = "rollup_1h_watermark_ms"
#: Raw samples before this (5 m aligned) may have been deleted by retention: no 5 m bucket
#: before it is summarised again.
HORIZON_RAW = "raw_horizon_ms"
#: Likewise for 5 m rows (1 h aligned) and the 1 h buckets built from them.
HORIZON_5M = "rollup_5m_horizon_ms"

#: A 5 m bucket is rolled up only once it ended this long ago, so samples of a scrape still in
#: a writer's buffer (flushed every few seconds) usually land before their bucket is
#: summarised.  Samples arriving later move the watermark back (:func:`rewind_watermarks`).
ROLLUP_GRACE_MS = 120_000

# Time span summarised per transaction.
_CHUNK_5M_MS = 6 * ROLLUP_1H_MS
_CHUNK_1H_MS = 7 * 24 * ROLLUP_1H_MS

# Series ids per retention statement (bind parameters), rows per delete transaction default.
ID_BATCH = 500

# Serialises rollups, compaction and chunk retention of concurrent processes (flushes take it
# shared); defined beside the flush that takes it.
_PG_LOCK_ROLLUP = PG_LOCK_ROLLUP

#: Windows (``store.chunks.WINDOW_MS``) below this are compacted; the next one to do.
COMPACT_WATERMARK = "compact_watermark_ms"
#: Set by a flush writing into a compacted window: the earliest window to compact again.
COMPACT_REWIND = "compact_rewind_ms"
#: The window a compaction is working through (still set after a crash: done again).
COMPACT_BUSY = "compact_busy_ms"
#: A window is compacted once it ended this long ago: flushes of a normal collector have
#: long stopped writing into it, so compaction rarely has to do a window twice.
COMPACT_AFTER_MS = 600_000
# Series per compaction transaction: bounds how long one holds the write lock.
_COMPACT_IDS = 200


Gate = AbstractContextManager[Any]
#: Asked between batches: True once the run should end (see the module docstring).
Stop = Callable[[], bool]


def never() -> bool:
    return False


class Stopped(Exception):
    """A run ended early because ``stop`` answered True (raised inside a batch's transaction,
    it rolls that batch back)."""


def get_meta(conn: Connection, key: str) -> str | None:
    return conn.execute(select(t.meta.c.value).where(t.meta.c.key == key)).scalar_one_or_none()


def set_meta(conn: Connection, key: str, value: str) -> None:
    stmt = dialect_insert(conn, t.meta).values(key=key, value=value)
    conn.execute(stmt.on_conflict_do_update(index_elements=[t.meta.c.key], set_={"value": value}))


def watermarks(conn: Connection) -> dict[int, int]:
    """``{resolution_ms: end of the last completed rollup bucket}`` for each rollup built."""
    out = {}
    for res, key in ((ROLLUP_5M_MS, WATERMARK_5M), (ROLLUP_1H_MS, WATERMARK_1H)):
        value = get_meta(conn, key)
        if value is not None:
            out[res] = int(value)
    return out


def advisory_lock(conn: Connection, key: int, *, shared: bool = False) -> None:
    """On PostgreSQL, hold a transaction-scoped lock; SQLite's BEGIN IMMEDIATE already does.

    ``shared`` locks do not exclude each other, only the exclusive one.
    """
    if conn.dialect.name == "postgresql":
        lock = func.pg_advisory_xact_lock_shared if shared else func.pg_advisory_xact_lock
        conn.execute(select(lock(key)))


def _floor(ms: int, res: int) -> int:
    return ms // res * res


def ceil_ms(ms: int, res: int) -> int:
    return -(-ms // res) * res


def int_meta(conn: Connection, key: str) -> int | None:
    value = get_meta(conn, key)
    return None if value is None else int(value)


def _int_metas(conn: Connection, *keys: str) -> dict[str, int]:
    rows = conn.execute(select(t.meta.c.key, t.meta.c.value).where(t.meta.c.key.in_(keys)))
    return {key: int(value) for key, value in rows}


def rewind_watermarks(conn: Connection, oldest_ms: int) -> int | None:
    """Inside a flush's transaction: move the rollup watermarks back before ``oldest_ms``.

    Called with the oldest timestamp the flush is writing.  If that lies below the 5 m
    watermark, the watermark moves back to the start of its bucket (not below the raw
    horizon), and the 1 h watermark to the start of that bucket's hour (not below the 5 m
    horizon), so the next rollup summarises those buckets again.  Returns the new 5 m
    watermark, or None when nothing moved.  Likewise, samples older than the compaction
    watermark mark their window for compaction again (:func:`compact`).

    On PostgreSQL the flush takes the rollup lock in shared mode: it waits for a rollup
    transaction in progress (which may not have seen these samples) and reads the watermark
    that rollup committed, while flushes still do not wait for each other.  On SQLite the
    flush's BEGIN IMMEDIATE already serialises it with the rollup.
    """
    advisory_lock(conn, _PG_LOCK_ROLLUP, shared=True)
    marks = _int_metas(conn, WATERMARK_5M, COMPACT_WATERMARK)
    compacted = marks.get(COMPACT_WATERMARK)
    if compacted is not None and oldest_ms < compacted:
        # Into a window compaction has done (or is doing): it must do that window again.
        window = window_start(oldest_ms)
        rewind = int_meta(conn, COMPACT_REWIND)
        if rewind is None or window < rewind:
            set_meta(conn, COMPACT_REWIND, str(window))
    wm_5m = marks.get(WATERMARK_5M)
    if wm_5m is None or oldest_ms >= wm_5m:
        return None  # no rollup yet (the first one starts at the oldest sample), or not late
    target = max(_floor(oldest_ms, ROLLUP_5M_MS), int_meta(conn, HORIZON_RAW) or 0)
    if target >= wm_5m:
        return None  # older than raw retention: those buckets are never summarised again
    set_meta(conn, WATERMARK_5M, str(target))
    wm_1h = int_meta(conn, WATERMARK_1H)
    target_1h = max(_floor(target, ROLLUP_1H_MS), int_meta(conn, HORIZON_5M) or 0)
    if wm_1h is not None and target_1h < wm_1h:
        set_meta(conn, WATERMARK_1H, str(target_1h))
    log.info(
        "store: late samples from %d ms: rollup watermark moved back from %d to %d ms",
        oldest_ms, wm_5m, target,
    )
    return target


def _rollup_stmt(conn: Connection, src: Table, dst: Table, *, lo: int, hi: int, res: int) -> Any:
    # Rollup rows from rollup rows (1 h from 5 m), in SQL.
    c = src.c
    newest = func.first_value(c["last"]).over(
        partition_by=(c.series_id, c.ts // res), order_by=c.ts.desc()
    )
    cols: list[Any] = [c.series_id, ((c.ts // res) * res).label("b"), newest.label("newest")]
    cols += [c["min"], c["max"], c["sum"], c["count"]]
    inner = select(*cols).where(c.ts >= lo, c.ts < hi).subquery()
    i = inner.c
    aggs = [func.min(i["min"]), func.max(i["max"]), func.sum(i["sum"]), func.sum(i["count"])]
    source = select(i.series_id, i.b, *aggs, func.max(i.newest)).group_by(i.series_id, i.b)
    # +Inf and -Inf 5-minute sums in one hour sum to NaN (NULL on SQLite): no hourly row for
    # that series and hour, rather than a refused insert that stops every later rollup.
    total = func.sum(i["sum"])
    if conn.dialect.name == "postgresql":
        source = source.having(total != float("nan"))  # PostgreSQL: NaN equals only NaN
    else:
        source = source.having(total.isnot(None))
    stmt = dialect_insert(conn, dst).from_select(_ROLLUP_COLUMNS, source)
    return _upsert(stmt, dst)


_ROLLUP_COLUMNS = ["series_id", "ts", "min", "max", "sum", "count", "last"]


def _upsert(stmt: Any, dst: Table) -> Any:
    # Upsert: re-running a chunk (two processes, or a crash before the watermark commit)
    # rewrites the same rows instead of failing.
    return stmt.on_conflict_do_update(
        index_elements=[dst.c.series_id, dst.c.ts],
        set_={n: stmt.excluded[n] for n in _ROLLUP_COLUMNS[2:]},
    )


def series_ids(conn: Connection) -> npt.NDArray[np.int64]:
    # An array, not a list: at 1,000 targets it is 566k ids, and as Python ints spread over
    # the heap (20 MB) they left it fragmented after every maintenance run.
    ids = conn.execute(select(t.series.c.id).order_by(t.series.c.id)).scalars()
    return np.fromiter(ids, np.int64)


def _rollup_raw(
    conn: Connection, dst: Table, *, lo: int, hi: int, res: int, stop: Stop = never
) -> int:
    # Rollup rows from raw samples: decoded and aggregated in numpy, a batch of series at a
    # time (index range scans of the chunks, bounded memory).  One step covers every series,
    # thousands of batches in a large store: ``stop`` is asked between them, and rolls the
    # step back (its watermark with it) when it answers True.
    written = 0
    ids = series_ids(conn)
    for i in range(0, len(ids), ID_BATCH):
        if stop():
            raise Stopped
        batch = ids[i : i + ID_BATCH].tolist()
        a = aggregate(raw_samples(conn, batch, lo_ms=lo, hi_ms=hi - 1), res)
        # +Inf and -Inf in one bucket sum to NaN, which SQLite stores as NULL and the NOT NULL
        # column refuses: one such series would stop every later rollup at that bucket.  Its
        # sum (and so its average) has no value; the bucket is left to the raw samples.
        keep = ~np.isnan(a.sum)
        if not keep.all():
            log.debug("rollup: %d bucket(s) summing +Inf and -Inf left to the raw samples",
                      int((~keep).sum()))
            a = a._replace(ids=a.ids[keep], buckets=a.buckets[keep], min=a.min[keep],
                           max=a.max[keep], sum=a.sum[keep], n=a.n[keep],
                           last_ts=a.last_ts[keep], last=a.last[keep])
        if not len(a.ids):
            continue
        rows = [
            dict(zip(_ROLLUP_COLUMNS, row, strict=True))
            for row in zip(
                a.ids.tolist(), a.buckets.tolist(), a.min.tolist(), a.max.tolist(),
                a.sum.tolist(), a.n.tolist(), a.last.tolist(), strict=True,
            )
        ]
        conn.execute(_upsert(dialect_insert(conn, dst), dst), rows)
        written += len(rows)
    return written




def _roll(
    engine: Engine, *, src: Table, dst: Table, res: int, key: str, horizon_key: str,
    hi: Callable[[Connection], int | None], chunk: int, gate: Gate, stop: Stop,
) -> int:
    written = 0
    raw = src is t.sample_chunks
    oldest = src.c.start_ms if raw else src.c.ts
    while True:
        if stop():
            raise Stopped
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, _PG_LOCK_ROLLUP)
            # Read under the lock: a flush may have moved a watermark back since the last step.
            top = hi(conn)
            if top is None:
                return written
            stored = get_meta(conn, key)
            if stored is None:
                # First run only: start at the oldest data (a full scan, once).
                found = [conn.execute(select(func.min(oldest))).scalar_one_or_none()]
                if raw:  # samples flushed since the log was last moved are still in it
                    found.append(conn.execute(select(func.min(t.sample_log.c.start_ms))).scalar())
                known = [int(f) for f in found if f is not None]
                if not known:
                    return written  # nothing to summarise yet
                first = min(known)
                lo = int(first) // res * res
            else:
                lo = int(stored)
            # Never summarise a bucket whose source rows retention has begun to delete.
            lo = max(lo, int_meta(conn, horizon_key) or 0)
            if lo >= top:
                return written
            step_hi = min(top, lo + chunk)
            if raw:
                written += _rollup_raw(conn, dst, lo=lo, hi=step_hi, res=res, stop=stop)
            else:
                stmt = _rollup_stmt(conn, src, dst, lo=lo, hi=step_hi, res=res)
                # Not every dialect reports rowcount for INSERT ... SELECT unless asked to.
                result = conn.execute(stmt.execution_options(preserve_rowcount=True))
                written += max(result.rowcount, 0)
            set_meta(conn, key, str(step_hi))


def rollup(
    engine: Engine, *, now_ms: int, gate: Gate | None = None, stop: Stop = never
) -> int:
    """Summarise completed 5 m buckets from raw samples, then completed hours from 5 m rows.

    Each transaction runs inside ``gate`` (the store's flush lock): between two of them a
    waiting flush gets its turn, instead of polling SQLite's busy handler while this loop
    takes the write lock again and again.  Raises :class:`Stopped` when ``stop`` ends it.
    """
    gate = gate or nullcontext()
    hi_5m = _floor(now_ms - ROLLUP_GRACE_MS, ROLLUP_5M_MS)

    def hi_1h(conn: Connection) -> int | None:
        # An hour is complete once all twelve of its 5 m buckets are.  Read in the rolling
        # transaction: a late flush may have moved the 5 m watermark back meanwhile.
        wm_5m = int_meta(conn, WATERMARK_5M)
        return None if wm_5m is None else _floor(wm_5m, ROLLUP_1H_MS)

    written = 0
    for src, dst, res, key, horizon_key, hi, chunk in (
        (t.sample_chunks, t.rollups_5m, ROLLUP_5M_MS, WATERMARK_5M, HORIZON_RAW,
         lambda _conn: hi_5m, _CHUNK_5M_MS),
        (t.rollups_5m, t.rollups_1h, ROLLUP_1H_MS, WATERMARK_1H, HORIZON_5M, hi_1h,
         _CHUNK_1H_MS),
    ):
        written += _roll(engine, src=src, dst=dst, res=res, key=key, horizon_key=horizon_key,
                         hi=hi, chunk=chunk, gate=gate, stop=stop)
    return written


def compact(
    engine: Engine, *, now_ms: int, gate: Gate | None = None, stop: Stop = never
) -> int:
    """Merge the chunks of each series in every window (``store.chunks.WINDOW_MS``) that ended
    :data:`COMPACT_AFTER_MS` ago; returns the number of chunks removed.

    The sample log is moved into chunks every maintenance run (``store.samplelog``), one chunk
    per series each time, so an hour holds a dozen or more per series; compaction leaves one
    (or, past ``MAX_SAMPLES``, a few), resolving overlaps by the last-write rule, and
    compressed (``store.chunks.compress``).  Windows go in order (:data:`COMPACT_WATERMARK`),
    each in one transaction per :data:`_COMPACT_IDS` series; a series is rewritten only if
    more than one of its chunks in the window is not full, or one of them is raw.

    Why nothing is lost.  Every transaction holds the rollup lock exclusively, and a flush
    holds it in shared mode from before it takes its ``seq`` until it commits (SQLite
    serialises writers anyway): so compaction sees every chunk whose ``seq`` is taken, and a
    chunk written later has a higher ``seq`` than any it merged.  No chunk crosses a window,
    so the merged chunks, which keep the highest ``seq`` they replaced, overlap no chunk that
    compaction did not read: the last-write rule gives the same answer before and after, and
    samples flushed later into the window win over them as they did over what they replaced.
    Such late samples (older than the compaction watermark) also mark their window
    (:data:`COMPACT_REWIND`, see :func:`rewind_watermarks`) so that it is compacted again; a
    window interrupted by a crash, or by ``stop``, is done again too (:data:`COMPACT_BUSY`).
    Raises :class:`Stopped` when ``stop`` ends it.
    """
    gate = gate or nullcontext()
    top = window_start(now_ms - COMPACT_AFTER_MS)
    removed = 0
    while True:
        if stop():
            raise Stopped
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, _PG_LOCK_ROLLUP)
            marks = _int_metas(conn, COMPACT_WATERMARK, COMPACT_REWIND, COMPACT_BUSY)
            done = marks.get(COMPACT_WATERMARK)
            if done is None:
                # First run only: start at the oldest chunk (a full scan, once).
                first = conn.execute(select(func.min(t.sample_chunks.c.start_ms))).scalar()
                if first is None:
                    return removed
                done = window_start(int(first))
                set_meta(conn, COMPACT_WATERMARK, str(done))
            window = min([done] + [marks[k] for k in (COMPACT_REWIND, COMPACT_BUSY) if k in marks])
            if window >= top:
                return removed
            conn.execute(delete(t.meta).where(t.meta.c.key == COMPACT_REWIND))
            set_meta(conn, COMPACT_WATERMARK, str(window + WINDOW_MS))
            set_meta(conn, COMPACT_BUSY, str(window))
            # Read again for every window: the late flush that marked it may have created series.
            ids = series_ids(conn)
        for i in range(0, len(ids), _COMPACT_IDS):
            if stop():
                raise Stopped
            with gate, transaction(engine, write=True) as conn:
                advisory_lock(conn, _PG_LOCK_ROLLUP)
                removed += _compact_window(conn, ids[i : i + _COMPACT_IDS].tolist(), window)
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, _PG_LOCK_ROLLUP)
            if int_meta(conn, COMPACT_BUSY) == window:
                conn.execute(delete(t.meta).where(t.meta.c.key == COMPACT_BUSY))
        log.debug("store: compacted the chunks of the window at %d ms", window)


def _compact_window(conn: Connection, ids: list[int], window: int) -> int:
    c = t.sample_chunks.c
    where = [c.series_id.in_(ids), c.start_ms >= window, c.start_ms < window + WINDOW_MS]
    not_full = func.sum(case((c.n < MAX_SAMPLES, 1), else_=0))
    # Raw chunks (the log's moves, or a schema 3 database's) are compressed even when alone;
    # the data's length tells them (``store.chunks``) without reading it.
    raw = func.sum(case((func.length(c.data) == 16 * c.n, 1), else_=0))
    query = (
        select(c.series_id).where(*where).group_by(c.series_id)
        .having(or_(not_full > 1, raw > 0))
    )
    todo = list(conn.execute(query).scalars())
    if not todo:
        return 0
    where[0] = c.series_id.in_(todo)
    rows = conn.execute(select(c.series_id, c.start_ms, c.seq, c.n, c.data).where(*where)).all()
    top_seq: dict[int, int] = {}
    for sid, _, seq, _, _ in rows:
        top_seq[sid] = max(seq, top_seq.get(sid, seq))
    m = merge_rows(rows, lo_ms=I64_MIN, hi_ms=I64_MAX)
    conn.execute(delete(t.sample_chunks).where(*where))
    merged = compress(encode(m.ids, m.ts, m.values, max_samples=MAX_SAMPLES))
    insert_chunks(conn, merged, np.array([top_seq[s] for s in merged.ids.tolist()], np.int64))
    return len(rows) - len(merged)
