"""Statements of the write path: resolving series ids, and inserting a batch of samples.

Functions here take a connection already inside a transaction; ``store.store.Store`` owns the
buffer, the series cache and the retry policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import BigInteger, Column, Connection, Double, MetaData, Table, select
from sqlalchemy.dialects import postgresql, sqlite

from schemas import tables as t
from schemas.samples import Labels, labels_json

SeriesKeyTuple = tuple[str, str, Labels]  # (target, name, labels): the series cache key
Row = tuple[int, int, float]  # (series_id, ts_ms, value)


def dialect_insert(conn: Connection, table: Table) -> Any:
    """``INSERT`` with ``ON CONFLICT`` support for the connection's backend."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def resolve_series(
    conn: Connection, keys: Iterable[SeriesKeyTuple], *, now_ms: int
) -> dict[SeriesKeyTuple, int]:
    """Ids for ``keys``, creating the series that do not exist yet.

    One upsert for the whole batch.  ``ON CONFLICT`` makes two writers creating the same series
    at once safe (the loser gets the winner's id), the keys are sorted so that two writers
    lock index entries in the same order and cannot deadlock, and the ``DO UPDATE`` of
    ``resolved_at`` (rather than ``DO NOTHING``) both returns the existing row's id and tells
    retention the series is in use (see ``maintenance.delete_empty_series``).
    """
    ordered = sorted(set(keys))
    if not ordered:
        return {}
    texts = [labels_json(labels) for _, _, labels in ordered]
    # Deduplicated on the stored text: PostgreSQL refuses to upsert one row twice per statement.
    params = [
        {"target": target, "name": name, "labels": text, "resolved_at": now_ms}
        for target, name, text in sorted(
            {(k[0], k[1], text) for k, text in zip(ordered, texts, strict=True)}
        )
    ]
    stmt = dialect_insert(conn, t.series)
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.series.c.target, t.series.c.name, t.series.c.labels],
        set_={"resolved_at": stmt.excluded.resolved_at},
    ).returning(t.series.c.id, t.series.c.target, t.series.c.name, t.series.c.labels)
    by_text = {(r.target, r.name, r.labels): r.id for r in conn.execute(stmt, params)}
    # Keyed by the caller's label tuples: two tuples with the same canonical JSON (say, one
    # not sorted) share one row.
    return {key: by_text[(key[0], key[1], text)] for key, text in zip(ordered, texts, strict=True)}


def insert_samples(conn: Connection, rows: Sequence[Row]) -> None:
    """Insert ``rows`` (sorted by key, no duplicate keys), replacing values already stored.

    Replacing rather than ignoring makes a retried flush idempotent.
    """
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        _copy_samples(conn, rows)
    else:
        conn.exec_driver_sql(
            "INSERT INTO samples (series_id, ts, value) VALUES (?, ?, ?) "
            "ON CONFLICT (series_id, ts) DO UPDATE SET value = excluded.value",
            list(rows),
        )


_STAGE = "tw_samples_in"
# Described here only to build the upsert from it; it is created by raw DDL below, per session.
_stage = Table(
    _STAGE,
    MetaData(),
    Column("series_id", BigInteger),
    Column("ts", BigInteger),
    Column("value", Double),
)


def _copy_samples(conn: Connection, rows: Sequence[Row]) -> None:
    # COPY is several times cheaper than executemany, but cannot say ON CONFLICT; so COPY into
    # a session-local staging table and upsert from there in one statement.
    n = len(rows)
    ids = np.fromiter((r[0] for r in rows), np.int64, n)
    ts = np.fromiter((r[1] for r in rows), np.int64, n)
    values = np.fromiter((r[2] for r in rows), np.float64, n)
    _upsert_via_stage(conn, _copy_binary(ids, ts, values))


def _ensure_stage(conn: Connection) -> None:
    # The staging table lives as long as the pooled connection and empties itself at every
    # commit.
    if not conn.info.get(_STAGE):
        conn.exec_driver_sql(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGE} "
            "(series_id BIGINT NOT NULL, ts BIGINT NOT NULL, value DOUBLE PRECISION NOT NULL) "
            "ON COMMIT DELETE ROWS"
        )
        conn.info[_STAGE] = True


def _upsert_from_stage(conn: Connection) -> None:
    # ORDER BY: rows are locked in key order, so two writers upserting overlapping keys wait
    # for each other instead of deadlocking.
    source = select(_stage.c.series_id, _stage.c.ts, _stage.c.value).order_by(
        _stage.c.series_id, _stage.c.ts
    )
    stmt = postgresql.insert(t.samples).from_select(["series_id", "ts", "value"], source)
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.samples.c.series_id, t.samples.c.ts],
        set_={"value": stmt.excluded.value},
    )
    conn.execute(stmt)


