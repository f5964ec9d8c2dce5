"""Read statements: series lookup, raw ranges, reset-aware increase, bucketed aggregation.

Label matching happens in Python after the candidate series are selected by name and target:
labels are stored as canonical JSON text, JSON functions differ between SQLite and PostgreSQL,
and a fleet has thousands of series, not millions.  Label values are never put into SQL text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from sqlalchemy import BigInteger, Connection, Double, Table, case, cast, func, literal, select

from schemas import tables as t
from schemas.samples import label_value, make_labels
from store.values import SeriesData, SeriesKey

Agg = Literal["avg", "min", "max", "sum", "count", "last"]
AGGS: frozenset[str] = frozenset({"avg", "min", "max", "sum", "count", "last"})

# Bound parameters per IN list: far below SQLite's 32766 and psycopg's 65535 limits.
_ID_CHUNK = 500

ROLLUP_5M_MS = 300_000
ROLLUP_1H_MS = 3_600_000

Candidates = Sequence[tuple[int, SeriesKey]]


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), _ID_CHUNK):
        yield list(ids[i : i + _ID_CHUNK])


def find_series(
    conn: Connection,
    *,
    name: str | None,
    target: str | None,
    match: Mapping[str, str] | None,
) -> list[tuple[int, SeriesKey]]:
    """``(id, key)`` of the series with this name/target whose labels equal ``match``.

    As in PromQL, ``{label: ""}`` matches series that do not have the label.  Sorted by key.
    """
    query = select(t.series.c.id, t.series.c.target, t.series.c.name, t.series.c.labels)
    if name is not None:
        query = query.where(t.series.c.name == name)
    if target is not None:
        query = query.where(t.series.c.target == target)
    found = []
    for row in conn.execute(query):
        labels = make_labels(json.loads(row.labels))
        if match and any(label_value(labels, k, "") != v for k, v in match.items()):
            continue
        found.append((row.id, SeriesKey(row.target, row.name, labels)))
    found.sort(key=lambda item: item[1])
    return found


def raw_range(conn: Connection, series: Candidates, *, lo_ms: int, hi_ms: int) -> list[SeriesData]:
    """Raw samples with ``lo_ms <= ts <= hi_ms``; series without any are left out."""
    points: dict[int, tuple[list[float], list[float]]] = {}
    s = t.samples.c
    for chunk in _chunks([sid for sid, _ in series]):
        query = (
            select(s.series_id, s.ts, s.value)
            .where(s.series_id.in_(chunk), s.ts >= lo_ms, s.ts <= hi_ms)
            .order_by(s.series_id, s.ts)
        )
        for sid, ts, value in conn.execute(query):
            tss, values = points.setdefault(sid, ([], []))
            tss.append(ts / 1000)
            values.append(value)
    return [
        SeriesData(key.target, key.name, key.labels, tuple(points[sid][0]), tuple(points[sid][1]))
        for sid, key in series
        if sid in points
    ]


def increase(
    conn: Connection, series: Candidates, *, lo_ms: int, hi_ms: int
) -> list[tuple[SeriesKey, float, int, int]]:
    """Reset-aware increase of each counter over its samples in ``[lo_ms, hi_ms]``.

    Returns ``(key, increase, first_ts_ms, last_ts_ms)`` for series with at least two samples.
    A value below its predecessor is a counter reset: the counter restarted from zero, so the
    new value itself is the increase since the reset (Prometheus does the same), never a
    negative delta.
    """
    s = t.samples.c
    keys = dict(series)
    out = []
    for chunk in _chunks(list(keys)):
        inner = (
            select(
                s.series_id,
                s.ts,
                s.value,
                func.lag(s.value).over(partition_by=s.series_id, order_by=s.ts).label("prev"),
            )
            .where(s.series_id.in_(chunk), s.ts >= lo_ms, s.ts <= hi_ms)
            .subquery()
        )
        delta = case(
            (inner.c.prev.is_(None), literal(0.0, Double)),
            (inner.c.value >= inner.c.prev, inner.c.value - inner.c.prev),
            else_=inner.c.value,
        )
        query = (
            select(
                inner.c.series_id,
                func.sum(delta),
                func.min(inner.c.ts),
                func.max(inner.c.ts),
            )
            .group_by(inner.c.series_id)
            .having(func.count() >= 2)
        )
        for sid, inc, first, last in conn.execute(query):
            out.append((keys[sid], float(inc), int(first), int(last)))
    out.sort(key=lambda item: item[0])
    return out


# --- buckets ---------------------------------------------------------------------------------
#
# Each source (raw samples or a rollup table) yields a *partial* per (series, bucket) that can be
# merged with the partial of another source for the same bucket: a step bucket may straddle the
# rollup watermark, half rolled up and half still raw.

Partial = tuple[Any, ...]

_MERGE: dict[str, Callable[[Partial, Partial], Partial]] = {
    "avg": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "sum": lambda a, b: (a[0] + b[0],),
    "count": lambda a, b: (a[0] + b[0],),
    "min": lambda a, b: (min(a[0], b[0]),),
    "max": lambda a, b: (max(a[0], b[0]),),
    "last": lambda a, b: a if a[0] >= b[0] else b,  # (ts of last point, its value)
}

_FINAL: dict[str, Callable[[Partial], float]] = {
    "avg": lambda p: float(p[0]) / p[1],
    "sum": lambda p: float(p[0]),
    "count": lambda p: float(p[0]),
    "min": lambda p: float(p[0]),
    "max": lambda p: float(p[0]),
    "last": lambda p: float(p[1]),
}


def _total(count: Any) -> Any:
    # PostgreSQL's SUM(bigint) is NUMERIC, which psycopg returns as Decimal.
    return cast(func.sum(count), BigInteger)


def _partials(
    conn: Connection,
    table: Table,
    ids: list[int],
    *,
    lo_ms: int,
    hi_ms: int,
    step_ms: int,
    agg: str,
) -> Iterator[tuple[int, int, Partial]]:
    c = table.c
    raw = table is t.samples
    bucket = (c.ts // step_ms) * step_ms
    cols: list[Any] = [c.series_id, c.ts, bucket.label("b")]
    cols += [c.value] if raw else [c["min"], c["max"], c["sum"], c["count"]]
    if agg == "last":
        # The value of the newest row in each bucket, computed once per partition.
        newest = func.first_value(c.value if raw else c["last"]).over(
            partition_by=(c.series_id, c.ts // step_ms), order_by=c.ts.desc()
        )
        cols.append(newest.label("newest"))
    inner = select(*cols).where(c.series_id.in_(ids), c.ts >= lo_ms, c.ts <= hi_ms).subquery()
    i = inner.c
    aggs: list[Any]
    if agg == "avg":
        aggs = (
            [func.sum(i.value), func.count()] if raw else [func.sum(i["sum"]), _total(i["count"])]
        )
    elif agg == "sum":
        aggs = [func.sum(i.value if raw else i["sum"])]
    elif agg == "count":
        aggs = [func.count() if raw else _total(i["count"])]
    elif agg == "min":
        aggs = [func.min(i.value if raw else i["min"])]
    elif agg == "max":
        aggs = [func.max(i.value if raw else i["max"])]
    else:  # last
        aggs = [func.max(i.ts), func.max(i.newest)]
    query = select(i.series_id, i.b, *aggs).group_by(i.series_id, i.b)
    for row in conn.execute(query):
        yield row[0], int(row[1]), tuple(row[2:])


def plan_sources(
    *, lo_ms: int, hi_ms: int, step_ms: int, watermarks: Mapping[int, int]
) -> list[tuple[Table, int, int]]:
    """Which table serves which part of ``[lo_ms, hi_ms]``: ``(table, lo, hi)`` inclusive.

    Rollups are used only when ``step`` is a multiple of their resolution (so every rollup row
    falls inside one step bucket), coarsest first, each up to its watermark (the end of the
    last completed rollup bucket); raw samples serve the rest.  Rollup rows are whole
    intervals, so the first bucket read from a rollup starts at the rollup interval holding
    ``lo`` rather than at ``lo`` itself.
    """
    plan: list[tuple[Table, int, int]] = []
    cursor = lo_ms
    for res, table in ((ROLLUP_1H_MS, t.rollups_1h), (ROLLUP_5M_MS, t.rollups_5m)):
        wm = watermarks.get(res)
        if step_ms % res or wm is None or cursor > hi_ms:
            continue
        start = cursor // res * res
        end = min(wm, hi_ms // res * res + res)  # exclusive
        if end > start:
            plan.append((table, start, end - 1))
            cursor = max(cursor, end)
    if cursor <= hi_ms:
        plan.append((t.samples, cursor, hi_ms))
    return plan


def buckets(
    conn: Connection,
    series: Candidates,
    *,
    lo_ms: int,
    hi_ms: int,
    step_ms: int,
    agg: str,
    watermarks: Mapping[int, int],
) -> list[SeriesData]:
    merge = _MERGE[agg]
    merged: dict[int, dict[int, Partial]] = {}
    ids = [sid for sid, _ in series]
    for table, lo, hi in plan_sources(
        lo_ms=lo_ms, hi_ms=hi_ms, step_ms=step_ms, watermarks=watermarks
    ):
        for chunk in _chunks(ids):
            for sid, b, part in _partials(
                conn, table, chunk, lo_ms=lo, hi_ms=hi, step_ms=step_ms, agg=agg
            ):
                per = merged.setdefault(sid, {})
                per[b] = merge(per[b], part) if b in per else part
    final = _FINAL[agg]
    out = []
    for sid, key in series:
        if not (done := merged.get(sid)):
            continue
        bs = sorted(done)
        out.append(
            SeriesData(
                key.target,
                key.name,
                key.labels,
                tuple(b / 1000 for b in bs),
                tuple(final(done[b]) for b in bs),
            )
        )
    return out
