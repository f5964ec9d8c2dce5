"""Rollup chunks (``store.rollup_chunks``) and the schema 4 -> 5 upgrade of rollup rows.

A differential test holds what :func:`rollup_chunks.compress` wrote, decoded, equal to the
rollup rows given, bit for bit (any NaN payload, Prometheus's stale marker among them,
infinities, -0.0, counters that reset); then through real databases on both backends: rollup
rows of schema 4 (a row per bucket) upgraded into chunks, and every rolled-up read answering
as before.
"""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select, text

from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store, open_store
from tritonwatch.store import rollup_chunks as rc
from tritonwatch.store.chunks import MAX_CHUNK_BYTES
from tritonwatch.store.engine import transaction
from tritonwatch.store.query import ROLLUP_1H_MS, ROLLUP_5M_MS, Agg
from tritonwatch.store.write import get_meta, set_meta

STALE_NAN = 0x7FF0000000000002  # Prometheus's staleness marker
T = (int(time.time()) // 86_400 - 3) * 86_400  # a day boundary three days ago (s)

_value_bits = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([STALE_NAN, 0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000000,
                     0xFFF0000000000000, 0x8000000000000000, 0]),
    st.floats(allow_nan=False, allow_infinity=False).map(
        lambda f: int(np.array([f]).view(np.uint64)[0])),
)


def _bits(values: np.ndarray) -> list[int]:
    return np.ascontiguousarray(values, np.float64).view(np.uint64).tolist()  # type: ignore[no-any-return]


@st.composite
def _rows(draw: st.DrawFn, res: int) -> rc.Rows:
    """Rollup rows of a few series: buckets of one or more windows, columns of any bits, or
    those of a counter that resets (min, max and last rising, then from zero again)."""
    ids, ts, cols = [], [], []
    for sid in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 400))
        base = draw(st.integers(-(2**30), 2**30)) * res
        gaps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        stamps = base + np.cumsum(np.array(gaps, np.int64)) * res
        if draw(st.booleans()):
            level = np.cumsum(np.array(draw(st.lists(st.integers(0, 10**6), min_size=n,
                                                     max_size=n)), np.float64))
            reset = draw(st.integers(0, n - 1))
            level[reset:] -= level[reset]
            five = np.stack([level * 0.9, level, level * 20, level]).T
        else:
            five = np.array(draw(st.lists(_value_bits, min_size=4 * n, max_size=4 * n)),
                            np.uint64).view(np.float64).reshape(n, 4)
        counts = np.array(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)),
                          np.int64)
        ids.append(np.full(n, sid, np.int64))
        ts.append(stamps)
        cols.append((five, counts))
    five = np.concatenate([c[0] for c in cols])
    return rc.Rows(np.concatenate(ids), np.concatenate(ts), five[:, 0].copy(),
                   five[:, 1].copy(), five[:, 2].copy(), np.concatenate([c[1] for c in cols]),
                   five[:, 3].copy())


def _same(a: rc.Rows, b: rc.Rows) -> None:
    assert a.ids.tolist() == b.ids.tolist()
    assert a.ts.tolist() == b.ts.tolist()
    assert a.n.tolist() == b.n.tolist()
    for col in ("min", "max", "sum", "last"):
        assert _bits(getattr(a, col)) == _bits(getattr(b, col)), col


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([ROLLUP_5M_MS, ROLLUP_1H_MS]).flatmap(
    lambda res: st.tuples(st.just(res), _rows(res))))
