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
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    tuple_,
)

from tritonwatch.schemas import tables as t
from tritonwatch.store import rollup_chunks as rc
from tritonwatch.store import samplelog
from tritonwatch.store.chunks import (
    I64_MAX,
    I64_MIN,
    MAX_SAMPLES,
    SPAN_MS,
    WINDOW_MS,
    Encoded,
    compress,
    compress_shared,
    encode,
    run_bounds,
    span_start,
    window_start,
)
from tritonwatch.store.engine import transaction
from tritonwatch.store.query import (
    ROLLUP_1H_MS,
    ROLLUP_5M_MS,
    aggregate,
    merge_rows,
    raw_samples,
    read_rollups,
)
from tritonwatch.store.write import (
    PG_LOCK_ROLLUP,
    get_meta,
    insert_chunks,
    next_seq,
    set_meta,
)

log = logging.getLogger(__name__)

WATERMARK_5M = "rollup_5m_watermark_ms"
WATERMARK_1H = "rollup_1h_watermark_ms"
#: Raw samples before this (5 m aligned) may have been deleted by retention: no 5 m bucket
#: before it is summarised again.
HORIZON_RAW = "raw_horizon_ms"
#: Likewise for 5 m rows (1 h aligned) and the 1 h buckets built from them.
HORIZON_5M = "rollup_5m_horizon_ms"
#: Per watermark, the end of the rollup step in progress, lowered by late flushes (``_roll``).
ROLLING = {WATERMARK_5M: "rollup_5m_rolling_ms", WATERMARK_1H: "rollup_1h_rolling_ms"}

#: A 5 m bucket is rolled up only once it ended this long ago, so samples of a scrape still in
#: a writer's buffer (flushed every few seconds) usually land before their bucket is
#: summarised.  Samples arriving later move the watermark back (:func:`rewind_watermarks`).
ROLLUP_GRACE_MS = 120_000

#: 5 m buckets are rolled up a whole hour at a time, once the hour's log has been moved into
#: chunks (``samplelog.MOVE_AFTER_MS`` after it ends): each run wrote a row per series into
#: the rollup chunks' B-tree, keyed by series, and so rewrote nearly every page of it every
#: 5 minutes (73 of the 233 bytes written per sample ingested, at 100 targets).  Readers lose
#: nothing: a query reads raw samples above the watermark (``query.plan_sources``), and the
#: hour then comes from one compressed chunk per series rather than from the log's rows.
ROLLUP_5M_EVERY_MS = ROLLUP_1H_MS


def rollup_5m_until(now_ms: int) -> int:
    """Where a rollup at ``now_ms`` ends its 5 m buckets: the start of the last hour whose log
    has been moved (and at least :data:`ROLLUP_GRACE_MS` old)."""
    return _floor(min(now_ms - ROLLUP_GRACE_MS, now_ms - samplelog.MOVE_AFTER_MS),
                  ROLLUP_5M_EVERY_MS)

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
    marks = _int_metas(conn, WATERMARK_5M, COMPACT_WATERMARK, HORIZON_RAW, *ROLLING.values())
    _lower_rolling(conn, marks, oldest_ms)
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
    target = max(_floor(oldest_ms, ROLLUP_5M_MS), marks.get(HORIZON_RAW, 0))
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


def _lower_rolling(conn: Connection, marks: dict[str, int], oldest_ms: int) -> None:
    # A rollup step in progress (``_roll``) may have done some series' buckets at and after
    # ``oldest_ms`` already: it must end its watermark at the first of them.
    lowered = {
        WATERMARK_5M: max(_floor(oldest_ms, ROLLUP_5M_MS), marks.get(HORIZON_RAW, 0)),
        WATERMARK_1H: _floor(oldest_ms, ROLLUP_1H_MS),
    }
    for key, rolling in ROLLING.items():
        end = marks.get(rolling)
        if end is not None and oldest_ms < end and lowered[key] < end:
            set_meta(conn, rolling, str(lowered[key]))


def series_id_batch(conn: Connection, after: int | None, size: int) -> list[int]:
    """The first ``size`` series ids above ``after`` (from the lowest when None), in order.

    Maintenance walks the series this way, a batch per transaction, rather than listing them
    all first: at 1,000 targets that list was 566k ids (4.5 MB as an array), held through a
    whole rollup step, compaction window or retention pass, and read while the hourly move's
    rollups ran beside a flush: the 40-minute fleet run's highest RSS mark came during it.
    A series created meanwhile is walked too if its id comes later; that only repeats work
    the late-flush watermarks (:func:`rewind_watermarks`) would have asked for anyway.
    """
    c = t.series.c
    stmt = select(c.id).order_by(c.id).limit(size)
    if after is not None:
        stmt = stmt.where(c.id > after)
    return list(conn.execute(stmt).scalars())


