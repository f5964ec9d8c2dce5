"""Compressed sample chunks (``store.chunks``: raw or pcodec) and the schema 3 -> 4 upgrade.

A differential test holds what :func:`chunks.compress` wrote, decoded, equal to the samples
given, bit for bit (every NaN payload, Prometheus's stale marker among them, infinities, -0.0,
counter resets); then through real databases on both backends: a compressed stale marker read
back by the query path, compaction compressing hours, a store made by the previous version
(committed: ``data/schema3.db``) upgraded and its raw chunks re-encoded by maintenance.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pcodec import wrapped
from sqlalchemy import func, select

from tests.store.data.make_schema3_db import T as T3
from tests.store.data.make_schema3_db import value as value3
from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store, open_store, samplelog
from tritonwatch.store import chunks as ck
from tritonwatch.store.engine import transaction
from tritonwatch.store.maintenance import COMPACT_REWIND
from tritonwatch.store.query import merge_rows, raw_samples
from tritonwatch.store.write import get_meta, insert_chunks, set_meta

STALE_NAN = 0x7FF0000000000002  # Prometheus's staleness marker
HOUR_MS = 3_600_000
T = (int(time.time()) // 3600 - 72) * 3600  # an hour boundary three days ago (s)
SCHEMA3_DB = Path(__file__).parent / "data" / "schema3.db"


def _bits(values: np.ndarray) -> list[int]:
    return np.ascontiguousarray(values, np.float64).view(np.uint64).tolist()  # type: ignore[no-any-return]


# --- the codec on its own ----------------------------------------------------------------------

# Any float64 bit pattern (every NaN payload), with the special ones often.
_value_bits = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([STALE_NAN, 0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000000,
                     0xFFF0000000000000, 0x8000000000000000, 0]),
    st.floats(allow_nan=False, allow_infinity=False).map(
        lambda f: int(np.array([f]).view(np.uint64)[0])),
)


@st.composite
def _series(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """One series' samples within a window: ascending timestamps, any values; often a counter
    that resets, as a restarted server's do."""
    n = draw(st.integers(1, 300))
    base = draw(st.integers(-(2**40), 2**40)) // HOUR_MS * HOUR_MS
    if draw(st.booleans()):
        # A scrape every 15 s with a few ms of jitter: what the store mostly holds.
        jitter = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
        ts = base + np.arange(n, dtype=np.int64) * 15_000 // max(1, n // 240 + 1) + jitter
        ts = np.maximum.accumulate(ts + np.arange(n))  # strictly ascending
        ts = np.minimum(ts, base + HOUR_MS - n + np.arange(n))
    else:
        offsets = draw(st.lists(st.integers(0, HOUR_MS - 1), min_size=n, max_size=n,
                                unique=True))
        ts = base + np.sort(np.array(offsets, np.int64))
    kind = draw(st.sampled_from(["bits", "counter"]))
    if kind == "counter":
        steps = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
        values = np.cumsum(np.array(steps, np.float64))
        reset = draw(st.integers(0, n - 1))
        values[reset:] -= values[reset]  # the restart: from zero again
    else:
        raw = draw(st.lists(_value_bits, min_size=n, max_size=n))
        values = np.array(raw, np.uint64).view(np.float64)
    return ts, values


@settings(max_examples=100, deadline=None)
@given(st.lists(_series(), min_size=1, max_size=6))
def test_compressed_chunks_decode_to_what_was_written_bit_for_bit(
    series: list[tuple[np.ndarray, np.ndarray]],
) -> None:
    ids = np.concatenate([np.full(len(ts), i, np.int64) for i, (ts, _) in enumerate(series)])
    ts = np.concatenate([s[0] for s in series])
    values = np.concatenate([s[1] for s in series])
    raw = ck.encode(ids, ts, values)
    packed = ck.compress(raw)
    # A chunk of more than MAX_CHUNK_BYTES is cut into pieces of its series, in order.
    assert packed.ids.tolist() == sorted(packed.ids.tolist())
    assert set(packed.ids.tolist()) == set(raw.ids.tolist())
    assert int(packed.n.sum()) == int(raw.n.sum())
    blobs = packed.blobs()
    for blob, n in zip(blobs, packed.n.tolist(), strict=True):
        # Compressed, or raw where that is not smaller; never ambiguous.
        assert len(blob) <= 16 * n
        assert ck.is_raw(len(blob), n) or blob[0] == ck.FORMAT_PCO
        assert len(blob) <= ck.MAX_CHUNK_BYTES or n == 1
    got_ts, got_values = ck.columns(packed.n, blobs)
    assert got_ts.tolist() == ts.tolist()
    assert _bits(got_values) == _bits(values)
    # And through the merge, with raw and compressed chunks of the same samples mixed: the
    # later write (the compressed one) wins, value for value the same bits.
    seqs = np.concatenate([np.zeros(len(raw), np.int64), np.ones(len(packed), np.int64)])
    m = ck.merge(np.concatenate([raw.ids, packed.ids]), seqs,
                 np.concatenate([raw.start_ms, packed.start_ms]),
                 np.concatenate([raw.n, packed.n]), raw.blobs() + blobs)
    assert m.ts.tolist() == ts.tolist() and _bits(m.values) == _bits(values)


