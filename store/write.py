"""Statements of the write path: resolving series ids, and inserting a batch of samples.

Functions here take a connection already inside a transaction; ``store.store.Store`` owns the
buffer, the series cache and the retry policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

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
    # a session-local staging table and upsert from there in one statement.  The staging
    # table lives as long as the pooled connection and empties itself at every commit.
    raw = conn.connection.driver_connection
    assert raw is not None
    if not conn.info.get(_STAGE):
        conn.exec_driver_sql(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGE} "
            "(series_id BIGINT NOT NULL, ts BIGINT NOT NULL, value DOUBLE PRECISION NOT NULL) "
            "ON COMMIT DELETE ROWS"
        )
        conn.info[_STAGE] = True
    with raw.cursor() as cur:
        with cur.copy(f"COPY {_STAGE} (series_id, ts, value) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int8", "int8", "float8"])
            for row in rows:
                cp.write_row(row)
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