def test_compressed_rollup_chunks_decode_to_what_was_written_bit_for_bit(
    case: tuple[int, rc.Rows],
) -> None:
    res, rows = case
    raw = rc.encode(rows, res)
    packed = rc.compress(raw, res)
    assert int(packed.n.sum()) == int(raw.n.sum())
    blobs = packed.blobs()
    for blob, n in zip(blobs, packed.n.tolist(), strict=True):
        assert len(blob) <= 48 * n
        assert len(blob) == 48 * n or blob[0] == rc.FORMAT_COLUMNS
        assert len(blob) <= rc.PIECE_BYTES[res] or n == 1  # cut into pieces
    for enc, data in ((raw, raw.blobs()), (packed, blobs)):
        got = rc.decode(enc.ids, np.zeros(len(enc), np.int64), enc.start_ms, enc.n, data,
                        lo_ms=-(2**62), hi_ms=2**62)
        _same(got, rows)
    # Raw and compressed chunks of the same buckets mixed: the later write wins, the same
    # bits; and a window of the buckets, only the columns asked for.
    seqs = np.concatenate([np.zeros(len(raw), np.int64), np.ones(len(packed), np.int64)])
    both = rc.decode(np.concatenate([raw.ids, packed.ids]), seqs,
                     np.concatenate([raw.start_ms, packed.start_ms]),
                     np.concatenate([raw.n, packed.n]), raw.blobs() + blobs,
                     lo_ms=-(2**62), hi_ms=2**62)
    _same(both, rows)
    # The same with the chunks' ends given (a dense chunk's ts computed, not decoded) and only
    # some columns asked for: raw chunks are decoded all at once, packed ones one by one.
    dense = rc.decode(np.concatenate([raw.ids, packed.ids]), seqs[::-1].copy(),
                      np.concatenate([raw.start_ms, packed.start_ms]),
                      np.concatenate([raw.n, packed.n]), raw.blobs() + blobs,
                      lo_ms=-(2**62), hi_ms=2**62, columns=("sum", "last"),
                      ends=np.concatenate([raw.end_ms, packed.end_ms]), res=res)
    assert dense.ids.tolist() == rows.ids.tolist() and dense.ts.tolist() == rows.ts.tolist()
    assert _bits(dense.sum) == _bits(rows.sum) and _bits(dense.last) == _bits(rows.last)
    mid = int(np.median(rows.ts))
    part = rc.decode(packed.ids, np.zeros(len(packed), np.int64), packed.start_ms, packed.n,
                     blobs, lo_ms=mid, hi_ms=2**62, columns=("sum",))
    keep = rows.ts >= mid
    assert part.ts.tolist() == rows.ts[keep].tolist()
    assert _bits(part.sum) == _bits(rows.sum[keep])


def test_a_newer_write_of_a_bucket_wins_as_the_upsert_did() -> None:
    one = rc.Rows(np.array([1, 1]), np.array([0, ROLLUP_5M_MS]), np.array([1.0, 2.0]),
                  np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([1, 1]),
                  np.array([1.0, 2.0]))
    again = rc.Rows(np.array([1]), np.array([ROLLUP_5M_MS]), np.array([5.0]), np.array([6.0]),
                    np.array([7.0]), np.array([3]), np.array([6.0]))
    a = rc.compress(rc.encode(one, ROLLUP_5M_MS), ROLLUP_5M_MS)
    b = rc.encode(again, ROLLUP_5M_MS)
    got = rc.decode(np.array([1, 1]), np.array([9, 4]), np.array([0, ROLLUP_5M_MS]),
                    np.array([2, 1]), a.blobs() + b.blobs(), lo_ms=0, hi_ms=2**62)
    assert got.sum.tolist() == [1.0, 2.0]  # the chunk of seq 9 is newer
    got = rc.decode(np.array([1, 1]), np.array([3, 4]), np.array([0, ROLLUP_5M_MS]),
                    np.array([2, 1]), a.blobs() + b.blobs(), lo_ms=0, hi_ms=2**62)
    assert got.sum.tolist() == [1.0, 7.0] and got.n.tolist() == [1, 3]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 40))
def test_damaged_rollup_chunks_are_a_value_error(junk: bytes, n: int) -> None:
    blob = bytes([1]) + junk
    if len(blob) == 48 * n:
        return  # that length reads as raw rows, by definition
    try:
        rc.decode(np.array([1]), np.array([1]), np.array([0]), np.array([n]), [blob],
                  lo_ms=-(2**62), hi_ms=2**62)
    except ValueError as exc:
        assert f"{n} buckets" in str(exc)


def test_a_day_of_5m_buckets_compresses_far_below_a_row_each() -> None:
    rng = np.random.default_rng(1)
    n = 288
    level = np.cumsum(rng.poisson(400, n)).astype(np.float64)
    rows = rc.Rows(np.zeros(n, np.int64), T * 1000 + np.arange(n) * ROLLUP_5M_MS,
                   level - 300, level, level * 20 - 3000, np.full(n, 20), level)
    packed = rc.compress(rc.encode(rows, ROLLUP_5M_MS), ROLLUP_5M_MS)
    assert int(packed.sizes.sum()) < 12 * n, packed.sizes  # 48 bytes a bucket raw, ~60 a row
    assert (packed.sizes <= MAX_CHUNK_BYTES).all()


# --- the schema 4 -> 5 upgrade, through both backends ----------------------------------------

_AGGS: tuple[Agg, ...] = ("avg", "min", "max", "sum", "count", "last")
_QUERIES = [(step, agg) for step in (300, 3600, 86_400) for agg in _AGGS]


def _answers(s: Store) -> list[tuple[str, tuple[float, ...], list[int]]]:
    out = []
    for step, agg in _QUERIES:
        for d in s.read(Query("x", start=T, end=T + 2 * 86_400, step=step, agg=agg)).series():
            out.append((f"{step} {agg} {dict(d.labels)}", d.ts, _bits(np.array(d.values))))
    return out


