"""``Migrations`` (``Store.migrations``): create the schema, upgrade an older one in place.

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

Version 4 -> 5: compaction is rewound to the oldest chunk, as from version 3, so that it
merges the stored hour chunks into 6 h spans (``store.chunks``); and rollups move from a row
per series and bucket (``rollups_5m``, ``rollups_1h``) into compressed column chunks
(``store.rollup_chunks``), a batch of whole series per transaction, resumable
(:func:`rollup_rows_to_chunks`); the old tables are dropped once empty.

Version 5 -> 6: compaction may store a span's timestamp column once for the series sharing it
(``chunk_timestamps``, ``store.chunks``).  The upgrade creates the table (``create_all``) and
bumps the version, which keeps an older tritonwatch, unable to read such chunks, off the
database; the chunks already stored stay as they are and readable.

Version 6 -> 7: ``sample_log`` is keyed ``(seq, target, name, start_ms)`` instead of
``(target, name, seq)`` and each flush is listed in ``sample_log_flushes``
(``store.samplelog``).  The log holds an hour of samples or so, so the upgrade rewrites it
in its own transaction (:func:`own_sample_log`, which also gives it version 10's owners) and
lists its flushes; the bump keeps an older tritonwatch, whose flushes would not be listed,
off.

Version 7 -> 8: nothing to convert.  Log rows may list their series ids as runs
(``store.samplelog``, "Row format"), which version 7 would take for damaged rows and drop:
the bump keeps it off.

Version 8 -> 9: nothing to convert.  Compact log rows may hold their values as int32s
(``store.samplelog``, "Row format"), which version 8 would take for damaged rows: the bump
keeps it off.

Version 9 -> 10: ``sample_log`` rows name their target and metric by an ``owner`` id
(``sample_log_owners``) instead of two texts.  :func:`own_sample_log` creates an owner per
(target, name) the log holds and copies the log into the new table, in the upgrade's own
transaction (an hour of samples or so; SQLite cannot drop a key column in place).
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager

import numpy as np
from sqlalchemy import Connection, Engine, func, insert, inspect, select, text

from tritonwatch.schemas import tables as t
from tritonwatch.store import rollup_chunks as rc
from tritonwatch.store.chunks import MAX_SAMPLES, encode, window_start
from tritonwatch.store.engine import transaction
from tritonwatch.store.errors import StoreError, db_errors
from tritonwatch.store.maintenance import COMPACT_REWIND, advisory_lock
from tritonwatch.store.query import ROLLUP_1H_MS, ROLLUP_5M_MS
from tritonwatch.store.write import get_meta, insert_chunks, set_meta

log = logging.getLogger(__name__)

# Arbitrary constant key for pg_advisory_xact_lock around schema creation.
PG_LOCK_SCHEMA = 0x7477_0000

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


def has_legacy_rollups(engine: Engine) -> bool:
    """Whether a version 4 rollup table (a row per series and bucket) is still there."""
    with transaction(engine, write=False) as conn:
        inspector = inspect(conn)
        return any(inspector.has_table(name) for name in t.LEGACY_ROLLUP_TABLES)


def rollup_rows_to_chunks(engine: Engine, *, lock_key: int, batch_series: int = 500) -> int:
    """Move every row of the version 4 rollup tables into rollup chunks, then drop those
    tables; returns rows moved.

    A bounded batch of whole series per transaction, the chunks compressed and inserted with
    write sequence 0 (older than any rollup written afterwards) and the rows deleted in the
    same transaction: an interrupted upgrade resumes where it stopped, and readers of the new
    schema never see a bucket twice.
    """
    moved = 0
    for name, table in t.LEGACY_ROLLUP_TABLES.items():
        res = ROLLUP_1H_MS if name.endswith("1h") else ROLLUP_5M_MS
        while True:
            with transaction(engine, write=True) as conn:
                advisory_lock(conn, lock_key)
                if not inspect(conn).has_table(name):
                    break  # another process finished it
                ids = [int(r[0]) for r in conn.execute(text(
                    f"SELECT DISTINCT series_id FROM {name} ORDER BY series_id LIMIT :n"
                ), {"n": batch_series})]
                if not ids:
                    conn.execute(text(f"DROP TABLE {name}"))
                    log.info("store: schema upgrade: %s moved into %s", name, table.name)
                    break
                rows = conn.execute(text(
                    f'SELECT series_id, ts, "min", "max", "sum", "count", "last" FROM {name} '
                    f"WHERE series_id BETWEEN :lo AND :hi ORDER BY series_id, ts"
                ), {"lo": ids[0], "hi": ids[-1]}).all()
                cols = list(zip(*rows, strict=True))
                f64 = [np.array(c, np.float64) for c in cols[2:]]
                found = rc.Rows(np.array(cols[0], np.int64), np.array(cols[1], np.int64),
                                f64[0], f64[1], f64[2], np.array(cols[5], np.int64), f64[4])
                insert_chunks(conn, rc.compress(rc.encode(found, res), res), 0,
                              table=table.name)
                conn.execute(text(f"DELETE FROM {name} WHERE series_id BETWEEN :lo AND :hi"),
                             {"lo": ids[0], "hi": ids[-1]})
                moved += len(rows)
    return moved


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
    log.info("store: schema upgrade: sample chunks from %d ms on will be compacted again "
             "(compressed, merged into spans) by maintenance", window)
    return window


def own_sample_log(conn: Connection, *, list_flushes: bool) -> bool:
    """Give a version 3 to 9 ``sample_log`` (rows keyed by target and name texts) version 10's
    shape: an owner per (target, name) in ``sample_log_owners``, the rows copied in ``seq``
    order under the new key; with ``list_flushes`` (versions 3 to 6), list its flushes in
    ``sample_log_flushes``.  Returns whether there was anything to do."""
    if "owner" in {col["name"] for col in inspect(conn).get_columns("sample_log")}:
        return False
    old = "sample_log_v9"
    conn.exec_driver_sql(f"ALTER TABLE sample_log RENAME TO {old}")
    if conn.dialect.name == "postgresql":  # the new table's key takes the name
        conn.exec_driver_sql(f"ALTER TABLE {old} RENAME CONSTRAINT pk_sample_log TO pk_{old}")
    t.sample_log.create(conn)
    # ``WHERE true``: SQLite would read ``ON CONFLICT`` as a join's ``ON`` otherwise.
    conn.execute(text(
        f"INSERT INTO sample_log_owners (target, name, resolved_at) "
        f"SELECT DISTINCT target, name, :now FROM {old} WHERE true ON CONFLICT DO NOTHING"
    ), {"now": round(time.time() * 1000)})
    conn.exec_driver_sql(
        f"INSERT INTO sample_log (owner, seq, start_ms, end_ms, n, data) "
        f"SELECT o.id, l.seq, l.start_ms, l.end_ms, l.n, l.data FROM {old} l "
        f"JOIN sample_log_owners o ON o.target = l.target AND o.name = l.name ORDER BY l.seq"
    )
    conn.exec_driver_sql(f"DROP TABLE {old}")
    if list_flushes:
        c = t.sample_log.c
        conn.execute(insert(t.sample_log_flushes).from_select(
            ["seq", "start_ms", "end_ms"],
            select(c.seq, func.min(c.start_ms), func.max(c.end_ms)).group_by(c.seq),
        ))
    return True


class Migrations:
    """The schema of one store's database: created, or upgraded in place."""

    def __init__(self, engine: Engine, url_redacted: str) -> None:
        self._engine = engine
        self._url = url_redacted

    def _db(self, action: str) -> AbstractContextManager[None]:
        return db_errors(action, self._url)

    def apply(self) -> None:
        """Create missing tables (idempotent, safe from several processes at once).

        A database of an older schema is upgraded in place: raw samples of version 1 (a
        ``samples`` row per sample) are moved into chunks in bounded transactions, which
        resume where they stopped if interrupted (the module docstring).  A database of a
        newer schema is refused (StoreError).
        """
        with self._db("create schema"):
            with transaction(self._engine, write=True) as conn:
                # Two processes starting at once would race to CREATE the same tables.
                advisory_lock(conn, PG_LOCK_SCHEMA)
                t.metadata.create_all(conn)
                stored = get_meta(conn, "schema_version")
                if stored is None:
                    set_meta(conn, "schema_version", str(t.SCHEMA_VERSION))
                elif int(stored) > t.SCHEMA_VERSION:
                    raise StoreError(
                        f"{self._url}: schema version {stored} is newer than this "
                        f"tritonwatch understands ({t.SCHEMA_VERSION}); upgrade tritonwatch",
                        url=self._url,
                    )
            if stored is not None and int(stored) < t.SCHEMA_VERSION:
                log.info(
                    "store: upgrading %s from schema version %s to %d",
                    self._url, stored, t.SCHEMA_VERSION,
                )
            if has_legacy_samples(self._engine):
                samples_to_chunks(self._engine, lock_key=PG_LOCK_SCHEMA)
            if has_legacy_rollups(self._engine):
                rollup_rows_to_chunks(self._engine, lock_key=PG_LOCK_SCHEMA)
            if stored is not None and int(stored) < t.SCHEMA_VERSION:
                with transaction(self._engine, write=True) as conn:
                    advisory_lock(conn, PG_LOCK_SCHEMA)
                    if int(stored) < 5:
                        # Under the lock, with the bump: a second process upgrading at once
                        # finds version 5 and marks nothing twice (harmless anyway).  From
                        # version 4, compaction merges the hour chunks into 6 h spans.
                        recompress_chunks(conn)
                    if int(stored) < 10:
                        own_sample_log(conn, list_flushes=int(stored) < 7)
                    set_meta(conn, "schema_version", str(t.SCHEMA_VERSION))
