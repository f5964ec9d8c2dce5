"""Raw samples stored as per-series chunks.

The encoding and merge rule on their own (no database), then, on both backends: a
differential test against a plain reference model (a dict with last-write-wins), the upgrade
of a version 1 database, retention cutting through a chunk, and compaction racing a late flush.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    delete,
    func,
    inspect,
    select,
)

from tests.store.test_contract import REFERENCE_AGGREGATIONS
from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import (
    Agg,
    Query,
    Store,
    StoreError,
    maintenance,
    migrate,
    open_store,
    samplelog,
    write,
)
from tritonwatch.store import chunks as ck
from tritonwatch.store.engine import transaction
from tritonwatch.store.maintenance import (
    _PG_LOCK_ROLLUP,
    COMPACT_REWIND,
    COMPACT_WATERMARK,
)
from tritonwatch.store.write import get_meta

# An hour boundary three days ago (series record wall-clock resolve times; see test_contract).
T = (int(time.time()) // 3600 - 72) * 3600
HOUR_MS = 3_600_000


# --- encoding and merge rule (no database) ---------------------------------------------------


def _columns(pairs: list[tuple[int, int]], values: list[float]) -> tuple[Any, Any, Any]:
    ids = np.array([p[0] for p in pairs], np.int64)
    ts = np.array([p[1] for p in pairs], np.int64)
    return ids, ts, np.array(values, np.float64)


def test_encode_writes_one_chunk_per_series_and_window_and_decodes_exactly() -> None:
    base = T * 1000
    pairs = [(1, base), (1, base + 15_000), (1, base + HOUR_MS), (2, base + 5), (3, base - 1)]
    pairs.sort()
    values = [0.0, -0.0, 5e-324, float("inf"), -1.5]
    enc = ck.encode(*_columns(pairs, values))
    # Series 1 straddles a full hour: two chunks; one each for 2 and 3.
    assert enc.ids.tolist() == [1, 1, 2, 3]
    assert enc.n.tolist() == [2, 1, 1, 1]
    assert enc.start_ms.tolist() == [base, base + HOUR_MS, base + 5, base - 1]
    assert enc.end_ms.tolist() == [base + 15_000, base + HOUR_MS, base + 5, base - 1]
    blobs = enc.blobs()
    assert [len(b) for b in blobs] == [32, 16, 16, 16]
    # The documented layout: timestamps, then values, little-endian.
    assert np.frombuffer(blobs[0][:16], "<i8").tolist() == [base, base + 15_000]
    assert np.frombuffer(blobs[0][16:], "<f8").tolist() == values[:2]
    m = ck.merge(enc.ids, np.zeros(len(enc), np.int64), enc.start_ms, enc.n, blobs)
    assert list(zip(m.ids.tolist(), m.ts.tolist(), strict=True)) == pairs
    # Bit for bit, -0.0 included.
    assert m.values.tobytes() == np.array(values, np.float64).tobytes()


def test_encode_cuts_chunks_at_max_samples() -> None:
    ts = T * 1000 + np.arange(10, dtype=np.int64)
    enc = ck.encode(np.ones(10, np.int64), ts, ts.astype(np.float64), max_samples=4)
    assert enc.n.tolist() == [4, 4, 2]
    assert enc.start_ms.tolist() == [ts[0], ts[4], ts[8]]
    m = ck.merge(enc.ids, np.zeros(3, np.int64), enc.start_ms, enc.n, enc.blobs())
    assert m.ts.tolist() == ts.tolist()


def test_merge_keeps_the_last_write_of_each_timestamp_and_filters_the_window() -> None:
    def chunk(points: list[tuple[int, float]]) -> bytes:
        ts = np.array([p[0] for p in points], "<i8")
        return ts.tobytes() + np.array([p[1] for p in points], "<f8").tobytes()

    # Given in storage order, not write order: seq decides.
    rows = [
        (7, 30, 3, [(30, 3.0), (40, 3.0)]),  # written last
        (7, 10, 1, [(10, 1.0), (20, 1.0), (30, 1.0), (40, 1.0)]),
        (7, 20, 2, [(20, 2.0), (30, 2.0), (50, 2.0)]),
        (5, 10, 9, [(10, 9.0)]),
    ]
    m = ck.merge(
        np.array([r[0] for r in rows], np.int64),
        np.array([r[2] for r in rows], np.int64),
        np.array([r[1] for r in rows], np.int64),
        np.array([len(r[3]) for r in rows], np.int64),
        [chunk(r[3]) for r in rows],
        lo_ms=10,
        hi_ms=45,
    )
    assert list(zip(m.ids.tolist(), m.ts.tolist(), m.values.tolist(), strict=True)) == [
        (5, 10, 9.0),
        (7, 10, 1.0),
        (7, 20, 2.0),
        (7, 30, 3.0),
        (7, 40, 3.0),
    ]


def test_merge_refuses_data_of_the_wrong_length() -> None:
    one = np.ones(1, np.int64)
    with pytest.raises(ValueError, match="expected 32"):
        ck.merge(one, one, one, 2 * one, [b"\0" * 24])


# --- differential test against a reference model --------------------------------------------

STEP_S = 5  # sample grid
SLOTS = 3 * 3600 // STEP_S  # three hours of data
SERIES = 3


class Model:
    """What the store must answer: last write wins per (series, ts); lists, no chunks."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, int], float] = {}
        #: Flushed and not yet moved: still in the sample log, which retention does not cut (a
        #: late flush below the raw horizon stays readable until a maintenance moved it and the
        #: next retention ran).  As the log's rows: one per flush and hour (one target, one
        #: name here), each its keys and its newest sample.
        self.rows: list[tuple[set[tuple[int, int]], int]] = []

    @property
    def logged(self) -> set[tuple[int, int]]:
        return set().union(*(keys for keys, _ in self.rows))

    def log(self, keys: list[tuple[int, int]]) -> None:
        for hour in {ts // HOUR_MS for _, ts in keys}:
            row = {k for k in keys if k[1] // HOUR_MS == hour}
            self.rows.append((row, max(ts for _, ts in row)))

    def move(self, cutoff_ms: int) -> None:
        """Maintenance, and retention with its raw cutoff, move the log's rows that end before
        ``cutoff_ms`` (``samplelog.transpose``)."""
        self.rows = [(keys, end) for keys, end in self.rows if end >= cutoff_ms]

    def retain(self, cutoff_ms: int) -> None:
        self.data = {k: v for k, v in self.data.items() if k[1] >= cutoff_ms or k in self.logged}

    def points(self, lo_ms: int, hi_ms: int) -> dict[int, list[tuple[int, float]]]:
        out: dict[int, list[tuple[int, float]]] = {}
        for (i, ts), v in sorted(self.data.items()):
            if lo_ms <= ts <= hi_ms:
                out.setdefault(i, []).append((ts, v))
        return out

    def range(self, lo_ms: int, hi_ms: int) -> dict[str, tuple[tuple[float, ...], ...]]:
        return {
            str(i): (tuple(ts / 1000 for ts, _ in p), tuple(v for _, v in p))
            for i, p in self.points(lo_ms, hi_ms).items()
        }

    def increase(self, lo_ms: int, hi_ms: int) -> dict[str, float]:
        out = {}
        for i, p in self.points(lo_ms, hi_ms).items():
            if len(p) < 2:
                continue
            values = [v for _, v in p]
            out[str(i)] = sum(
                (b - a if b >= a else b) for a, b in itertools.pairwise(values)
            )
        return out

    def buckets(self, lo_ms: int, hi_ms: int, step_ms: int, agg: str) -> dict[str, Any]:
        reduce = REFERENCE_AGGREGATIONS
        out = {}
        for i, p in self.points(lo_ms, hi_ms).items():
            groups: dict[int, list[float]] = {}
            for ts, v in p:
                groups.setdefault(ts // step_ms * step_ms, []).append(v)
            out[str(i)] = (
                tuple(b / 1000 for b in sorted(groups)),
                tuple(float(reduce[agg](groups[b])) for b in sorted(groups)),
            )
        return out


def _by_series(results: list[Any]) -> dict[str, Any]:
    out = {}
    for item in results:
        if isinstance(item, tuple) and len(item) == 2:  # (key, value) from increase
            key, value = item
            out[dict(key.labels)["i"]] = value
        else:
            out[dict(item.labels)["i"]] = (item.ts, item.values)
    return out


AGGS: list[Agg] = ["avg", "min", "max", "sum", "count", "last"]

writes = st.tuples(
    st.just("write"),
    st.integers(0, 1),  # writer
    st.integers(0, SLOTS - 1),  # slot
    st.lists(st.tuples(st.integers(0, SERIES - 1), st.integers(0, 40)), min_size=1, max_size=4),
)
# Bursts of consecutive scrapes, so that chunks hold many samples and overlap each other.
bursts = st.tuples(
    st.just("burst"),
    st.integers(0, 1),
    st.integers(0, SLOTS - 1),
    st.integers(2, 80),  # scrapes
    st.integers(0, 40),  # first value; a counter that may reset
)
ops = st.lists(
    st.one_of(
        writes,
        bursts,
        bursts,
        st.tuples(st.just("flush"), st.integers(0, 1)),
        st.tuples(st.just("maintain"), st.integers(0, 250)),  # rollup + compaction at T + m min
        st.tuples(st.just("retain"), st.integers(0, 3 * 3600)),  # raw cutoff at T + c s
        st.tuples(st.just("check"), st.integers(0, 3 * 3600), st.integers(0, 3 * 3600)),
    ),
    max_size=25,
)


def _reset(url: str) -> None:
    s = open_store(url)
    try:
        s.migrations.apply()
        with transaction(raw_engine(s), write=True) as conn:
            for table in reversed(t.metadata.sorted_tables):
                conn.execute(delete(table))
    finally:
        s.close()


def _check(store: Store, model: Model, lo_s: int, hi_s: int, *, rollups: bool) -> None:
    lo_ms, hi_ms = lo_s * 1000, hi_s * 1000
    assert _by_series(store.read(Query("x", start=lo_s,
                                       end=hi_s)).series()) == model.range(lo_ms, hi_ms)
    assert _by_series(store.increase(Query("x", start=lo_s,
                                           end=hi_s))) == model.increase(lo_ms, hi_ms)
    steps = [60, 420] + ([300, 900, 3600] if rollups else [])  # only 300 s multiples use rollups
    for step in steps:
        for agg in AGGS:
            got = store.read(Query("x", start=lo_s, end=hi_s, step=step, agg=agg)).series()
            if step % 300 == 0:
                # Rollup rows are whole intervals: compare on whole intervals only.
                assert lo_s % step == 0 and (hi_s + 1) % step == 0
            assert _by_series(got) == model.buckets(lo_ms, hi_ms, step * 1000, agg), (step, agg)


def _max_chunks_per_window(store: Store) -> int:
    c = t.sample_chunks.c
    per = (
        select(func.count().label("k"))
        .select_from(t.sample_chunks)
        .group_by(c.series_id, c.start_ms // HOUR_MS)
        .subquery()
    )
    with transaction(raw_engine(store), write=False) as conn:
        return int(conn.execute(select(func.max(per.c.k))).scalar() or 0)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=ops, final_cut=st.integers(0, 3 * 3600))
# Found by Hypothesis: a flush below the raw horizon (after a retention) stays in the sample log,
# which that retention did not cut, until the next maintenance moves it (Model.logged).
@example(ops=[("write", 0, 317, [(0, 0), (0, 0), (0, 25), (0, 30)]), ("flush", 0),
              ("maintain", 94), ("burst", 0, 82, 38, 12), ("check", 300, 448), ("retain", 1191),
              ("write", 0, 1734, [(1, 14), (0, 40), (1, 22)]), ("burst", 1, 1328, 50, 31),
              ("maintain", 6), ("flush", 0), ("burst", 1, 97, 34, 4), ("maintain", 116),
              ("check", 200, 8961), ("burst", 0, 0, 31, 4), ("flush", 0),
              ("write", 0, 524, [(1, 21), (1, 31), (2, 28), (1, 34)]), ("retain", 1096),
              ("retain", 10799)], final_cut=8111)
def test_chunk_store_answers_like_a_reference_model(store_url: str, ops, final_cut) -> None:
    _reset(store_url)
    writers = [open_store(store_url), open_store(store_url)]
    for w in writers:
        w.migrations.apply()
    try:
        model = Model()
        buffers: list[list[tuple[int, int, float]]] = [[], []]
        retained = False

        def write(w: int, slot: int, points: list[tuple[int, float]]) -> None:
            ts_ms = (T + slot * STEP_S) * 1000
            writers[w].write(
                "t", ts_ms / 1000, [Sample("x", make_labels({"i": str(i)}), v) for i, v in points]
            )
            buffers[w].extend((i, ts_ms, float(v)) for i, v in points)

        def flush(w: int) -> None:
            writers[w].flush()
            for i, ts_ms, v in buffers[w]:
                model.data[(i, ts_ms)] = v
            model.log([(i, ts_ms) for i, ts_ms, _ in buffers[w]])
            buffers[w].clear()

        for op in ops:
            if op[0] == "write":
                write(op[1], op[2], op[3])
            elif op[0] == "burst":
                _, w, slot, n, v0 = op
                for k in range(min(n, SLOTS - slot)):
                    # Every series counts up by its index and resets every 17 scrapes.
                    write(w, slot + k, [(i, float((v0 + k * i) % 17 + i)) for i in range(SERIES)])
            elif op[0] == "flush":
                flush(op[1])
            elif op[0] == "maintain":
                writers[0].maintenance.rollup(T + op[1] * 60)
                model.move(samplelog.move_before((T + op[1] * 60) * 1000))
            elif op[0] == "retain":
                with transaction(raw_engine(writers[0]), write=False) as conn:
                    wm = maintenance.watermarks(conn).get(300_000, 0)
                cutoff = min((T + op[1]) * 1000, wm)
                writers[0].maintenance.apply_retention(
                    T + op[1] + 86400, raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8
                )
                model.move(samplelog.hours_through((T + op[1]) * 1000))
                model.retain(cutoff)
                retained = True
            else:
                lo = T + op[1]
                _check(writers[1], model, lo, lo + op[2], rollups=False)

        flush(0)
        flush(1)
        end = T + 3 * 3600 - 1
        _check(writers[0], model, T, end, rollups=False)
        writers[1].maintenance.rollup(T + 4 * 3600)  # everything rolled up, every window compacted
        assert _max_chunks_per_window(writers[0]) <= 1
        assert writers[0].count_samples() == len(model.data)
        _check(writers[0], model, T, end, rollups=not retained)

        # Raw retention cutting through chunks: the rollups keep what they summarised.
        writers[0].maintenance.apply_retention(
            T + final_cut + 86400, raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8
        )
        before = model.range(T * 1000, end * 1000)
        model.data = {k: v for k, v in model.data.items() if k[1] >= (T + final_cut) * 1000}
        assert _by_series(writers[1].read(Query("x", start=T, end=end)).series()) == model.range(
            T * 1000, end * 1000
        )
        assert writers[1].count_samples() == len(model.data)
        if not retained:
            counts = writers[1].read(Query("x", start=T, end=end, step=3600, agg="count")).series()
            assert {k: sum(v[1]) for k, v in _by_series(counts).items()} == {
                i: float(len(p[0])) for i, p in before.items()
            }
    finally:
        for w in writers:
            w.close()


# --- upgrade from schema version 1 -----------------------------------------------------------

# Version 1's table as it was: gone from schemas.tables, so written out here; alike in shape to
# today's tables on purpose.
_v1 = MetaData()
_v1_samples = Table(
    "samples",
    _v1,
    Column("series_id", BigInteger, nullable=False),
    Column("ts", BigInteger, nullable=False),
    Column("value", Double, nullable=False),
    PrimaryKeyConstraint("series_id", "ts"),
    sqlite_with_rowid=False,
)


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


def test_a_version_1_database_is_upgraded_in_place(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Build what tritonwatch of schema version 1 left: a `samples` row per sample.
    old = open_store(store_url)
    old.migrations.apply()
    old.write("t", T, [Sample("x", make_labels({"i": str(i)}), 0.0) for i in range(3)])
    old.flush()
    engine = raw_engine(old)
    with transaction(engine, write=True) as conn:
        ids = {r.labels: r.id for r in conn.execute(select(t.series.c.id, t.series.c.labels))}
        conn.execute(delete(t.sample_chunks))
        conn.execute(delete(t.sample_log))
        conn.execute(delete(t.meta))
        write.set_meta(conn, "schema_version", "1")
        _v1.create_all(conn)
        rows = [
            {"series_id": sid, "ts": (T + k * 15) * 1000 + (HOUR_MS if k >= 200 else 0),
             "value": float(k * n)}
            for n, sid in enumerate(sorted(ids.values()))
            for k in range(250)
        ]
        conn.execute(_v1_samples.insert(), rows)
    t.sample_chunks.drop(engine)
    t.sample_log.drop(engine)  # version 1 had none of these
    t.sample_log_flushes.drop(engine)
    old.close()

    monkeypatch.setattr(migrate, "BATCH_ROWS", 101)  # several transactions, cut mid-series
    monkeypatch.setattr(migrate, "MAX_SAMPLES", 64)
    s = open_store(store_url)
    try:
        s.migrations.apply()
        with transaction(raw_engine(s), write=False) as conn:
            assert not inspect(conn).has_table("samples")
            assert get_meta(conn, "schema_version") == str(t.SCHEMA_VERSION)
        assert s.count_samples() == len(rows)
        got = {dict(d.labels)["i"]: d for d in s.read(Query("x", start=T,
                                                            end=T + 3 * 3600)).series()}
        for n, sid in enumerate(sorted(ids.values())):
            mine = sorted((r["ts"], r["value"]) for r in rows if r["series_id"] == sid)
            data = got[str(n)]
            assert data.ts == tuple(ts / 1000 for ts, _ in mine)
            assert data.values == tuple(v for _, v in mine)
        # Migrated samples are older than anything written since: a new write replaces one.
        s.write("t", T + 15, [Sample("x", make_labels({"i": "1"}), -5.0)])
        s.flush()
        (one,) = s.read(Query("x", start=T + 15, end=T + 15, match={"i": "1"})).series()
        assert one.values == (-5.0,)
        s.migrations.apply()  # nothing left to do
        assert s.count_samples() == len(rows) + 1
    finally:
        s.close()


def test_a_newer_schema_is_refused_naming_the_store(store: Store) -> None:
    with transaction(raw_engine(store), write=True) as conn:
        write.set_meta(conn, "schema_version", str(t.SCHEMA_VERSION + 1))
    with pytest.raises(StoreError, match="newer than this tritonwatch") as caught:
        store.migrations.apply()
    assert store.url_redacted in str(caught.value)


# --- retention through a chunk ---------------------------------------------------------------


def _chunk_rows(store: Store) -> list[tuple[int, int, int]]:
    c = t.sample_chunks.c
    with transaction(raw_engine(store), write=False) as conn:
        return [
            (r.start_ms, r.end_ms, r.n)
            for r in conn.execute(select(c.start_ms, c.end_ms, c.n).order_by(c.start_ms))
        ]


def _flush_to_chunks(store: Store) -> None:
    """Flush, then move the log into chunks: one chunk per series per flush, as the tests of
    compaction and retention below want to see them."""
    store.flush()
    samplelog.transpose(raw_engine(store), gate=nullcontext())


def test_retention_rewrites_a_chunk_that_straddles_the_cutoff(store: Store) -> None:
    for k in range(20):
        store.write("t", T + k * 15, [Sample("x", (), float(k))])
    _flush_to_chunks(store)  # one chunk: T .. T+285
    assert _chunk_rows(store) == [(T * 1000, (T + 285) * 1000, 20)]
    store.maintenance.rollup(T + 3600 + 900)  # the hour's 5 m buckets rolled up
    # Cut at T+100: samples T..T+90 (7 of them) go, T+105.. stay.
    deleted = store.maintenance.apply_retention(
        T + 100 + 86400, raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8
    )
    assert deleted == 7
    assert _chunk_rows(store) == [((T + 105) * 1000, (T + 285) * 1000, 13)]
    (data,) = store.read(Query("x", start=T, end=T + 3600)).series()
    assert data.values == tuple(float(k) for k in range(7, 20))
    assert store.count_samples() == 13
    # The rollups still count all twenty.
    (five,) = store.read(Query("x", start=T, end=T + 299, step=300, agg="count")).series()
    assert five.values == (20.0,)
    # Retention again: nothing more below the cutoff.
    assert store.maintenance.apply_retention(
        T + 100 + 86400, raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8
    ) == 0


def test_plus_and_minus_infinity_in_one_bucket_never_stop_the_rollups(store: Store) -> None:
    # A hostile or broken target: +Inf and -Inf in one 5-minute bucket (and, later, in two
    # 5-minute buckets of one hour). Their sum has no value; the rollups of everything else
    # must go on, this run and the next.
    store.write("t", T, [Sample("inf", (), math.inf), Sample("ok", (), 1.0)])
    store.write("t", T + 15, [Sample("inf", (), -math.inf), Sample("ok", (), 3.0)])
    store.write("t", T + 600, [Sample("inf", (), math.inf), Sample("ok", (), 5.0)])
    store.write("t", T + 900, [Sample("inf", (), -math.inf)])
    store.flush()
    store.maintenance.rollup(T + 4 * 3600)
    (ok,) = store.read(Query("ok", start=T, end=T + 3599, step=3600, agg="sum")).series()
    assert ok.values == (9.0,)
    (five,) = store.read(Query("ok", start=T, end=T + 299, step=300, agg="avg")).series()
    assert five.values == (2.0,)
    store.write("t", T + 4 * 3600, [Sample("ok", (), 7.0)])
    store.flush()
    store.maintenance.rollup(T + 8 * 3600)  # the next run is not stuck at the bad bucket
    (later,) = store.read(Query("ok", start=T + 4 * 3600, end=T + 5 * 3600 - 1, step=3600,
                                agg="sum")).series()
    assert later.values == (7.0,)


def test_a_series_whose_chunks_all_expired_is_deleted(store: Store) -> None:
    store.write("t", T, [Sample("old", (), 1.0), Sample("both", (), 1.0)])
    store.write("t", T + 600, [Sample("both", (), 2.0)])
    store.flush()
    store.maintenance.rollup(T + 7200)
    now = time.time() + 2 * 86400  # resolved long enough ago
    # raw cutoff: min(now - raw, 5 m watermark) = T + 7080: every chunk goes.
    store.maintenance.apply_retention(now, raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.count_samples() == 0
    assert [k.name for k in store.series()] == ["both", "old"]  # rollup rows keep them
    store.maintenance.apply_retention(now, raw_s=86400, rollup_5m_s=1, rollup_1h_s=1)
    assert store.series() == []


# --- compaction ------------------------------------------------------------------------------


def _labels(i: int) -> Any:
    return make_labels({"i": str(i)})


def test_compaction_merges_an_hour_into_one_chunk_per_series(store: Store) -> None:
    for k in range(240):
        store.write("t", T + k * 15, [Sample("x", _labels(i), float(k + i)) for i in range(2)])
        if k % 4 == 3:
            _flush_to_chunks(store)
    assert len(_chunk_rows(store)) == 2 * 60
    expected = store.read(Query("x", start=T, end=T + 3600)).series()
    store.maintenance.rollup(T + 3600 + 599)  # the hour ended less than 10 minutes ago
    assert len(_chunk_rows(store)) == 2 * 60
    store.maintenance.rollup(T + 3600 + 600)
    assert _chunk_rows(store) == [(T * 1000, (T + 3585) * 1000, 240)] * 2
    assert store.read(Query("x", start=T, end=T + 3600)).series() == expected
    store.maintenance.rollup(T + 3600 + 600)  # idempotent
    assert len(_chunk_rows(store)) == 2


def test_compaction_merges_a_completed_span_of_hours_into_one_chunk_per_series(
    store: Store,
) -> None:
    span = T // (ck.SPAN_MS // 1000) * (ck.SPAN_MS // 1000)
    hours = ck.SPAN_MS // 3_600_000
    for k in range(hours * 120):  # 30 s scrapes
        store.write("t", span + k * 30, [Sample("x", _labels(i), float(k % 7 + i))
                                         for i in range(2)])
        if k % 40 == 39:
            store.flush()
    store.flush()
    end = span + hours * 3600
    expected = store.read(Query("x", start=span, end=end)).series()
    store.maintenance.rollup(end - 3600 + 600)  # all hours but the last compacted
    rows = _chunk_rows(store)
    assert all(a // 3_600_000 == b // 3_600_000 for a, b, _ in rows), rows  # hour chunks
    # The log moves an hour at a time: one chunk per series and hour, the last hour still in
    # the log.
    assert len(rows) == 2 * (hours - 1)
    store.maintenance.rollup(end + 600)  # the span's last hour: the span merged
    assert _chunk_rows(store) == [(span * 1000, (end - 30) * 1000, hours * 120)] * 2
    assert store.read(Query("x", start=span, end=end)).series() == expected
    # Late samples into the merged span: an hour chunk of their own, then merged again,
    # winning over the span's values.
    store.write("t", span + 3600, [Sample("x", _labels(0), -1.0)])
    store.flush()
    store.maintenance.rollup(end + 600)
    assert [n for _, _, n in _chunk_rows(store)] == [hours * 120] * 2
    (got,) = store.read(Query("x", start=span + 3600, end=span + 3600,
                              match={"i": "0"})).series()
    assert got.values == (-1.0,)


def test_compaction_racing_a_late_flush_loses_nothing(
    make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, late = make_store(), make_store()  # a second collector on the same database
    for k in range(240):
        store.write("t", T + k * 15, [Sample("x", _labels(i), 1.0) for i in range(2)])
        _flush_to_chunks(store)
    # Compaction does one series per transaction; right after it committed series 0, the
    # other collector flushes late samples into the same hour for both series: one replacing
    # a stored value, one new.
    monkeypatch.setattr(maintenance, "_COMPACT_IDS", 1)
    real = transaction  # the one store.maintenance uses
    batches = 0

    @contextmanager
    def spy(engine: Any, *, write: bool) -> Iterator[Any]:
        nonlocal batches
        with real(engine, write=write) as conn:
            yield conn
        if write and engine is raw_engine(store):
            batches += 1
            if batches == 2:  # the first one claimed the window
                late.write("t", T + 15, [Sample("x", _labels(i), 2.0) for i in range(2)])
                late.write("t", T + 20, [Sample("x", _labels(i), 3.0) for i in range(2)])
                _flush_to_chunks(late)

    monkeypatch.setattr(maintenance, "transaction", spy)
    assert maintenance.compact(raw_engine(store), now_ms=(T + 3600 + 600) * 1000) > 0
    assert batches > 4  # claim, two series, done; then the window again

    expected = [1.0, 2.0, 3.0] + [1.0] * 238
    for data in store.read(Query("x", start=T, end=T + 3600)).series():
        assert data.values == tuple(expected)
        assert len(data.ts) == 241
    # The late flush marked the window, and compaction went back to it: one chunk each.
    assert [n for _, _, n in _chunk_rows(store)] == [241, 241]
    assert store.count_samples() == 2 * 241
    with transaction(raw_engine(store), write=False) as conn:
        assert get_meta(conn, COMPACT_REWIND) is None
        assert get_meta(conn, COMPACT_WATERMARK) == str((T + 3600) * 1000)


def test_late_samples_into_a_compacted_hour_win_and_are_compacted_again(store: Store) -> None:
    for k in range(240):
        store.write("t", T + k * 15, [Sample("x", (), float(k))])
        store.flush()
    store.maintenance.rollup(T + 7200)
    assert len(_chunk_rows(store)) == 1
    store.write("t", T + 30, [Sample("x", (), -1.0)])  # replaces the value of T+30
    store.write("t", T + 31, [Sample("x", (), -2.0)])
    _flush_to_chunks(store)
    assert len(_chunk_rows(store)) == 2
    (data,) = store.read(Query("x", start=T + 15, end=T + 45)).series()
    assert data.values == (1.0, -1.0, -2.0, 3.0)
    store.maintenance.rollup(T + 7200)
    assert [n for _, _, n in _chunk_rows(store)] == [241]
    (again,) = store.read(Query("x", start=T + 15, end=T + 45)).series()
    assert again == data


@pytest.mark.postgres
def test_compaction_waits_for_a_flush_that_holds_a_write_number(postgres_db_url: str) -> None:
    # A flush takes its seq under the shared rollup lock and holds the lock until it commits;
    # compaction must not merge the window meanwhile (it would give the merged chunk a seq
    # above the uncommitted flush's, and the flush's samples would lose to older ones).
    store = open_store(postgres_db_url)
    store.migrations.apply()
    try:
        for k in range(10):
            store.write("t", T + k * 15, [Sample("x", (), 1.0)])
            _flush_to_chunks(store)
        with psycopg.connect(postgres_db_url) as flusher:
            flusher.execute("SELECT pg_advisory_xact_lock_shared(%s)", (_PG_LOCK_ROLLUP,))
            flusher.execute("SELECT nextval('sample_chunks_seq')")
            compaction = threading.Thread(
                target=maintenance.compact,
                args=(raw_engine(store),),
                kwargs={"now_ms": (T + 7200) * 1000},
            )
            compaction.start()
            compaction.join(0.5)
            assert compaction.is_alive(), "compaction did not wait for the flush"
            assert len(_chunk_rows(store)) == 10
            flusher.commit()
        compaction.join(10)
        assert not compaction.is_alive()
        assert len(_chunk_rows(store)) == 1
    finally:
        store.close()


# --- the PostgreSQL COPY stream --------------------------------------------------------------


def _copy_rows(stream: bytes) -> list[bytes]:
    """The rows of a binary COPY stream (header and trailer checked), each as its bytes."""
    from tritonwatch.store.write import PG_COPY_HEADER, PG_COPY_TRAILER

    assert stream.startswith(PG_COPY_HEADER) and stream.endswith(PG_COPY_TRAILER)
    body, rows, at = stream[len(PG_COPY_HEADER) : -len(PG_COPY_TRAILER)], [], 0
    while at < len(body):
        size = 62 + int.from_bytes(body[at + 58 : at + 62], "big")
        rows.append(body[at : at + size])
        at += size
    assert at == len(body)
    return rows


@settings(max_examples=200, deadline=None)
@given(
    series=st.lists(
        st.tuples(st.integers(1, 2**40), st.lists(st.integers(-(2**45), 2**45), min_size=1,
                                                   max_size=12)),
        min_size=1, max_size=12, unique_by=lambda s: s[0],
    ),
    max_samples=st.sampled_from([None, 1, 3]),
    per_chunk_seq=st.booleans(),
)
def test_copy_stream_holds_the_rows_of_the_row_by_row_stream(
    series: list[tuple[int, list[int]]], max_samples: int | None, per_chunk_seq: bool
) -> None:
    """The column-wise COPY stream against the row-by-row one: the same rows (grouped by
    sample count, so possibly in another order)."""
    from tritonwatch.store.write import copy_stream, copy_stream_rows

    ids, ts = [], []
    for sid, stamps in sorted(series):
        for ms in sorted(set(stamps)):
            ids.append(sid)
            ts.append(ms)
    rng = np.random.default_rng(len(ids))
    values = rng.standard_normal(len(ids))
    values[:: 5] = np.inf
    chunks = ck.encode(np.array(ids, np.int64), np.array(ts, np.int64), values,
                       max_samples=max_samples)
    seq: int | np.ndarray = (
        rng.integers(0, 2**62, len(chunks)) if per_chunk_seq else int(rng.integers(0, 2**62))
    )
    fast, slow = copy_stream(chunks, seq), copy_stream_rows(chunks, seq)
    assert len(fast) == len(slow)
    assert sorted(_copy_rows(fast)) == sorted(_copy_rows(slow))
    assert len(_copy_rows(slow)) == len(chunks)


def test_a_flush_larger_than_one_insert_slice_stores_every_chunk(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tritonwatch.store.write as write_module

    # 10 series: four slices on either backend
    monkeypatch.setattr(write_module, "_SQLITE_ROWS", 3)
    monkeypatch.setattr(write_module, "_COPY_ROWS", 3)
    for k in range(4):
        store.write("t", T + k, [Sample("x", make_labels({"i": str(i)}), float(i * 10 + k))
                                 for i in range(10)])
    store.flush()
    data = {dict(d.labels)["i"]: d for d in store.read(Query("x", start=T - 1,
                                                             end=T + 10)).series()}
    assert sorted(data, key=int) == [str(i) for i in range(10)]
    for i in range(10):
        assert data[str(i)].ts == tuple(float(T + k) for k in range(4))
        assert data[str(i)].values == tuple(float(i * 10 + k) for k in range(4))
    assert store.count_samples() == 40