def _to_schema4(s: Store) -> int:
    """Turn the rollup chunks back into schema 4's rows (what that version stored); returns
    the rows written."""
    written = 0
    with transaction(raw_engine(s), write=True) as conn:
        for name, table in t.LEGACY_ROLLUP_TABLES.items():
            ms = "DOUBLE PRECISION" if conn.dialect.name == "postgresql" else "FLOAT"
            conn.execute(text(
                f'CREATE TABLE {name} (series_id BIGINT NOT NULL, ts BIGINT NOT NULL, '
                f'"min" {ms} NOT NULL, "max" {ms} NOT NULL, "sum" {ms} NOT NULL, '
                f'"count" BIGINT NOT NULL, "last" {ms} NOT NULL, PRIMARY KEY (series_id, ts))'
            ))
            c = table.c
            got = conn.execute(select(c.series_id, c.start_ms, c.seq, c.n, c.data)).all()
            sids, starts, seqs, ns, blobs = zip(*got, strict=True)
            rows = rc.decode(np.array(sids), np.array(seqs), np.array(starts), np.array(ns),
                             list(blobs), lo_ms=-(2**62), hi_ms=2**62)
            conn.execute(text(
                f'INSERT INTO {name} (series_id, ts, "min", "max", "sum", "count", "last") '
                "VALUES (:a, :b, :c, :d, :e, :f, :g)"
            ), [dict(zip("abcdefg", r, strict=True)) for r in zip(*(x.tolist() for x in rows),
                                                                  strict=True)])
            conn.execute(table.delete())
            written += len(rows)
        set_meta(conn, "schema_version", "4")
    return written


def test_schema_4_rollup_rows_are_upgraded_and_read_the_same(store_url: str) -> None:
    s = open_store(store_url)
    s.migrations.apply()

    def value(i: int, k: int) -> float:
        return [float(k * 3 if k < 3000 else k - 3000), float("inf") if k == 9 else k * 0.5,
                0.25 if k % 2 else 1e-300][i]  # no -0.0: a schema 4 row on SQLite kept 0.0

    for k in range(2 * 86_400 // 30):  # two days at 30 s
        s.write("x", T + k * 30, [Sample("x", make_labels({"i": str(i)}), value(i, k))
                                  for i in range(3)])
        if k % 500 == 499:
            s.flush()
    s.flush()
    s.maintenance.rollup(T + 2 * 86_400 + 600)
    before = _answers(s)
    assert len(before) == 3 * len(_QUERIES)
    # The rolled-up answers come from the rollups: raw samples gone, the same answers.
    with transaction(raw_engine(s), write=True) as conn:
        conn.execute(t.sample_chunks.delete())
    assert _answers(s) == before
    moved = _to_schema4(s)
    assert moved >= 3 * (2 * 288 + 2 * 24)
    s.close()
    s = open_store(store_url)
    try:
        s.migrations.apply()
        with transaction(raw_engine(s), write=False) as conn:
            assert get_meta(conn, "schema_version") == str(t.SCHEMA_VERSION)
            assert not any(inspect(conn).has_table(n) for n in t.LEGACY_ROLLUP_TABLES)
        assert _answers(s) == before
        s.maintenance.rollup(T + 2 * 86_400 + 1200)  # compaction over migrated chunks
        assert _answers(s) == before
    finally:
        s.close()


def _rollup_pieces(s: Store) -> list[tuple[int, int, int, int]]:
    c = t.rollup_chunks_5m.c
    with transaction(raw_engine(s), write=False) as conn:
        return [tuple(r) for r in conn.execute(
            select(c.series_id, c.start_ms, c.seq, func.length(c.data)).order_by(
                c.series_id, c.start_ms))]


def test_hourly_compaction_rewrites_only_the_open_rollup_pieces(store: Store) -> None:
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 1e6, (2880, 3))  # incompressible: a day takes several pieces
    day = T - 86_400
    for hour in range(24):
        for k in range(hour * 120, hour * 120 + 120):
            store.write("x", day + k * 30, [Sample("x", make_labels({"i": str(i)}),
                                                   float(noise[k, i])) for i in range(3)])
        store.flush()
        store.maintenance.rollup(day + (hour + 1) * 3600 + 600)
        if hour == 20:
            sealed = {p for p in _rollup_pieces(store) if p[3] >= rc.PIECE_BYTES[ROLLUP_5M_MS] // 2}
            assert len(sealed) >= 3 * 2
    pieces = _rollup_pieces(store)
    assert sealed <= set(pieces)  # the later hours left the sealed pieces alone
    assert all(p[3] <= MAX_CHUNK_BYTES for p in pieces)
    assert len({p[0] for p in pieces}) == 3
    got = {dict(d.labels)["i"]: d.values for d in store.read(
        Query("x", start=day, end=day + 86_400 - 1, step=300, agg="max")).series()}
    for i in range(3):
        want = noise[:, i].reshape(288, 10).max(axis=1)
        assert got[str(i)] == tuple(want.tolist())