def _walk_series(engine: Engine, size: int, work: Callable[[Connection, list[int]], int], *,
                 gate: Gate, stop: Stop) -> int:
    """``work`` on every series, ``size`` at a time, each batch listed and worked in one write
    transaction under the rollup lock; returns the sum of what ``work`` returned."""
    done = 0
    after: int | None = None
    while True:
        if stop():
            raise Stopped
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, _PG_LOCK_ROLLUP)
            batch = series_id_batch(conn, after, size)
            if not batch:
                return done
            done += work(conn, batch)
        if len(batch) < size:
            return done
        after = batch[-1]


def _rollup_raw(conn: Connection, dst: Table, batch: list[int], *, lo: int, hi: int,
                res: int) -> int:
    # Rollup rows of a batch of series from raw samples, decoded and aggregated in numpy.
    a = aggregate(raw_samples(conn, batch, lo_ms=lo, hi_ms=hi - 1), res)
    rows = rc.Rows(a.ids, a.buckets, a.min, a.max, a.sum, a.n, a.last)
    return _insert_rollups(conn, dst, rows, res)


def _rollup_rollups(conn: Connection, src: Table, dst: Table, batch: list[int], *, lo: int,
                    hi: int, res: int, src_res: int) -> int:
    # Rollup rows of a batch of series from finer rollup rows (1 h from 5 m).
    rows = rc.aggregate(read_rollups(conn, src, batch, lo_ms=lo, hi_ms=hi - 1, res=src_res),
                        res)
    return _insert_rollups(conn, dst, rows, res)


def _insert_rollups(conn: Connection, dst: Table, rows: rc.Rows, res: int) -> int:
    # A bucket whose sum is NaN (+Inf and -Inf in it, or a NaN sample) is kept as the raw
    # samples give it: chunks store NaN bit for bit.  Left out (as when a row per bucket could
    # not store NaN on SQLite), its rollup read had no point where the raw read had one.
    if not len(rows):
        return 0
    # Written raw: a run's chunk of a series is a bucket or a few, which pcodec would encode
    # at some 30 us a column and not make smaller (six columns per series every run: a third
    # of a core at 1,000 targets); compaction compresses them, an hour's worth at a time.
    insert_chunks(conn, rc.encode(rows, res), next_seq(conn), table=dst.name)
    return len(rows)


def _roll(
    engine: Engine, *, src: Table, dst: Table, res: int, key: str, horizon_key: str,
    hi: Callable[[Connection], int | None], chunk: int, gate: Gate, stop: Stop,
) -> int:
    """Summarise ``src`` into ``dst`` up to ``hi``, a step of at most ``chunk`` at a time.

    A step opens by recording its end under ``ROLLING[key]``, rolls up the series a batch
    per transaction (so no transaction holds the write lock for the whole store: an hour of
    1,000 targets is 136 M samples), and closes by moving the watermark to what ``ROLLING``
    then says.  A flush committing samples below it meanwhile (a late one; it may have
    missed series already done) lowers it to its bucket (:func:`rewind_watermarks`), so the
    watermark stops there and the next step rolls from there again (the last write of a
    bucket wins).  Stopped or crashed mid-step, the watermark has not moved: the step is
    done again.
    """
    written = 0
    raw = src is t.sample_chunks
    oldest = src.c.start_ms
    rolling = ROLLING[key]
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
                    found.append(conn.execute(
                        select(func.min(t.sample_log_flushes.c.start_ms))).scalar())
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
            # A step another process has open (or one stopped mid-way) may have been lowered
            # by a late flush: that stands.
            opened = int_meta(conn, rolling)
            set_meta(conn, rolling, str(step_hi if opened is None else min(opened, step_hi)))

        def roll(conn: Connection, batch: list[int], lo: int = lo, hi: int = step_hi) -> int:
            if raw:
                return _rollup_raw(conn, dst, batch, lo=lo, hi=hi, res=res)
            return _rollup_rollups(conn, src, dst, batch, lo=lo, hi=hi, res=res,
                                   src_res=ROLLUP_5M_MS)

        written += _walk_series(engine, ID_BATCH, roll, gate=gate, stop=stop)
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, _PG_LOCK_ROLLUP)
            done = int_meta(conn, rolling)
            # Gone only if another process closed this step meanwhile (it rolled the same
            # buckets): the watermark it set stands.
            if done is not None:
                set_meta(conn, key, str(done))
                conn.execute(delete(t.meta).where(t.meta.c.key == rolling))
            if done is None or done < step_hi:
                return written


