"""Schema migrations run by ``Store.create_schema``.

Version 1 -> 2: raw samples moved from ``samples`` (one row per sample, keyed ``(series_id,
ts)``) to ``sample_chunks`` (see ``store.chunks``).  The rows are moved in key order, a bounded
batch per transaction: each transaction inserts the chunks of the oldest remaining rows and
deletes those rows, so an interrupted migration resumes where it stopped and readers of the
new schema never see a sample twice.  Migrated chunks take write sequence 0: older than
anything written afterwards.  ``samples`` is dropped once empty.

Version 3 -> 4: chunks are compressed (``store.chunks``).  Raw chunks stay readable (their
length tells them apart), so nothing has to be rewritten before the store opens: the upgrade
only marks every window from the oldest chunk's for compaction again
(:func:`recompress_chunks`), and maintenance's compaction, which rewrites every series with a
raw chunk in a window, re-encodes them window by window in its bounded, resumable
transactions.  The version bump keeps an older tritonwatch, which cannot read compressed
chunks, off the upgraded database.
"""

from __future__ import annotations

import logging

import numpy as np
from sqlalchemy import Connection, Engine, func, inspect, select, text

from tritonwatch.schemas import tables as t
from tritonwatch.store.chunks import MAX_SAMPLES, encode, window_start
from tritonwatch.store.engine import transaction
from tritonwatch.store.maintenance import COMPACT_REWIND, advisory_lock, get_meta, set_meta
from tritonwatch.store.write import insert_chunks

log = logging.getLogger(__name__)

LEGACY_SAMPLES = "samples"

#: Rows moved per transaction.
BATCH_ROWS = 200_000


def has_legacy_samples(engine: Engine) -> bool:
    """Whether the version 1 ``samples`` table is still there."""
    with transaction(engine, write=False) as conn:
        return inspect(conn).has_table(LEGACY_SAMPLES)


def samples_to_chunks(engine: Engine, *, lock_key: int, batch_rows: int | None = None) -> int:
    """Move every row of ``samples`` into ``sample_chunks``, then drop it; returns rows moved.

    Each transaction holds ``lock_key`` (PostgreSQL advisory lock; SQLite serialises writers),
    so two processes upgrading at once take turns instead of moving the same rows twice.
    """
    batch_rows = batch_rows or BATCH_ROWS
    moved = 0
    while True:
        with transaction(engine, write=True) as conn:
            advisory_lock(conn, lock_key)
            if not inspect(conn).has_table(LEGACY_SAMPLES):
                return moved  # another process finished it
            rows = conn.execute(
                text(
                    "SELECT series_id, ts, value FROM samples ORDER BY series_id, ts LIMIT :n"
                ),
                {"n": batch_rows},
            ).all()
            if not rows:
                conn.execute(text("DROP TABLE samples"))
                log.info("store: schema upgraded: %d samples moved into sample_chunks", moved)
                return moved
            if not moved:
                log.info("store: schema upgrade: moving samples into sample_chunks")
            ids, ts, values = zip(*rows, strict=True)
            chunks = encode(
                np.array(ids, np.int64),
                np.array(ts, np.int64),
                np.array(values, np.float64),
                max_samples=MAX_SAMPLES,
            )
            insert_chunks(conn, chunks, 0)
            last_id, last_ts = int(ids[-1]), int(ts[-1])
            conn.execute(
                text("DELETE FROM samples WHERE series_id < :s OR (series_id = :s AND ts <= :t)"),
                {"s": last_id, "t": last_ts},
            )
            moved += len(rows)


def recompress_chunks(conn: Connection) -> int | None:
    """Mark every window from the oldest chunk's for compaction again, so that maintenance
    compresses the raw chunks of a version 3 (or older) database; returns that window, or None
    when there are no chunks.  Idempotent: a rewind already further back stays."""
    if conn.dialect.name == "postgresql":
        # As a new database has it (``schemas.tables``): no pglz over compressed bytes.
        conn.exec_driver_sql("ALTER TABLE sample_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
    oldest = conn.execute(select(func.min(t.sample_chunks.c.start_ms))).scalar()
    if oldest is None:
        return None
    window = window_start(int(oldest))
    marked = get_meta(conn, COMPACT_REWIND)
    if marked is None or window < int(marked):
        set_meta(conn, COMPACT_REWIND, str(window))
    log.info("store: schema upgrade: raw sample chunks from %d ms on will be compressed by "
             "maintenance", window)
    return window
