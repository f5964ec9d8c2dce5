"""Read statements: series lookup, raw ranges, reset-aware increase, bucketed aggregation.

Label matching happens in Python after the candidate series are selected by name and target:
labels are stored as canonical JSON text, JSON functions differ between SQLite and PostgreSQL,
and a fleet has thousands of series, not millions.  Label values are never put into SQL text.

Raw samples are stored as per-series chunks (``store.chunks``): a query reads every chunk of
its series overlapping the window in one statement per batch of series, merges them (last
write wins) and computes ranges, increases and buckets in numpy.  Rollup tables are still
aggregated in SQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    BigInteger,
    Connection,
    Select,
    Table,
    bindparam,
    cast,
    func,
    literal,
    select,
    tuple_,
)

from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Labels, label_value, labels_json, make_labels
from tritonwatch.store import rollup_chunks, samplelog
from tritonwatch.store.chunks import (
    Merged,
    TsRef,
    decode,
    last_writes,
    merge,
    run_bounds,
    shared_refs,
    span_start,
    unpack_timestamps,
)
from tritonwatch.store.engine import fetch_tuples
from tritonwatch.store.errors import LimitExceeded
from tritonwatch.store.id_lists import IDS, ids_param, ids_value, in_ids, prepared
from tritonwatch.store.values import SeriesColumns, SeriesKey

Agg = Literal["avg", "min", "max", "sum", "count", "last"]
AGGS: frozenset[str] = frozenset({"avg", "min", "max", "sum", "count", "last"})

# Bound parameters per IN list: far below SQLite's 32766 and psycopg's 65535 limits.
_ID_CHUNK = 500

ROLLUP_5M_MS = rollup_chunks.ROLLUP_5M_MS
ROLLUP_1H_MS = rollup_chunks.ROLLUP_1H_MS

Candidates = Sequence[tuple[int, SeriesKey]]


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), _ID_CHUNK):
        yield list(ids[i : i + _ID_CHUNK])


@lru_cache(maxsize=65_536)
def parse_labels(text: str) -> Labels:
    """A stored label set (canonical JSON) as a label tuple.

    Cached: alert rules look up the same few names across the fleet every evaluation, and
    decoding every series' JSON each time cost about 10 ms per lookup at 300 targets.  Stored
    label text never changes meaning, so the cache cannot go stale; its bound keeps it to a
    few MB.
    """
    return make_labels(json.loads(text))


#: A filter over stored series (target, name, labels), applied in Python (api/promql.py).
SeriesFilter = Callable[[str, str, Labels], bool]

#: Series rows read per statement when a filter decides in Python which ones count.
SCAN_BATCH = 5_000


def find_series(
    conn: Connection,
    *,
    name: str | None,
    target: str | None,
    match: Mapping[str, str] | None,
    max_series: int | None = None,
    names: Collection[str] | None = None,
    where: SeriesFilter | None = None,
) -> list[tuple[int, SeriesKey]]:
    """``(id, key)`` of the series with this name/target whose labels equal ``match``.

    As in PromQL, ``{label: ""}`` matches series that do not have the label.  Sorted by key.
    More than ``max_series`` raises :class:`LimitExceeded` having read at most one more row
    than that (a ``LIMIT`` in SQL when there is no ``match``): a name held by a million series
    must not cost a million keys in memory to be refused.
    """
    query = select(t.series.c.id, t.series.c.target, t.series.c.name, t.series.c.labels)
    if name is not None:
        query = query.where(t.series.c.name == name)
    if names is not None:
        query = query.where(t.series.c.name.in_(sorted(names)))
    if target is not None:
        query = query.where(t.series.c.target == target)
    if max_series is not None and not match and where is None:
        query = query.limit(max_series + 1)
    found = []
    # The driver gives each row its own target and name strings; the keys are kept (the
    # reader's series cache) and a fleet's keys repeat a few hundred names and targets, so
    # they share one string each.
    texts: dict[str, str] = {}
    text = texts.setdefault
    # The driver's rows, a batch at a time: a name across a fleet is tens of thousands of
    # series, and the alert rules look several up every evaluation.  SQLAlchemy's Row per row
    # was a third of such a lookup's CPU (``bench.alerts_eval --profile``, 300 targets).
    result = conn.execute(query)
    try:
        cursor = result.cursor
        while rows := cursor.fetchmany(SCAN_BATCH):
            for sid, target_text, name_text, labels_text in rows:
                labels = parse_labels(labels_text)
                if match and any(label_value(labels, k, "") != v for k, v in match.items()):
                    continue
                if where is not None and not where(target_text, name_text, labels):
                    continue
                found.append((sid, SeriesKey(text(target_text, target_text),
                                             text(name_text, name_text), labels)))
                if max_series is not None and len(found) > max_series:
                    raise LimitExceeded(f"the query selects more than {max_series:,} series",
                                        what="series", limit=max_series)
    finally:
        result.close()
    found.sort(key=lambda item: item[1])
    return found


def select_page(
    conn: Connection,
    *,
    names: Collection[str] | None,
    target: str | None,
    where: SeriesFilter | None,
    after: SeriesKey | None,
    limit: int | None,
    window: tuple[int, int] | None = None,
    max_samples: int | None = None,
) -> list[SeriesKey]:
    """Up to ``limit`` (None: all) series after ``after`` that pass ``where`` and, with
    ``window`` ``(lo_ms, hi_ms)``, hold a sample in it; ordered by target, name and stored
    label text (keyset paging on the unique index, so a later page costs no more than the
    first).

    The catalogue is read :data:`SCAN_BATCH` rows at a time (keyset paging), so a selective
    filter never holds the whole catalogue in memory.  A window reads the samples of each
    batch's matching series, at most ``max_samples`` of them (``LimitExceeded`` first).
    """
    c = t.series.c
    out: list[SeriesKey] = []
    cursor = after
    while limit is None or len(out) < limit:
        query = select(c.id, c.target, c.name, c.labels)
        if names is not None:
            query = query.where(c.name.in_(sorted(names)))
        if target is not None:
            query = query.where(c.target == target)
        if cursor is not None:
            query = query.where(tuple_(c.target, c.name, c.labels)
                                > tuple_(literal(cursor.target), literal(cursor.name),
                                         literal(labels_json(cursor.labels))))
        # Without a Python-side filter every row counts: read only what is still wanted.
        batch_size = SCAN_BATCH if (where is not None or window is not None or limit is None) \
            else min(SCAN_BATCH, limit - len(out))
        rows = list(conn.execute(query.order_by(c.target, c.name, c.labels).limit(batch_size)))
        if not rows:
            break
        batch = [(r.id, SeriesKey(r.target, r.name, parse_labels(r.labels))) for r in rows]
        cursor = batch[-1][1]
        hits = [(i, k) for i, k in batch if where is None or where(k.target, k.name, k.labels)]
        if window is not None and hits:
            hits = _with_samples(conn, hits, window, max_samples)
        out.extend(k for _, k in hits)
        if len(rows) < batch_size:
            break
    return out if limit is None else out[:limit]


def _with_samples(
    conn: Connection, series: list[tuple[int, SeriesKey]], window: tuple[int, int],
    max_samples: int | None,
) -> list[tuple[int, SeriesKey]]:
    lo, hi = window
    keep: set[int] = set()
    for chunk in _chunks([sid for sid, _ in series]):
        if max_samples is not None and count_rows(
                conn, t.sample_chunks, chunk, lo_ms=lo, hi_ms=hi) > max_samples:
            raise LimitExceeded(f"the query would read more than {max_samples:,} samples",
                                what="samples", limit=max_samples)
        keep.update(np.unique(raw_samples(conn, chunk, lo_ms=lo, hi_ms=hi).ids).tolist())
    return [(sid, key) for sid, key in series if sid in keep]


def check_samples(conn: Connection, series: Candidates, *, lo_ms: int, hi_ms: int,
                  max_samples: int) -> None:
    """``LimitExceeded`` when reading raw ``series`` over the window would decode more than
    ``max_samples`` samples (counted, not read)."""
    total = 0
    for chunk in _chunks([sid for sid, _ in series]):
        total += count_rows(conn, t.sample_chunks, chunk, lo_ms=lo_ms, hi_ms=hi_ms)
        if total > max_samples:
            raise LimitExceeded(f"the query would read more than {max_samples:,} samples",
                                what="samples", limit=max_samples)


def raw_samples(conn: Connection, ids: Sequence[int], *, lo_ms: int, hi_ms: int) -> Merged:
    """Samples of the series ``ids`` in ``[lo_ms, hi_ms]``, merged from their chunks.

    The log's chunks are read first, then the stored chunks in one statement (one snapshot even
    while compaction replaces them): a transposition committed in between moves log rows into
    chunks already read as log, which the merge then holds twice and keeps once, rather than
    out of a log not yet read.  Bounded below by the span of ``lo_ms``: no chunk crosses a
    span (``store.chunks``).
    """
    logged = samplelog.read(conn, ids, lo_ms=lo_ms, hi_ms=hi_ms)
    rows = fetch_tuples(conn, prepared(_chunk_rows, conn.dialect.name), {
        IDS: ids_value(conn, ids), "span_ms": span_start(lo_ms), "lo_ms": lo_ms,
        "hi_ms": hi_ms})
    if not len(logged[0]):
        return merge_rows(rows, lo_ms=lo_ms, hi_ms=hi_ms, conn=conn)
    stored = _empty_columns()
    if rows:
        sids, starts, seqs, ns, blobs = zip(*rows, strict=True)
        stored = decode(np.array(sids, np.int64), np.array(seqs, np.int64),
                        np.array(ns, np.int64), list(blobs),
                        starts=np.array(starts, np.int64),
                        shared=shared_timestamps(conn, starts, blobs))
    both = [np.concatenate([a, b]) for a, b in zip(stored, logged, strict=True)]
    return last_writes(both[0], both[1], both[2], both[3], lo_ms=lo_ms, hi_ms=hi_ms)


def _chunk_rows(dialect: str) -> Select[Any]:
    """The stored chunks of the series bound as ``ids`` that overlap ``[lo_ms, hi_ms]``, from
    ``span_ms`` (the span of ``lo_ms``) on: built once per backend (``id_lists.prepared``)."""
    c = t.sample_chunks.c
    return select(c.series_id, c.start_ms, c.seq, c.n, c.data).where(
        ids_param(dialect, c.series_id),
        c.start_ms >= bindparam("span_ms"),
        c.start_ms <= bindparam("hi_ms"),
        c.end_ms >= bindparam("lo_ms"),
    )


def _empty_columns() -> samplelog.Columns:
    empty = np.empty(0, np.int64)
    return empty, empty, np.empty(0, np.float64), empty


#: Shared timestamp columns read per statement (two bound parameters each).
_TS_BATCH = 400


def shared_timestamps(conn: Connection | None, starts: Sequence[int],
                      blobs: Sequence[bytes]) -> dict[TsRef, npt.NDArray[np.int64]]:
    """The shared timestamp columns (``chunk_timestamps``) that the chunks starting at
    ``starts`` with data ``blobs`` refer to, decoded, each read once however many series
    share it.  Raises ValueError when one is missing (or ``conn`` is None and one is needed)."""
    refs = sorted(shared_refs(list(starts), list(blobs)))
    out: dict[TsRef, npt.NDArray[np.int64]] = {}
    if not refs:
        return out
    if conn is None:
        raise ValueError("sample chunks refer to shared timestamp columns: a connection is "
                         "needed to read them")
    c = t.chunk_timestamps.c
    for i in range(0, len(refs), _TS_BATCH):
        part = refs[i : i + _TS_BATCH]
        found = conn.execute(select(c.start_ms, c.key, c.n, c.data).where(
            c.start_ms >= part[0][0], c.start_ms <= part[-1][0],
            tuple_(c.start_ms, c.key).in_(part))).all()
        for start, key, n, data in found:
            out[(int(start), int(key))] = unpack_timestamps(bytes(data), int(n))
    return out


def merge_rows(rows: Sequence[Any], *, lo_ms: int, hi_ms: int,
               conn: Connection | None = None) -> Merged:
    """:func:`store.chunks.merge` over rows of ``(series_id, start_ms, seq, n, data)``; the
    shared timestamp columns chunks refer to are read through ``conn``."""
    if not rows:
        return Merged(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    sids, starts, seqs, ns, blobs = zip(*rows, strict=True)
    shared = shared_timestamps(conn, starts, blobs)
    return merge(
        np.array(sids, np.int64),
        np.array(seqs, np.int64),
        np.array(starts, np.int64),
        np.array(ns, np.int64),
        list(blobs),
        lo_ms=lo_ms,
        hi_ms=hi_ms,
        shared=shared,
    )


def count_samples(conn: Connection) -> int:
    """Samples stored.  A sample stored twice (overlapping chunks not compacted yet: a
    re-sent scrape, a retried flush) counts twice."""
    total = conn.execute(select(func.sum(t.sample_chunks.c.n))).scalar_one_or_none()
    return int(total or 0) + samplelog.count(conn)


def raw_columns(conn: Connection, series: Candidates, *, lo_ms: int, hi_ms: int) -> SeriesColumns:
    """Raw samples with ``lo_ms <= ts <= hi_ms`` as columns (:class:`store.values.SeriesColumns`),
    in ``series``' order; series without any are left out."""
    keys: list[SeriesKey] = []
    counts: list[npt.NDArray[np.int64]] = []
    ts: list[npt.NDArray[np.float64]] = []
    values: list[npt.NDArray[np.float64]] = []
    for chunk in _chunks(range(len(series))):
        wanted = np.array([series[i][0] for i in chunk], np.int64)
        m = raw_samples(conn, wanted.tolist(), lo_ms=lo_ms, hi_ms=hi_ms)
        starts, ends = m.groups()
        # The merge sorts by id; the caller wants its own (key) order.
        found = m.ids[starts]
        at = np.minimum(np.searchsorted(found, wanted), max(len(found) - 1, 0))
        has = (found[at] == wanted) if len(found) else np.zeros(len(wanted), bool)
        at = at[has]
        n = ends[at] - starts[at]
        # Each wanted series' positions in the merge, one after the other.
        take = np.repeat(starts[at] - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
        keys.extend(series[i][1] for i, h in zip(chunk, has.tolist(), strict=True) if h)
        counts.append(n)
        ts.append(m.ts[take] / 1000)
        values.append(m.values[take])
    bounds = np.zeros(len(keys) + 1, np.int64)
    if keys:
        np.cumsum(np.concatenate(counts), out=bounds[1:])
    return SeriesColumns(keys, bounds, _cat(ts), _cat(values))


def _cat(parts: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64]:
    return np.concatenate(parts) if parts else np.empty(0, np.float64)


def increase(
    conn: Connection, series: Candidates, *, lo_ms: int, hi_ms: int
) -> list[tuple[SeriesKey, float, int, int]]:
    """Reset-aware increase of each counter over its samples in ``[lo_ms, hi_ms]``.

    Returns ``(key, increase, first_ts_ms, last_ts_ms)`` for series with at least two samples.
    A value below its predecessor is a counter reset: the counter restarted from zero, so the
    new value itself is the increase since the reset (Prometheus does the same), never a
    negative delta.
    """
    keys = dict(series)
    out = []
    for chunk in _chunks(list(keys)):
        m = raw_samples(conn, chunk, lo_ms=lo_ms, hi_ms=hi_ms)
        if len(m) < 2:
            continue
        for sid, inc, first, last in counter_increases(m):
            out.append((keys[sid], inc, first, last))
    out.sort(key=lambda item: item[0])
    return out


# --- buckets ---------------------------------------------------------------------------------
#
# Each source (raw samples or a rollup table) yields a *partial* per (series, bucket) that can be
# merged with the partial of another source for the same bucket: a step bucket may straddle the
# rollup watermark, half rolled up and half still raw.

class _Parts(NamedTuple):
    """Partials of one source, a row per ``(series, bucket)``: ``a`` and ``b`` are, by
    aggregation, ``avg``: sum and count; ``last``: the last point's ts (ms) and its value;
    the others: the value (``b`` unused)."""

    ids: npt.NDArray[np.int64]
    buckets: npt.NDArray[np.int64]
    a: npt.NDArray[np.float64]
    b: npt.NDArray[np.float64]


def _total(count: Any) -> Any:
    # PostgreSQL's SUM(bigint) is NUMERIC, which psycopg returns as Decimal.
    return cast(func.sum(count), BigInteger)


class Aggregates(NamedTuple):
    """Per ``(series, bucket)`` of raw samples: the columns of a rollup row, and more."""

    ids: npt.NDArray[np.int64]
    buckets: npt.NDArray[np.int64]  # bucket start (ms)
    min: npt.NDArray[np.float64]
    max: npt.NDArray[np.float64]
    sum: npt.NDArray[np.float64]
    n: npt.NDArray[np.int64]  # samples (``count`` is taken by tuple)
    last_ts: npt.NDArray[np.int64]
    last: npt.NDArray[np.float64]


def aggregate(m: Merged, step_ms: int) -> Aggregates:
    """Aggregate merged raw samples into epoch-aligned ``step_ms`` buckets."""
    b = m.ts // step_ms * step_ms
    starts, ends = run_bounds(m.ids, b)
    v = m.values
    if not len(starts):
        f, i = np.empty(0, np.float64), np.empty(0, np.int64)
        return Aggregates(i, i, f, f, f, i, i, f)
    # +inf and -inf in one bucket sum to NaN, as in SQL; numpy would also warn about it.
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.add.reduceat(v, starts)
    return Aggregates(
        ids=m.ids[starts],
        buckets=b[starts],
        min=rollup_chunks.nan_min(v, starts),
        max=rollup_chunks.nan_max(v, starts),
        sum=total,
        n=ends - starts,
        last_ts=m.ts[ends - 1],
        last=v[ends - 1],
    )


def _raw_parts(
    conn: Connection, ids: list[int], *, lo_ms: int, hi_ms: int, step_ms: int, agg: str
) -> _Parts:
    a = aggregate(raw_samples(conn, ids, lo_ms=lo_ms, hi_ms=hi_ms), step_ms)
    if agg == "avg":
        return _Parts(a.ids, a.buckets, a.sum, a.n.astype(np.float64))
    if agg == "last":
        return _Parts(a.ids, a.buckets, a.last_ts.astype(np.float64), a.last)
    x = a.n.astype(np.float64) if agg == "count" else getattr(a, agg)
    return _Parts(a.ids, a.buckets, x, x)


def _parts(
    conn: Connection,
    table: Table,
    ids: list[int],
    *,
    lo_ms: int,
    hi_ms: int,
    step_ms: int,
    agg: str,
) -> _Parts:
    if table is t.sample_chunks:
        return _raw_parts(conn, ids, lo_ms=lo_ms, hi_ms=hi_ms, step_ms=step_ms, agg=agg)
    res = ROLLUP_1H_MS if table is t.rollup_chunks_1h else ROLLUP_5M_MS
    rows = read_rollups(conn, table, ids, lo_ms=lo_ms, hi_ms=hi_ms, res=res,
                        columns=_ROLLUP_COLUMNS_FOR[agg])
    b = rows.ts // step_ms * step_ms
    starts, ends = run_bounds(rows.ids, b)
    sids, buckets = rows.ids[starts], b[starts]
    if not len(starts):
        return _Parts(sids, buckets, np.empty(0), np.empty(0))
    with np.errstate(invalid="ignore", over="ignore"):
        if agg == "avg":
            return _Parts(sids, buckets, np.add.reduceat(rows.sum, starts),
                          np.add.reduceat(rows.n, starts).astype(np.float64))
        if agg == "sum":
            x = np.add.reduceat(rows.sum, starts)
        elif agg == "count":
            x = np.add.reduceat(rows.n, starts).astype(np.float64)
        elif agg == "min":
            x = rollup_chunks.nan_min(rows.min, starts)
        elif agg == "max":
            x = rollup_chunks.nan_max(rows.max, starts)
        else:  # last: the newest row's timestamp and value
            return _Parts(sids, buckets, rows.ts[ends - 1].astype(np.float64),
                          rows.last[ends - 1])
    return _Parts(sids, buckets, x, x)


#: The rollup columns each aggregation reads (``ts`` always).
_ROLLUP_COLUMNS_FOR = {
    "avg": ("sum", "count"), "sum": ("sum",), "count": ("count",), "min": ("min",),
    "max": ("max",), "last": ("last",),
}


def read_rollups(
    conn: Connection, table: Table, ids: Sequence[int], *, lo_ms: int, hi_ms: int, res: int,
    columns: tuple[str, ...] = rollup_chunks.COLUMNS,
) -> rollup_chunks.Rows:
    """Rollup rows of the series ``ids`` with ``ts`` in ``[lo_ms, hi_ms]`` from a rollup chunk
    table of resolution ``res``: one range scan per batch of ids, the last write of each
    bucket kept (``store.rollup_chunks``)."""
    c = table.c
    rows = conn.execute(select(c.series_id, c.start_ms, c.seq, c.n, c.end_ms, c.data).where(
        in_ids(conn, c.series_id, ids),
        c.start_ms >= rollup_chunks.window_start(lo_ms, res),
        c.start_ms <= hi_ms,
        c.end_ms >= lo_ms,
    )).all()
    if not rows:
        return rollup_chunks.empty()
    sids, starts, seqs, ns, ends, blobs = zip(*rows, strict=True)
    return rollup_chunks.decode(
        np.array(sids, np.int64), np.array(seqs, np.int64), np.array(starts, np.int64),
        np.array(ns, np.int64), list(blobs), lo_ms=lo_ms, hi_ms=hi_ms, columns=columns,
        ends=np.array(ends, np.int64), res=res,
    )


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


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
    for res, table in ((ROLLUP_1H_MS, t.rollup_chunks_1h), (ROLLUP_5M_MS, t.rollup_chunks_5m)):
        wm = watermarks.get(res)
        if step_ms % res or wm is None or cursor > hi_ms:
            continue
        start = cursor // res * res
        end = min(wm, hi_ms // res * res + res)  # exclusive
        if end > start:
            plan.append((table, start, end - 1))
            cursor = max(cursor, end)
    if cursor <= hi_ms:
        plan.append((t.sample_chunks, cursor, hi_ms))
    return plan


def check_bucket_rows(conn: Connection, ids: Sequence[int], plan: list[tuple[Table, int, int]],
                      *, max_samples: int) -> None:
    """LimitExceeded if the rows that ``plan``'s sources hold of the series ``ids`` add up to
    more than ``max_samples`` (:func:`count_rows`: counted, not read)."""
    total = 0
    for table, lo, hi in plan:
        for chunk in _chunks(ids):
            total += count_rows(conn, table, chunk, lo_ms=lo, hi_ms=hi)
            if total > max_samples:
                raise LimitExceeded(
                    f"the query would read more than {max_samples:,} samples",
                    what="samples", limit=max_samples)


def bucket_columns(
    conn: Connection,
    series: Candidates,
    *,
    lo_ms: int,
    hi_ms: int,
    step_ms: int,
    agg: str,
    watermarks: Mapping[int, int],
) -> SeriesColumns:
    """Buckets of each series in ``series``' order, stamped with their start, as columns.

    Each source of :func:`plan_sources` gives partials per ``(series, bucket)``; a bucket
    straddling a rollup watermark has one from each, merged here column-wise (sorted by
    series and bucket, each run of equal keys reduced) rather than a Python tuple per
    bucket: a 1,000-target fleet's alert rules read tens of thousands of series at a time.
    A caller with a bound on the samples read counts them first (:func:`check_bucket_rows`).
    """
    ids = [sid for sid, _ in series]
    plan = plan_sources(lo_ms=lo_ms, hi_ms=hi_ms, step_ms=step_ms, watermarks=watermarks)
    # A batch of series at a time, from every source, merged: the batches hold disjoint
    # series (``series`` lists each id once: find_series selects them by key), so only a
    # batch's partials are ever held unmerged.  All of them held at once were the peak of a
    # regression history's cold read (4 h of 1-minute buckets of every instance:
    # bench.alerts_eval at 300 targets peaked at 379 MiB, 268 in batches).
    ranks: list[npt.NDArray[np.int64]] = []
    buckets: list[npt.NDArray[np.int64]] = []
    merged: list[npt.NDArray[np.float64]] = []
    for offset in range(0, len(ids), _ID_CHUNK):
        chunk = ids[offset : offset + _ID_CHUNK]
        parts = [_parts(conn, table, chunk, lo_ms=lo, hi_ms=hi, step_ms=step_ms, agg=agg)
                 for table, lo, hi in plan]
        if not sum(len(p.ids) for p in parts):
            continue
        sid, b, x, y = (np.concatenate(col) for col in zip(*parts, strict=True))
        # Each row's series as its place in ``series``, so that the sort below is in its
        # order (and the batches, taken in that order, follow one another).
        known = np.array(chunk, np.int64)
        by_id = np.argsort(known)
        rank = by_id[np.searchsorted(known, sid, sorter=by_id)] + offset
        order = np.lexsort((b, rank))  # stable: a source's partial stays before a later one's
        rank, b, x, y = rank[order], b[order], x[order], y[order]
        starts, ends = run_bounds(rank, b)
        merged.append(_merge(agg, x, y, starts, ends))
        ranks.append(rank[starts])
        buckets.append(b[starts])
    if not ranks:
        return SeriesColumns([], np.zeros(1, np.int64), np.empty(0), np.empty(0))
    rank, b, values = np.concatenate(ranks), np.concatenate(buckets), np.concatenate(merged)
    firsts, _ = run_bounds(rank)
    bounds = np.append(firsts, len(rank)).astype(np.int64)
    keys = [series[r][1] for r in rank[firsts].tolist()]
    return SeriesColumns(keys, bounds, b / 1000, values)


def count_rows(conn: Connection, table: Table, ids: list[int], *, lo_ms: int, hi_ms: int) -> int:
    """Samples (raw chunks and log rows) or rows (rollups) of ``ids`` that a read of
    ``[lo_ms, hi_ms]`` from ``table`` decodes: whole chunks and log rows overlapping the
    window, so an upper bound of the samples in it."""
    if table is t.sample_chunks:
        c = table.c
        stmt = select(_total(c.n)).where(
            in_ids(conn, c.series_id, ids),
            c.start_ms >= span_start(lo_ms),
            c.start_ms <= hi_ms,
            c.end_ms >= lo_ms,
        )
        logged = samplelog.count_read(conn, ids, lo_ms=lo_ms, hi_ms=hi_ms)
        return logged + int(conn.execute(stmt).scalar_one_or_none() or 0)
    # Rollup chunks: every bucket of the chunks the read decodes.
    res = ROLLUP_1H_MS if table is t.rollup_chunks_1h else ROLLUP_5M_MS
    c = table.c
    stmt = select(_total(c.n)).where(
        in_ids(conn, c.series_id, ids),
        c.start_ms >= rollup_chunks.window_start(lo_ms, res),
        c.start_ms <= hi_ms,
        c.end_ms >= lo_ms,
    )
    return int(conn.execute(stmt).scalar_one_or_none() or 0)


def _merge(
    agg: str,
    a: npt.NDArray[np.float64],
    b: npt.NDArray[np.float64],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """The final value of each run ``[starts[i], ends[i])`` of partials (:class:`_Parts`)."""
    # +inf and -inf in one bucket sum to NaN, as in SQL; numpy would also warn about it.
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if agg == "avg":
            out: npt.NDArray[np.float64] = (
                np.add.reduceat(a, starts) / np.add.reduceat(b, starts))
            return out
        if agg in ("sum", "count"):
            return np.add.reduceat(a, starts)
    if agg == "min":
        return rollup_chunks.nan_min(a, starts)
    if agg == "max":
        return rollup_chunks.nan_max(a, starts)
    # last: the value of the newest partial; of equal timestamps, the earlier source's.
    newest = np.repeat(np.maximum.reduceat(a, starts), ends - starts)
    at = np.flatnonzero(a == newest)
    return b[at[np.searchsorted(at, starts)]]


def counter_increases(m: Merged) -> list[tuple[int, float, int, int]]:
    """``(series id, increase, first ms, last ms)`` of each series of ``m`` with at least two
    samples: the sum of its deltas, a drop counting as a reset (the value after it is the
    increase)."""
    v = m.values
    # Each sample's contribution: 0 for a series' first, else its delta (or, below its
    # predecessor, its value).
    starts, ends = m.groups()
    step = np.zeros(len(v))
    # inf - inf is NaN, as in SQL; numpy would also warn about it.
    with np.errstate(invalid="ignore", over="ignore"):
        step[1:] = np.where(v[1:] >= v[:-1], v[1:] - v[:-1], v[1:])
        # A counter is never below zero; a target that reports one anyway (the collector
        # skips such samples at ingest) must not turn an increase or a rate negative.
        step = np.maximum(step, 0.0)
        step[starts] = 0.0
        sums = np.add.reduceat(step, starts)
    two = ends - starts >= 2
    return list(zip(m.ids[starts][two].tolist(), sums[two].tolist(),
                    m.ts[starts][two].tolist(), m.ts[ends - 1][two].tolist(), strict=True))