def test_a_typical_hour_compresses_to_a_few_bytes_a_sample() -> None:
    rng = np.random.default_rng(1)
    ts = T * 1000 + np.arange(240, dtype=np.int64) * 15_000 + rng.integers(0, 9, 240)
    counter = np.cumsum(rng.poisson(40, 240)).astype(np.float64)
    packed = ck.compress(ck.encode(np.zeros(240, np.int64), ts, counter))
    assert packed.sizes[0] < 3 * 240, packed.sizes  # 16 bytes a sample raw


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 50))
def test_damaged_compressed_data_is_a_value_error_naming_the_chunk(junk: bytes, n: int) -> None:
    blob = bytes([ck.FORMAT_PCO]) + junk
    if ck.is_raw(len(blob), n):
        return  # that length reads as raw samples, by definition
    try:
        ck.columns(np.array([n], np.int64), [blob])
    except ValueError as exc:
        assert f"{n} samples" in str(exc)


def test_unknown_format_byte_is_refused() -> None:
    message = r"neither raw \(expected 32\) nor compressed \(format byte 7\)"
    with pytest.raises(ValueError, match=message):
        ck.columns(np.array([2], np.int64), [b"\x07" + b"\0" * 20])


def test_the_installed_pcodec_writes_the_pinned_header() -> None:
    assert wrapped.FileCompressor().write_header() == ck.PCO_HEADER


# --- through the database, both backends ------------------------------------------------------


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


def test_a_stale_marker_survives_a_compressed_chunk_in_the_database(store: Store) -> None:
    store.write("t", T, [Sample("x", make_labels({}), 1.0)])
    store.flush()
    with transaction(raw_engine(store), write=False) as conn:
        (sid,) = conn.execute(select(t.series.c.id)).scalars()
    ts = T * 1000 + 1000 + np.arange(5, dtype=np.int64) * 15_000
    bits = np.array([0x3FF0000000000000, STALE_NAN, 0x7FF0000000000000, 0xFFF0000000000000,
                     0x8000000000000000], np.uint64)
    packed = ck.compress(ck.encode(np.full(5, sid, np.int64), ts, bits.view(np.float64)))
    assert packed.buf[0] == ck.FORMAT_PCO
    with transaction(raw_engine(store), write=True) as conn:
        insert_chunks(conn, packed, 10**9)
    with transaction(raw_engine(store), write=False) as conn:
        m = raw_samples(conn, [sid], lo_ms=int(ts[0]), hi_ms=int(ts[-1]))
    assert m.ts.tolist() == ts.tolist()
    assert _bits(m.values) == bits.tolist()


def _chunk_formats(store: Store) -> list[tuple[int, bool]]:
    """``(start_ms, raw)`` of every chunk."""
    c = t.sample_chunks.c
    with transaction(raw_engine(store), write=False) as conn:
        return [(r.start_ms, ck.is_raw(len(r.data), r.n))
                for r in conn.execute(select(c.start_ms, c.n, c.data).order_by(c.start_ms))]