class Layout:
    """The series of one target's scrape, in the order the scrape lists them, with their ids.

    A target exposes the same series in the same order scrape after scrape, so the store keeps
    its last layout and builds the next one block by block: a block whose names and label
    tuples compare equal to the same block of the previous layout (list comparisons in C,
    mostly identity checks, since the parser caches label tuples) takes its ids without
    hashing a single label tuple.  Only blocks that changed (typically the derived SLIs at
    the end, whose set varies with traffic) look their keys up in the series-id cache.
    """

    __slots__ = ("ids", "labels", "names", "target", "unresolved")

    BLOCK = 256
    ids: npt.NDArray[np.int64]

    def __init__(
        self,
        target: str,
        names: list[str],
        labels: list[Labels],
        cache: Mapping[SeriesKeyTuple, int],
        prev: Layout | None = None,
    ) -> None:
        self.target = target
        self.names = names
        self.labels = labels
        n = len(names)
        ids = np.empty(n, np.int64)
        prev_ids: npt.NDArray[np.int64] = ids if prev is None else prev.ids
        b = self.BLOCK
        for lo in range(0, n, b):
            hi = min(lo + b, n)
            if (
                prev is not None
                and len(prev.names) >= hi
                and prev.names[lo:hi] == names[lo:hi]
                and prev.labels[lo:hi] == labels[lo:hi]
            ):
                ids[lo:hi] = prev_ids[lo:hi]
            else:
                keys = zip(repeat(target), names[lo:hi], labels[lo:hi], strict=False)
                ids[lo:hi] = np.fromiter(map(cache.get, keys, repeat(-1)), np.int64, hi - lo)
        self.ids = ids
        #: Positions without an id yet (-1): series only ever seen as NaN, or not created yet.
        self.unresolved = int(np.count_nonzero(ids < 0))

    def same(self, names: list[str], labels: list[Labels]) -> bool:
        return self.names == names and self.labels == labels

    def keys_at(self, positions: Iterable[int]) -> Iterator[SeriesKeyTuple]:
        target, names, labels = self.target, self.names, self.labels
        return ((target, names[i], labels[i]) for i in positions)

    def fill(self, cache: Mapping[SeriesKeyTuple, int]) -> None:
        """Take the ids still missing from ``cache``."""
        holes = np.flatnonzero(self.ids < 0)
        self.ids[holes] = np.fromiter(
            map(cache.get, self.keys_at(holes.tolist()), repeat(-1)), np.int64, len(holes)
        )
        self.unresolved = int(np.count_nonzero(self.ids < 0))


def insert_columns(
    conn: Connection,
    ids: npt.NDArray[np.int64],
    ts: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
) -> None:
    """Insert samples given as three columns: no duplicate ``(id, ts)`` keys, no NaN.

    Existing values are replaced (a retried flush is idempotent).  SQLite: one
    ``executemany`` fed by an iterator over the columns, so no row list is built.  PostgreSQL:
    the binary COPY stream is built by numpy in one piece and COPYed straight into ``samples``
    inside a savepoint; only when that hits an existing key (a re-sent scrape, a retried
    flush) does it fall back to the staging-table upsert.
    """
    if not len(ids):
        return
    if conn.dialect.name != "postgresql":
        raw = conn.connection.driver_connection
        assert raw is not None
        rows = zip(ids.tolist(), ts.tolist(), values.tolist(), strict=True)
        raw.executemany(_SQLITE_UPSERT, rows)
        return
    data = _copy_binary(ids, ts, values)
    try:
        with conn.begin_nested():
            _copy(conn, "samples", data)
    except psycopg.errors.UniqueViolation:
        _upsert_via_stage(conn, data)


_SQLITE_UPSERT = (
    "INSERT INTO samples (series_id, ts, value) VALUES (?, ?, ?) "
    "ON CONFLICT (series_id, ts) DO UPDATE SET value = excluded.value"
)

# PostgreSQL binary COPY: a header, then per row a field count and (length, big-endian value)
# per field, then a trailer.  A packed numpy record is exactly one row.
_PG_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
_PG_TRAILER = b"\xff\xff"
_PG_ROW = np.dtype(
    [("n", ">i2"), ("l1", ">i4"), ("id", ">i8"), ("l2", ">i4"), ("ts", ">i8"), ("l3", ">i4"),
     ("v", ">f8")]
)


def _copy_binary(
    ids: npt.NDArray[np.int64], ts: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
) -> bytes:
    rows = np.empty(len(ids), _PG_ROW)
    rows["n"] = 3
    rows["l1"] = 8
    rows["l2"] = 8
    rows["l3"] = 8
    rows["id"] = ids
    rows["ts"] = ts
    rows["v"] = values
    return _PG_HEADER + rows.tobytes() + _PG_TRAILER


def _copy(conn: Connection, table: str, data: bytes) -> None:
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur, cur.copy(
        f"COPY {table} (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
    ) as cp:
        cp.write(data)


def _upsert_via_stage(conn: Connection, data: bytes) -> None:
    _ensure_stage(conn)
    _copy(conn, _STAGE, data)
    _upsert_from_stage(conn)