def rollup(
    engine: Engine, *, now_ms: int, gate: Gate | None = None, stop: Stop = never
) -> int:
    """Summarise completed 5 m buckets from raw samples, then completed hours from 5 m rows.

    Each transaction runs inside ``gate`` (the store's flush lock): between two of them a
    waiting flush gets its turn, instead of polling SQLite's busy handler while this loop
    takes the write lock again and again.  Raises :class:`Stopped` when ``stop`` ends it.
    """
    gate = gate or nullcontext()
    hi_5m = rollup_5m_until(now_ms)

    def hi_1h(conn: Connection) -> int | None:
        # An hour is complete once all twelve of its 5 m buckets are.  Read in the rolling
        # transaction: a late flush may have moved the 5 m watermark back meanwhile.
        wm_5m = int_meta(conn, WATERMARK_5M)
        return None if wm_5m is None else _floor(wm_5m, ROLLUP_1H_MS)

    written = 0
    for src, dst, res, key, horizon_key, hi, chunk in (
        (t.sample_chunks, t.rollup_chunks_5m, ROLLUP_5M_MS, WATERMARK_5M, HORIZON_RAW,
         lambda _conn: hi_5m, _CHUNK_5M_MS),
        (t.rollup_chunks_5m, t.rollup_chunks_1h, ROLLUP_1H_MS, WATERMARK_1H, HORIZON_5M, hi_1h,
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
    chunk written later has a higher ``seq`` than any it merged.  An hour's merge reads every
    chunk lying within the hour, a span's merge (at its last hour) every chunk of the span,
    and no chunk crosses a span, only span merges an hour: so the merged chunks, which keep
    the highest ``seq`` they replaced, overlap no chunk that compaction did not read but span
    chunks older than all it read: the last-write rule gives the same answer before and after, and
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
        # Each batch lists its series afresh: the late flush that marked the window may have
        # created series.
        def merge(conn: Connection, batch: list[int], window: int = window) -> int:
            return _compact_window(conn, batch, window) + _compact_rollups(conn, batch, window)

        removed += _walk_series(engine, _COMPACT_IDS, merge, gate=gate, stop=stop)
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, _PG_LOCK_ROLLUP)
            if int_meta(conn, COMPACT_BUSY) == window:
                conn.execute(delete(t.meta).where(t.meta.c.key == COMPACT_BUSY))
        log.debug("store: compacted the chunks of the window at %d ms", window)


def _compact_window(conn: Connection, ids: list[int], window: int) -> int:
    # The hour's chunks that end in it; then, at a span's last hour, the whole span.  Chunks
    # crossing an hour (a span's merged chunk) are left to the span merge: merged with an
    # hour's, the result would take a seq above chunks of later hours it overlaps but did not
    # read (``store.chunks``, "Windows").
    c = t.sample_chunks.c
    removed = _merge_chunks(conn, ids, [c.start_ms >= window, c.end_ms < window + WINDOW_MS],
                            window_ms=WINDOW_MS)
    if (window + WINDOW_MS) % SPAN_MS == 0:
        span = span_start(window)
        removed += _merge_chunks(conn, ids, [c.start_ms >= span, c.start_ms < span + SPAN_MS],
                                 window_ms=SPAN_MS)
    return removed


def _merge_chunks(conn: Connection, ids: list[int], within: list[Any], *, window_ms: int) -> int:
    c = t.sample_chunks.c
    where = [c.series_id.in_(ids), *within]
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
    m = merge_rows(rows, lo_ms=I64_MIN, hi_ms=I64_MAX, conn=conn)
    conn.execute(delete(t.sample_chunks).where(*where))
    encoded = encode(m.ids, m.ts, m.values, max_samples=MAX_SAMPLES, window_ms=window_ms)
    if window_ms == SPAN_MS:
        merged = _compress_sharing(conn, encoded)
    else:
        # Hour chunks are merged again into their span soon: shared columns they referred
        # to would be left behind, unreferenced, until retention.
        merged = compress(encoded)
    insert_chunks(conn, merged, np.array([top_seq[s] for s in merged.ids.tolist()], np.int64))
    return len(rows) - len(merged)


def _compress_sharing(conn: Connection, encoded: Encoded) -> Encoded:
    """``encoded`` compressed, its chunks referring to shared timestamp columns
    (``store.chunks.compress_shared``), which are stored unless there already.

    Only columns starting at or after the raw retention horizon are shared: retention deletes
    the columns ending before its cutoff once it has deleted the chunks there, and a chunk
    written meanwhile must not refer to one (``store.retention``).  A stored column of the same
    start and key but other bytes (a 64-bit hash collision, or another pcodec) is not
    overwritten: the chunks are then written holding their own timestamps.
    """
    horizon = int_meta(conn, HORIZON_RAW) or I64_MIN
    merged, columns = compress_shared(encoded, share_from_ms=horizon)
    if not columns:
        return merged
    c = t.chunk_timestamps.c
    refs = [(col.start_ms, col.key) for col in columns]
    stored: dict[tuple[int, int], bytes] = {}
    for i in range(0, len(refs), ID_BATCH):
        part = sorted(refs[i : i + ID_BATCH])
        for start, key, data in conn.execute(select(c.start_ms, c.key, c.data).where(
                c.start_ms >= part[0][0], c.start_ms <= part[-1][0],
                tuple_(c.start_ms, c.key).in_(part))):
            stored[(int(start), int(key))] = bytes(data)
    if any(stored.get(r, col.data) != col.data for r, col in zip(refs, columns, strict=True)):
        log.warning("compaction: a shared timestamp column's key matches another column; "
                    "these chunks keep their own timestamps")
        return compress(encoded)
    new = [col._asdict() for r, col in zip(refs, columns, strict=True) if r not in stored]
    if new:
        conn.execute(insert(t.chunk_timestamps), new)
    return merged


def _compact_rollups(conn: Connection, ids: list[int], window: int) -> int:
    """Merge each series' open rollup chunks, in the rollup windows
    (``rollup_chunks.WINDOWS``) holding the hour ``window``; returns chunks removed.

    A rollup run appends a raw chunk per series (a bucket or a few); every hour, the chunks
    of a window that are raw or under half of ``rollup_chunks.PIECE_BYTES`` (open: the runs'
    chunks and the last piece of an earlier merge) are merged and compressed, and the pieces
    that came out larger stay as they are from then on: an hour rewrites a piece or two per
    series, not the whole day.
    Safe as compaction of samples is (:func:`compact`): under the rollup lock, which every
    rollup run holds too; every chunk written after a merge has a higher ``seq`` than the
    pieces it left, and the merged chunks keep the highest ``seq`` they replaced.
    """
    removed = 0
    for table, res in ((t.rollup_chunks_5m, ROLLUP_5M_MS), (t.rollup_chunks_1h, ROLLUP_1H_MS)):
        c = table.c
        lo = rc.window_start(window, res)
        where = [c.series_id.in_(ids), c.start_ms >= lo, c.start_ms < lo + rc.WINDOWS[res],
                 or_(func.length(c.data) < rc.PIECE_BYTES[res] // 2,
                     func.length(c.data) == 48 * c.n)]
        raw = func.sum(case((func.length(c.data) == 48 * c.n, 1), else_=0))
        query = select(c.series_id).where(*where).group_by(c.series_id).having(
            or_(func.count() > 1, raw > 0))
        todo = list(conn.execute(query).scalars())
        if not todo:
            continue
        where[0] = c.series_id.in_(todo)
        rows = conn.execute(select(c.series_id, c.start_ms, c.seq, c.n, c.data)
                            .where(*where)).all()
        sids, starts, seqs, ns, blobs = zip(*rows, strict=True)
        sid_a, seq_a = np.array(sids, np.int64), np.array(seqs, np.int64)
        merged_rows = rc.decode(sid_a, seq_a, np.array(starts, np.int64),
                                np.array(ns, np.int64), list(blobs), lo_ms=I64_MIN,
                                hi_ms=I64_MAX)
        conn.execute(delete(table).where(*where))
        merged = rc.compress(rc.encode(merged_rows, res), res)
        order = np.argsort(sid_a, kind="stable")
        firsts, _ = run_bounds(sid_a[order])
        top = np.maximum.reduceat(seq_a[order], firsts)
        series = sid_a[order][firsts]
        insert_chunks(conn, merged, top[np.searchsorted(series, merged.ids)], table=table.name)
        removed += len(rows) - len(merged)
    return removed
