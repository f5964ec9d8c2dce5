"""Retention: samples, rollup rows and health transitions past their age, then empty series.

Deletes in bounded transactions, walking the series ids (``store.maintenance`` explains the
watermarks, the horizons that keep a rollup from summarising a half-deleted bucket, and
``stop``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import nullcontext

import numpy as np
from sqlalchemy import Engine, Table, delete, exists, select, tuple_

from tritonwatch.schemas import tables as t
from tritonwatch.store import rollup_chunks as rc
from tritonwatch.store.chunks import I64_MAX, compress, encode
from tritonwatch.store.engine import transaction
from tritonwatch.store.maintenance import (
    HORIZON_5M,
    HORIZON_RAW,
    ID_BATCH,
    Gate,
    Stop,
    Stopped,
    advisory_lock,
    ceil_ms,
    int_meta,
    never,
    series_id_batch,
    watermarks,
)
from tritonwatch.store.query import ROLLUP_1H_MS, ROLLUP_5M_MS, merge_rows
from tritonwatch.store.write import PG_LOCK_ROLLUP, insert_chunks, set_meta

log = logging.getLogger(__name__)

# Straddling chunks rewritten per transaction (3 bound parameters each).
_CUT_BATCH = 1000


def _series_batches(engine: Engine) -> Iterator[list[int]]:
    """The series ids, :data:`ID_BATCH` at a time in order, each batch read in a transaction of
    its own (``maintenance.series_id_batch``: not one list of them all, held for the pass)."""
    after: int | None = None
    while True:
        with transaction(engine, write=False) as conn:
            batch = series_id_batch(conn, after, ID_BATCH)
        if batch:
            yield batch
        if len(batch) < ID_BATCH:
            return
        after = batch[-1]


def _delete_rollups_before(
    engine: Engine, table: Table, res: int, cutoff_ms: int, *, batch_rows: int, gate: Gate,
    stop: Stop,
) -> int:
    """Delete the rollup buckets of ``table`` (resolution ``res``) starting before
    ``cutoff_ms``; returns how many.

    As :func:`_delete_chunks_before` does for samples: chunks wholly before the cutoff go, at
    most ``batch_rows`` per transaction, walking the series ids (range scans of the primary
    key); a chunk straddling it is rewritten with its buckets from the cutoff on, same ``seq``.
    """
    c = table.c
    key = tuple_(c.series_id, c.start_ms, c.seq)
    deleted = 0
    for batch in _series_batches(engine):
        old = (c.series_id.in_(batch), c.start_ms < cutoff_ms)
        while True:
            if stop():
                raise Stopped
            victims = select(c.series_id, c.start_ms, c.seq).where(*old, c.end_ms < cutoff_ms)
            with gate, transaction(engine, write=True) as conn:
                advisory_lock(conn, PG_LOCK_ROLLUP)
                stmt = delete(table).where(key.in_(victims.limit(batch_rows)))
                counts = conn.execute(stmt.returning(c.n)).scalars().all()
            deleted += sum(counts)
            if len(counts) < batch_rows:
                break
        while True:
            if stop():
                raise Stopped
            with gate, transaction(engine, write=True) as conn:
                advisory_lock(conn, PG_LOCK_ROLLUP)
                rows = conn.execute(
                    select(c.series_id, c.start_ms, c.seq, c.n, c.data)
                    .where(*old, c.end_ms >= cutoff_ms)
                    .limit(_CUT_BATCH)
                ).all()
                if rows:
                    conn.execute(delete(table).where(key.in_([tuple(r[:3]) for r in rows])))
                for sid, start, seq, n, data in rows:
                    kept = rc.decode(np.array([sid], np.int64), np.array([seq], np.int64),
                                     np.array([start], np.int64), np.array([n], np.int64),
                                     [data], lo_ms=cutoff_ms, hi_ms=I64_MAX)
                    deleted += n - len(kept)
                    insert_chunks(conn, rc.compress(rc.encode(kept, res), res), seq,
                                  table=table.name)
            if len(rows) < _CUT_BATCH:
                break
    return deleted


def _delete_chunks_before(
    engine: Engine, cutoff_ms: int, *, batch_rows: int, gate: Gate, stop: Stop
) -> int:
    """Delete raw samples with ``ts < cutoff_ms``; returns how many.

    Walks the series ids so that every statement is a range scan of the primary key, and
    deletes at most ``batch_rows`` chunks per transaction.  A chunk wholly before the cutoff
    is deleted; one straddling it is then rewritten with its samples from the cutoff on (same
    ``seq``, so it keeps its place in write order).  Under the rollup lock, so that a
    compaction never writes back samples deleted here.
    """
    c = t.sample_chunks.c
    key = tuple_(c.series_id, c.start_ms, c.seq)
    deleted = 0
    for batch in _series_batches(engine):
        old = (c.series_id.in_(batch), c.start_ms < cutoff_ms)
        while True:
            if stop():
                raise Stopped
            victims = select(c.series_id, c.start_ms, c.seq).where(*old, c.end_ms < cutoff_ms)
            with gate, transaction(engine, write=True) as conn:
                advisory_lock(conn, PG_LOCK_ROLLUP)
                stmt = delete(t.sample_chunks).where(key.in_(victims.limit(batch_rows)))
                counts = conn.execute(stmt.returning(t.sample_chunks.c.n)).scalars().all()
            deleted += sum(counts)
            if len(counts) < batch_rows:
                break
        while True:
            if stop():
                raise Stopped
            with gate, transaction(engine, write=True) as conn:
                advisory_lock(conn, PG_LOCK_ROLLUP)
                rows = conn.execute(
                    select(c.series_id, c.start_ms, c.seq, c.n, c.data)
                    .where(*old, c.end_ms >= cutoff_ms)
                    .limit(_CUT_BATCH)
                ).all()
                if rows:
                    conn.execute(
                        delete(t.sample_chunks).where(key.in_([tuple(r[:3]) for r in rows]))
                    )
                for sid, start, seq, n, data in rows:
                    # Chunk by chunk: merging them would change what each one stores.
                    m = merge_rows([(sid, start, seq, n, data)], lo_ms=cutoff_ms, hi_ms=I64_MAX,
                                   conn=conn)
                    deleted += n - len(m)
                    # Holding its own timestamps: the shared column it may have referred to
                    # starts before the cutoff, and goes below.
                    insert_chunks(conn, compress(encode(m.ids, m.ts, m.values)), seq)
            if len(rows) < _CUT_BATCH:
                break
    _delete_shared_timestamps_before(engine, cutoff_ms, batch_rows=batch_rows, gate=gate,
                                     stop=stop)
    return deleted


def _delete_shared_timestamps_before(
    engine: Engine, cutoff_ms: int, *, batch_rows: int, gate: Gate, stop: Stop
) -> None:
    """Delete the shared timestamp columns (``chunk_timestamps``) ending before ``cutoff_ms``.

    Run once every chunk ending before the cutoff is deleted and every chunk straddling it
    rewritten holding its own timestamps: a chunk refers to a column of exactly its own
    timestamps, so none left refers to these.  Compaction shares no column starting before
    the raw horizon, which :func:`apply_retention` moved to the cutoff (or past it) before
    any of this, so it cannot refer to one of them meanwhile.  Columns no chunk refers to any
    more (a span compacted again after late samples) stay until then: a few hundred bytes.
    """
    c = t.chunk_timestamps.c
    key = tuple_(c.start_ms, c.key)
    while True:
        if stop():
            raise Stopped
        victims = select(c.start_ms, c.key).where(c.start_ms < cutoff_ms, c.end_ms < cutoff_ms)
        with gate, transaction(engine, write=True) as conn:
            advisory_lock(conn, PG_LOCK_ROLLUP)
            gone = conn.execute(delete(t.chunk_timestamps).where(
                key.in_(victims.limit(batch_rows))).returning(c.n)).scalars().all()
        if len(gone) < batch_rows:
            return


def delete_empty_series(engine: Engine, *, resolved_before_ms: int) -> int:
    """Delete series holding no data that no writer has resolved since ``resolved_before_ms``.

    The ``resolved_at`` guard closes the race with a writer that has just looked up (or
    created) a series and is about to insert its first samples: that lookup refreshed
    ``resolved_at``, so the series is not deleted under it.  Series of a (target, name) with
    rows in the log are all kept: which series a row holds is inside its data.  The log
    owners (``sample_log_owners``) of the (target, name) pairs left without series go too,
    under the same ``resolved_at`` rule (a writer's layout refreshes its owners').
    """
    s = t.series
    empty = [
        ~exists().where(table.c.series_id == s.c.id)
        for table in (t.sample_chunks, t.rollup_chunks_5m, t.rollup_chunks_1h)
    ]
    with transaction(engine, write=True) as conn:
        found = conn.execute(
            select(s.c.id, s.c.target, s.c.name).where(s.c.resolved_at < resolved_before_ms,
                                                       *empty)
        ).all()
        if not found:
            return 0
        # The log's rows name their series by owner, a target and name (which series is
        # inside the data); the log is keyed by flush first, so it is searched per flush for
        # these owners only, not scanned.
        c, f, o = t.sample_log.c, t.sample_log_flushes.c, t.sample_log_owners.c
        owners = sorted({(r.target, r.name) for r in found})
        logged: set[tuple[str, str]] = set()
        for i in range(0, len(owners), _OWNERS_PER_QUERY):
            logged.update(tuple(r) for r in conn.execute(
                select(o.target, o.name).where(
                    tuple_(o.target, o.name).in_(owners[i : i + _OWNERS_PER_QUERY]),
                    exists().where(c.seq.in_(select(f.seq)), c.owner == o.id),
                )
            ))
        gone = [r.id for r in found if (r.target, r.name) not in logged]
        deleted = 0
        for i in range(0, len(gone), _OWNERS_PER_QUERY):
            result = conn.execute(delete(s).where(
                s.c.id.in_(gone[i : i + _OWNERS_PER_QUERY]),
                s.c.resolved_at < resolved_before_ms,
            ))
            deleted += max(result.rowcount, 0)
        left = sorted({(r.target, r.name) for r in found} - logged)
        for i in range(0, len(left), _OWNERS_PER_QUERY):
            conn.execute(delete(t.sample_log_owners).where(
                tuple_(o.target, o.name).in_(left[i : i + _OWNERS_PER_QUERY]),
                o.resolved_at < resolved_before_ms,
                ~exists().where(s.c.target == o.target, s.c.name == o.name),
            ))
    return deleted


#: (target, name) pairs or series ids bound per statement (SQLite's limit is 32,766).
_OWNERS_PER_QUERY = 1000


def apply_retention(
    engine: Engine,
    *,
    now_ms: int,
    raw_ms: int,
    rollup_5m_ms: int,
    rollup_1h_ms: int,
    batch_rows: int,
    gate: Gate | None = None,
    stop: Stop = never,
) -> int:
    """Delete samples, rollup rows and health transitions past their retention.

    Returns the sample and rollup rows deleted.  Empty series are left to
    :func:`delete_empty_series`, which the caller runs under its flush lock.

    Raw samples are kept until the 5 m rollup has summarised them, and 5 m rows until the 1 h
    rollup has, whatever their age: a stalled rollup job delays retention instead of losing
    history.  Raises :class:`Stopped` when ``stop`` ends it (the next run deletes the rest).
    """
    gate = gate or nullcontext()
    # Under the rollup lock, before anything is deleted: the watermarks cannot move meanwhile,
    # and no rollup (nor a late flush moving a watermark back) reaches below the horizons
    # once the rows under them start to go.
    with gate, transaction(engine, write=True) as conn:
        advisory_lock(conn, PG_LOCK_ROLLUP)
        marks = watermarks(conn)
        raw_cutoff = min(now_ms - raw_ms, marks.get(ROLLUP_5M_MS, 0))
        cutoff_5m = min(now_ms - rollup_5m_ms, marks.get(ROLLUP_1H_MS, 0))
        for key, cutoff, res in (
            (HORIZON_RAW, raw_cutoff, ROLLUP_5M_MS),
            (HORIZON_5M, cutoff_5m, ROLLUP_1H_MS),
        ):
            # The bucket holding the cutoff loses some rows: it is behind the horizon too.
            horizon = ceil_ms(cutoff, res)
            if horizon > (int_meta(conn, key) or 0):
                set_meta(conn, key, str(horizon))
    if raw_cutoff < now_ms - raw_ms:
        log.info("retention: raw samples kept until rolled up (5 m watermark %s)", raw_cutoff)
    deleted = _delete_chunks_before(
        engine, raw_cutoff, batch_rows=batch_rows, gate=gate, stop=stop
    )
    deleted += _delete_rollups_before(
        engine, t.rollup_chunks_5m, ROLLUP_5M_MS, cutoff_5m, batch_rows=batch_rows, gate=gate,
        stop=stop,
    )
    deleted += _delete_rollups_before(
        engine, t.rollup_chunks_1h, ROLLUP_1H_MS, now_ms - rollup_1h_ms, batch_rows=batch_rows,
        gate=gate, stop=stop,
    )
    with transaction(engine, write=True) as conn:
        # Transitions are tiny; keep them as long as the longest-lived data.
        log_ts = t.target_health_log.c.ts
        conn.execute(delete(t.target_health_log).where(log_ts < now_ms - rollup_1h_ms))
    return deleted