def test_compaction_compresses_each_hour_and_reads_the_same(store: Store) -> None:
    for k in range(2 * 240):
        store.write("t", T + k * 15, [Sample("x", make_labels({"i": str(i)}),
                                             float(k * (i + 1) % 997)) for i in range(3)])
        if k % 20 == 19:
            store.flush()
            samplelog.transpose(raw_engine(store), gate=nullcontext())
    before = store.read(Query("x", start=T, end=T + 7200)).series()
    assert len(_chunk_formats(store)) == 3 * 24  # a chunk per series and move
    store.maintenance.rollup(T + 7200 + 600)
    formats = _chunk_formats(store)
    # A chunk per series and hour, or per series if the two hours end a span (schema 5).
    spans_end = (T + 7200) % (ck.SPAN_MS // 1000) == 0
    assert len(formats) == (3 if spans_end else 6) and not any(raw for _, raw in formats)
    assert store.read(Query("x", start=T, end=T + 7200)).series() == before


def test_the_previous_versions_sqlite_store_is_upgraded_and_compressed(tmp_path: Path) -> None:
    path = tmp_path / "tw.db"
    shutil.copy(SCHEMA3_DB, path)
    s = open_store(f"sqlite:///{path}")
    try:
        _check_upgrade(s, T3, value3, hours=3)
    finally:
        s.close()


def test_a_schema_3_store_is_upgraded_and_compressed_on_both_backends(store_url: str) -> None:
    # What schema 3 wrote, built with today's raw writers (its chunks were exactly these
    # bytes): hour chunks compacted raw, chunks moved from the log, and log rows.
    s = open_store(store_url)
    s.migrations.apply()

    def value(i: int, k: int) -> float:
        return [float(k * 3 if k < 200 else k - 200), float("inf") if k == 9 else k * 0.5,
                -0.0 if k % 2 else 1e-300][i]

    for k in range(3 * 240):
        s.write("t", T + k * 15, [Sample("x", make_labels({"i": str(i)}), value(i, k))
                                  for i in range(3)])
        if k % 40 == 39:
            s.flush()
            samplelog.transpose(raw_engine(s), gate=nullcontext())
            if k == 2 * 240 - 1:
                # The first two hours into one raw chunk per series, as schema 3 compacted.
                with transaction(raw_engine(s), write=True) as conn:
                    c = t.sample_chunks.c
                    rows = conn.execute(select(c.series_id, c.start_ms, c.seq, c.n, c.data)).all()
                    m = merge_rows(rows, lo_ms=-(2**62), hi_ms=2**62)
                    conn.execute(t.sample_chunks.delete())
                    insert_chunks(conn, ck.encode(m.ids, m.ts, m.values), max(r[2] for r in rows))
    s.flush()
    with transaction(raw_engine(s), write=True) as conn:
        set_meta(conn, "schema_version", "3")
    s.close()
    s = open_store(store_url)
    try:
        _check_upgrade(s, T, value, hours=3)
    finally:
        s.close()


def _check_upgrade(s: Store, t0: int, value: Callable[[int, int], float], *, hours: int) -> None:
    s.migrations.apply()
    with transaction(raw_engine(s), write=False) as conn:
        assert get_meta(conn, "schema_version") == str(t.SCHEMA_VERSION)
        oldest = conn.execute(select(func.min(t.sample_chunks.c.start_ms))).scalar_one()
        assert get_meta(conn, COMPACT_REWIND) == str(oldest // HOUR_MS * HOUR_MS)
    assert any(raw for _, raw in _chunk_formats(s))

    def expected() -> None:
        got = {dict(d.labels)["i"]: d for d in s.read(Query("x", start=t0,
                                                            end=t0 + hours * 3600)).series()}
        for i in range(3):
            want = [value(i, k) for k in range(hours * 240)]
            assert got[str(i)].ts == tuple(float(t0 + k * 15) for k in range(hours * 240))
            assert _bits(np.array(got[str(i)].values)) == _bits(np.array(want))

    expected()  # raw chunks read as they are, before maintenance
    s.maintenance.rollup(t0 + hours * 3600 + 600)  # every hour ended 10 minutes ago
    formats = _chunk_formats(s)
    assert formats and not any(raw for _, raw in formats), formats
    expected()
    s.migrations.apply()  # nothing left to do
    expected()


@pytest.mark.parametrize("n", [1, 2, 7])
def test_tiny_chunks_that_do_not_shrink_stay_raw(n: int) -> None:
    rng = np.random.default_rng(n)
    ts = np.sort(rng.choice(HOUR_MS, n, replace=False)).astype(np.int64)
    values = rng.integers(0, 2**64 - 1, n, dtype=np.uint64).view(np.float64)
    packed = ck.compress(ck.encode(np.zeros(n, np.int64), ts, values))
    assert packed.sizes[0] <= 16 * n
    got_ts, got_values = ck.columns(packed.n, packed.blobs())
    assert got_ts.tolist() == ts.tolist() and _bits(got_values) == _bits(values)
