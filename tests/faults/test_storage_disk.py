"""Bytes on disk (issue 22, goal 1): shared timestamp columns, rollup column modes, schema 6.

Through the real store on both backends: a target's compacted span chunks refer to one stored
timestamp column (``chunk_timestamps``) and a series out of step holds its own; what was
written reads back bit for bit (stale marker, infinities, -0.0, a counter reset), late writes
still win, retention deletes the columns with their chunks; a schema 5 store written by the
previous version (committed: ``tests/store/data/schema5.db``) is upgraded and read back; and
rollups keep +Inf/-Inf buckets and take min/max over the samples that are numbers.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from tests.store.data import make_schema5_db as s5
from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store, open_store
from tritonwatch.store import chunks as ck
from tritonwatch.store import rollup_chunks as rc
from tritonwatch.store.engine import transaction
from tritonwatch.store.query import Agg, raw_samples, read_rollups
from tritonwatch.store.write import get_meta, insert_chunks

STALE = 0x7FF0000000000002  # Prometheus's staleness marker
SPAN_S = ck.SPAN_MS // 1000
T = (int(time.time()) // SPAN_S - 12) * SPAN_S  # a span boundary three days ago (s)
SCHEMA5_DB = Path(__file__).parents[1] / "store" / "data" / "schema5.db"


def _bits(values: object) -> list[int]:
    return np.ascontiguousarray(values, np.float64).view(np.uint64).tolist()  # type: ignore[no-any-return]


def _special(k: int, i: int) -> float:
    """Series ``i`` at scrape ``k``: a counter that resets, a gauge with specials, a constant."""
    if i == 0:
        return float(k * 3 if k < 200 else (k - 200) * 3)
    if i == 1:
        bits = {3: STALE, 4: 0x7FF0000000000000, 5: 0xFFF0000000000000, 6: 0x8000000000000000}
        if k in bits:
            return float(np.array([bits[k]], np.uint64).view(np.float64)[0])
        return 0.25 * (k % 40)
    return 42.0


# -- unit: compress_shared decodes to what was written ------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(1, 1500), st.lists(st.integers(0, 2**64 - 1), max_size=30),
       st.booleans())
def test_shared_and_own_timestamp_chunks_decode_to_what_was_written_bit_for_bit(
    series: int, n: int, extra_bits: list[int], gap: bool,
) -> None:
    ts = T * 1000 + np.arange(n, dtype=np.int64) * 15_000 + np.arange(n) % 7  # jittered
    ids, tss, vals = [], [], []
    for i in range(series):
        v = np.array([_special(k, i % 3) for k in range(n)])
        v[: len(extra_bits)] = np.array(extra_bits[:n], np.uint64).view(np.float64)
        keep = np.ones(n, bool)
        if gap and i == series - 1 and n > 2:
            keep[n // 2] = False  # out of step: the fallback, its own timestamps
        ids.append(np.full(int(keep.sum()), i + 1, np.int64))
        tss.append(ts[keep])
        vals.append(v[keep])
    sid, sts, sv = np.concatenate(ids), np.concatenate(tss), np.concatenate(vals)
    raw = ck.encode(sid, sts, sv, window_ms=ck.SPAN_MS * 10)
    packed, shared = ck.compress_shared(raw)
    blobs = packed.blobs()
    assert all(len(b) <= ck.MAX_CHUNK_BYTES or k == 1
               for b, k in zip(blobs, packed.n.tolist(), strict=True))
    columns = {(c.start_ms, c.key): ck.unpack_timestamps(c.data, c.n) for c in shared}
    refs = ck.shared_refs(packed.start_ms, blobs)
    assert refs == set(columns)
    for (start, key), col in columns.items():
        assert int(col[0]) == start and ck.timestamps_key(col) == key
    in_step = [i % 3 for i in range(series) if not (gap and i == series - 1 and n > 2)]
    if n > 40 and max(map(in_step.count, in_step)) > 1:
        # Long enough that sharing saves bytes, and two series in step with the same values
        # (so cut into the same pieces): they share.
        assert any(b[0] == ck.FORMAT_PCO_SHARED for b in blobs)
    if gap and n > 40:
        own = [b[0] for b, s in zip(blobs, packed.ids.tolist(), strict=True) if s == series]
        assert ck.FORMAT_PCO_SHARED not in own
    m = ck.merge(packed.ids, np.zeros(len(packed), np.int64), packed.start_ms, packed.n, blobs,
                 shared=columns)
    assert m.ids.tolist() == sid.tolist() and m.ts.tolist() == sts.tolist()
    assert _bits(m.values) == _bits(sv)


def test_a_chunk_whose_shared_column_is_missing_is_a_value_error_naming_it() -> None:
    ts = T * 1000 + np.arange(100, dtype=np.int64) * 15_000
    raw = ck.encode(np.repeat(np.array([1, 2], np.int64), 100), np.tile(ts, 2),
                    np.arange(200, dtype=np.float64))
    packed, shared = ck.compress_shared(raw)
    assert len(shared) == 1
    try:
        ck.merge(packed.ids, np.zeros(2, np.int64), packed.start_ms, packed.n, packed.blobs())
    except ValueError as exc:
        assert "shared timestamp column" in str(exc) and str(shared[0].key) in str(exc)
    else:
        raise AssertionError("no ValueError")


# -- through the store, both backends ------------------------------------------------------------


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


def _write_day(store: Store, t0: int, hours: int, *, every: int = 60) -> None:
    for k in range(hours * 3600 // every):
        samples = [Sample("x", make_labels({"i": str(i)}), _special(k, i)) for i in range(3)]
        if k % 9:  # series 3 misses every ninth scrape: its timestamps are its own
            samples.append(Sample("x", make_labels({"i": "3"}), float(k)))
        store.write("t", t0 + k * every, samples)
        if k % 10 == 9:
            store.flush()
            store.maintenance.rollup(t0 + k * every)
    store.flush()


def _chunks(store: Store) -> list[tuple[int, int, int, bytes]]:
    c = t.sample_chunks.c
    with transaction(raw_engine(store), write=False) as conn:
        return [(r.series_id, r.start_ms, r.n, bytes(r.data)) for r in conn.execute(
            select(c.series_id, c.start_ms, c.n, c.data).order_by(c.series_id, c.start_ms))]


def _columns(store: Store) -> int:
    with transaction(raw_engine(store), write=False) as conn:
        return int(conn.execute(select(func.count()).select_from(t.chunk_timestamps)).scalar_one())


def _ids(store: Store) -> dict[str, int]:
    with transaction(raw_engine(store), write=False) as conn:
        return {json.loads(r.labels)["i"]: int(r.id) for r in conn.execute(
            select(t.series.c.id, t.series.c.labels))}


def _read_bits(store: Store, lo_s: int, hi_s: int) -> dict[str, tuple[list[float], list[int]]]:
    got = store.read(Query("x", start=lo_s, end=hi_s)).series()
    return {dict(d.labels)["i"]: (list(d.ts), _bits(np.array(d.values))) for d in got}


def _want(t0: int, hours: int, i: int) -> tuple[list[float], list[int]]:
    # The store skips NaN samples: series 1's stale marker at k = 3 is not stored.
    ks = [k for k in range(hours * 60) if (i < 3 or k % 9) and (i != 1 or k != 3)]
    vals = [_special(k, i) if i < 3 else float(k) for k in ks]
    return [float(t0 + 60 * k) for k in ks], _bits(np.array(vals))


def test_compacted_spans_share_timestamps_read_the_same_and_late_writes_win(store: Store) -> None:
    _write_day(store, T, 7)
    store.maintenance.rollup(T + 8 * 3600)  # the first span compacted
    span_ms = T * 1000
    first = [(sid, n, blob) for sid, start, n, blob in _chunks(store)
             if span_ms <= start < span_ms + ck.SPAN_MS]
    ids = _ids(store)
    formats = {sid: {blob[0] for owner, _, blob in first if owner == sid}
               for sid in ids.values()}
    for name in ("0", "2"):
        assert formats[ids[name]] == {ck.FORMAT_PCO_SHARED}, formats
    # Out of step, holding their own: a scrape missing, and a NaN (the stale marker) skipped.
    for name in ("1", "3"):
        assert ck.FORMAT_PCO_SHARED not in formats[ids[name]], formats
    assert _columns(store) >= 1
    got = _read_bits(store, T, T + 7 * 3600 - 1)
    for i in range(4):
        assert got[str(i)] == _want(T, 7, i), i
    # A late write into the compacted span: the same instant rewritten, and a new one.
    store.write("t", T + 600, [Sample("x", make_labels({"i": "0"}), -1.5)])
    store.write("t", T + 630, [Sample("x", make_labels({"i": "0"}), -2.5)])
    store.flush()
    store.maintenance.rollup(T + 8 * 3600 + 600)
    got = _read_bits(store, T, T + 3599)
    ts, bits = _want(T, 1, 0)
    values = np.array(bits, np.uint64).view(np.float64).tolist()
    values[10] = -1.5
    ts.insert(11, float(T + 630))
    values.insert(11, -2.5)
    assert got["0"] == (ts, _bits(np.array(values)))
    assert got["1"] == _want(T, 1, 1)


def test_retention_deletes_shared_columns_with_their_chunks(store: Store) -> None:
    _write_day(store, T, 13)
    store.maintenance.rollup(T + 14 * 3600)  # two spans compacted
    before = _columns(store)
    assert before >= 2
    now = T + 14 * 3600
    store.maintenance.apply_retention(now, raw_s=now - (T + SPAN_S + 60), rollup_5m_s=10**8,
                                      rollup_1h_s=10**8)
    with transaction(raw_engine(store), write=False) as conn:
        c = t.chunk_timestamps.c
        left = conn.execute(select(c.start_ms, c.end_ms)).all()
        horizon = int(get_meta(conn, "raw_horizon_ms") or 0)
    assert 0 < len(left) < before
    assert all(end >= (T + SPAN_S) * 1000 for _, end in left), left
    assert horizon >= (T + SPAN_S) * 1000
    got = _read_bits(store, T + SPAN_S + 3600, T + 13 * 3600)
    for i in range(4):
        ts, bits = _want(T, 13, i)
        keep = [j for j, x in enumerate(ts) if x >= T + SPAN_S + 3600]
        assert got[str(i)] == ([ts[j] for j in keep], [bits[j] for j in keep]), i


def test_rollups_keep_inf_buckets_and_min_max_skip_nan(store: Store) -> None:
    stale = struct.unpack("<d", struct.pack("<Q", STALE))[0]
    values = [1.0, float("inf"), float("-inf"), 2.0, 3.0, stale, 5.0, 4.0]
    for k, v in enumerate(values):  # two 5 m buckets of four samples
        store.write("t", T + 75 * k, [Sample("y", make_labels({}), v)])
    store.flush()
    with transaction(raw_engine(store), write=True) as conn:
        # The store's writes skip NaN; a stale marker stored otherwise (an older store, a
        # chunk written directly as here) must not hide the bucket's min and max.
        (sid,) = conn.execute(select(t.series.c.id)).scalars()
        insert_chunks(conn, ck.encode(np.array([sid], np.int64),
                                      np.array([(T + 375) * 1000], np.int64),
                                      np.array([stale])), 10**9)
    store.maintenance.rollup(T + 3 * 3600)
    with transaction(raw_engine(store), write=False) as conn:
        rows = read_rollups(conn, t.rollup_chunks_5m, [sid], lo_ms=T * 1000,
                            hi_ms=T * 1000 + 600_000, res=rc.ROLLUP_5M_MS)
        raw = raw_samples(conn, [sid], lo_ms=T * 1000, hi_ms=T * 1000 + 600_000)
    assert len(raw) == 8 and np.isnan(raw.values[5])
    assert rows.ts.tolist() == [T * 1000, T * 1000 + 300_000]  # the +Inf/-Inf bucket kept
    assert rows.min.tolist() == [float("-inf"), 3.0] and rows.max.tolist() == [float("inf"), 5.0]
    assert np.isnan(rows.sum).tolist() == [True, True] and rows.n.tolist() == [4, 4]
    assert rows.last.tolist() == [2.0, 4.0]
    cases: list[tuple[Agg, list[float]]] = [
        ("min", [float("-inf"), 3.0]), ("max", [float("inf"), 5.0]), ("count", [4.0, 4.0]),
        ("last", [2.0, 4.0])]
    for agg, want in cases:
        (got,) = store.read(Query("y", start=T, end=T + 599, step=300, agg=agg)).series()
        assert list(got.values) == want, agg
    (got,) = store.read(Query("y", start=T, end=T + 599, step=300, agg="avg")).series()
    assert all(np.isnan(got.values))


def test_rollup_column_modes_decode_bit_for_bit() -> None:
    n = 288
    ts = T * 1000 // 86_400_000 * 86_400_000 + np.arange(n, dtype=np.int64) * rc.ROLLUP_5M_MS
    stale = np.array([STALE], np.uint64).view(np.float64)[0]
    last = np.cumsum(np.ones(n))
    rows = rc.Rows(np.ones(n, np.int64), ts, np.full(n, stale), last.copy(), np.full(n, -0.0),
                   np.full(n, 20, np.int64), last)
    packed = rc.compress(rc.encode(rows, rc.ROLLUP_5M_MS), rc.ROLLUP_5M_MS)
    blob = packed.blobs()[0]
    assert blob[0] == rc.FORMAT_COLUMNS and len(packed) == 1
    # ts stepped, min constant (a NaN payload), max as last, sum constant -0.0, count constant
    assert list(blob[1:7]) == [2, 1, 3, 1, 1, 0]
    got = rc.decode(packed.ids, np.zeros(1, np.int64), packed.start_ms, packed.n, [blob],
                    lo_ms=-(2**62), hi_ms=2**62)
    for a, b in zip(got, rows, strict=True):
        assert a.dtype == b.dtype and a.view(np.uint64).tolist() == b.view(np.uint64).tolist()


# -- schema 5 -> 6 -------------------------------------------------------------------------------


def test_a_schema_5_store_written_by_the_previous_version_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "tw.db"
    shutil.copy(SCHEMA5_DB, path)
    s = open_store(f"sqlite:///{path}")
    try:
        with transaction(raw_engine(s), write=False) as conn:
            assert get_meta(conn, "schema_version") == "5"
        s.migrations.apply()
        with transaction(raw_engine(s), write=False) as conn:
            assert get_meta(conn, "schema_version") == str(t.SCHEMA_VERSION) == "10"
        assert _columns(s) == 0
        t0, hours = s5.T, s5.HOURS

        def check() -> None:
            got = _read_bits(s, t0, t0 + hours * 3600)
            for i in range(4):
                ks = [k for k in range(hours * 60) if not (i == 1 and k == 500)]  # NaN skipped
                want = ([float(t0 + 60 * k) for k in ks],
                        _bits(np.array([s5.value(i, k) for k in ks])))
                assert got[str(i)] == want, i
            # Its rollup chunks (schema 5's format) read as they are.
            (mx,) = s.read(Query("x", start=t0, end=t0 + 3 * 3600 - 1, step=3600, agg="max",
                                 match={"i": "0"})).series()
            assert mx.values == (59 * 7.0, 119 * 7.0, 179 * 7.0)

        check()
        # Written on by this version: its next spans share their timestamps.
        for k in range(hours * 60, (hours + 12) * 60):
            s.write("t", t0 + k * 60, [Sample("x", make_labels({"i": str(i)}), s5.value(i, k))
                                       for i in range(4)])
            if k % 10 == 9:
                s.flush()
                s.maintenance.rollup(t0 + k * 60)
        s.flush()
        s.maintenance.rollup(t0 + (hours + 13) * 3600)
        assert _columns(s) >= 1
        got = _read_bits(s, t0, t0 + (hours + 12) * 3600)
        for i in range(4):
            ks = [k for k in range((hours + 12) * 60) if not (i == 1 and k == 500)]
            assert got[str(i)] == ([float(t0 + 60 * k) for k in ks],
                                   _bits(np.array([s5.value(i, k) for k in ks]))), i
    finally:
        s.close()
