"""Long windows kept between evaluations (alerts/history.py), against a real SQLite store."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonwatch.alerts import history
from tritonwatch.alerts.history import BucketHistory, group_grid, quantum_for
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, SeriesColumns, SeriesData, SeriesSums, Store

T0 = 1_750_003_200.0  # on the 5-minute grid
A = make_labels({"model": "a", "version": "1"})
B = make_labels({"model": "b", "version": "1"})


class CountingStore:
    """Forwards to a store and records every sample read's kind, name and window."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: list[tuple[str, str, float, float]] = []

    def read(self, q: Query) -> SeriesColumns:
        self._record(q)
        return self._store.read(q)

    def finite_sums(self, q: Query, **kw: Any) -> SeriesSums:
        self._record(q)
        return self._store.finite_sums(q, **kw)

    def read_batches(self, q: Query, **kw: Any) -> Iterator[SeriesColumns]:
        self._record(q)
        return self._store.read_batches(q, **kw)

    def _record(self, q: Query) -> None:
        # The rules read one name over a whole window (a read without either would fail).
        assert q.name is not None and q.start is not None and q.end is not None, q
        self.calls.append(("buckets" if q.step is not None else "range", q.name, q.start, q.end))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._store, attr)

    def as_store(self) -> Store:
        return cast(Store, self)


def fill(store: Store, start: float, end: float, *, gone_after: float | None = None) -> None:
    ts = start
    rng = np.random.default_rng(0)
    while ts <= end:
        batch = [Sample("x", A, float(rng.normal(1.0, 0.1)))]
        if gone_after is None or ts < gone_after:
            batch.append(Sample("x", B, float(rng.normal(2.0, 0.1))))
        store.write("t1", ts, batch)
        ts += 15.0
    store.flush()


def test_quantum_is_a_multiple_of_the_step_of_at_least_five_minutes() -> None:
    assert quantum_for(60.0) == 300.0
    assert quantum_for(300.0) == 300.0
    assert quantum_for(45.0) == 315.0
    assert quantum_for(600.0) == 600.0


def test_group_grid_averages_series_of_a_group_bucket_by_bucket() -> None:
    data = [
        SeriesData("t", "x", make_labels({"model": "a", "gpu": "0"}), (0.0, 60.0), (1.0, 3.0)),
        SeriesData("t", "x", make_labels({"model": "a", "gpu": "1"}), (0.0,), (2.0,)),
        SeriesData("t", "x", make_labels({"model": "a", "gpu": "2"}), (60.0,), (float("nan"),)),
    ]
    _, (arr,) = group_grid(SeriesColumns.of(data), ("model",), lo=0.0, n=3, step=60.0)
    assert arr[:2].tolist() == [1.5, 3.0] and np.isnan(arr[2])
    _, (summed,) = group_grid(SeriesColumns.of(data), ("model",), lo=0.0, n=3, step=60.0, how="sum")
    assert summed[:2].tolist() == [3.0, 3.0]


_POINT = st.tuples(st.integers(-2, 7), st.sampled_from(
    [0.5, 1.0, 2.25, -3.0, 1e12, float("nan"), float("inf")]))
_SERIES = st.lists(st.tuples(st.sampled_from(["t1", "t2"]), st.sampled_from(["a", "b", "c"]),
                             st.sampled_from(["0", "1"]), st.lists(_POINT, max_size=6)),
                   max_size=8)


@settings(max_examples=200, deadline=None)
@given(_SERIES, st.sampled_from(["mean", "sum"]), st.integers(0, 10**6), st.floats(-0.2, 0.2))
def test_group_grid_equals_a_point_by_point_reference(series: Any, how: Any, lo_steps: int,
                                                      jitter: float) -> None:
    # The vectorised grouping against the obvious loop over every point (bucket stamps a
    # little off the grid, as a store's float arithmetic leaves them).
    step, n = 60.0, 5
    lo = T0 + lo_steps * step
    data = [SeriesData(t, "x", make_labels({"model": m, "gpu": g}),
                       tuple(lo + (i + jitter) * step for i, _ in pts), tuple(v for _, v in pts))
            for t, m, g, pts in series]
    acc: dict[Any, dict[int, list[float]]] = {}
    for sd in data:
        key = (sd.target, make_labels({"model": dict(sd.labels)["model"]}))
        for ts, v in zip(sd.ts, sd.values, strict=True):
            i = round((ts - lo) / step)
            if 0 <= i < n and math.isfinite(v):
                acc.setdefault(key, {}).setdefault(i, []).append(v)
    keys, grid = group_grid(SeriesColumns.of(data), ("model",), lo=lo, n=n, step=step, how=how)
    assert keys == list(acc)  # first-seen order
    assert grid.shape == (len(keys), n)
    for key, row in zip(keys, grid, strict=True):
        for i in range(n):
            vs = acc[key].get(i)
            if vs is None:
                assert math.isnan(row[i])
            else:
                want = sum(vs) / len(vs) if how == "mean" else sum(vs)
                assert row[i] == pytest.approx(want, rel=1e-12)


_BATCHED = st.lists(st.tuples(
    st.sampled_from(["t1", "t2", "t3"]), st.sampled_from(["a", "b"]), st.integers(0, 9),
    st.lists(st.tuples(st.integers(-1, 5), st.floats(-1e6, 1e6) | st.sampled_from(
        [float("nan"), float("inf"), -float("inf"), 0.1, 1 / 3])), min_size=1, max_size=12)),
    max_size=30, unique_by=lambda s: (s[0], s[1], s[2]))


@settings(max_examples=200, deadline=None)
@given(_BATCHED, st.sampled_from(["mean", "sum"]), st.lists(st.integers(1, 29), max_size=6))
def test_group_grid_of_batches_equals_the_whole_to_the_bit(series: Any, how: Any,
                                                           cuts: list[int]) -> None:
    # Store.read_batches hands a read over in batches of series: the grid is the same, bit
    # for bit (the same additions in the same order), and so are the groups and their order.
    step, n = 60.0, 5
    data = [SeriesData(t, "x", make_labels({"model": m, "gpu": str(g)}),
                       tuple(T0 + i * step for i, _ in pts), tuple(v for _, v in pts))
            for t, m, g, pts in series]
    whole = SeriesColumns.of(data)
    edges = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    batches = [SeriesColumns.of(data[a:b]) for a, b in itertools.pairwise(edges)]
    keys, grid = group_grid(whole, ("model",), lo=T0, n=n, step=step, how=how)
    got_keys, got = group_grid(iter(batches), ("model",), lo=T0, n=n, step=step, how=how)
    assert got_keys == keys
    assert got.shape == grid.shape
    assert got.tobytes() == grid.tobytes()


def test_sliding_reads_each_slice_once_and_equals_a_whole_read(store: Store) -> None:
    fill(store, T0, T0 + 3 * 3600)
    counting = CountingStore(store)
    hist = BucketHistory("x", step=60.0, by=("model",))
    lo = T0 + 3600.0
    assert hist.advance(counting.as_store(), lo, lo + 3600)
    assert not hist.advance(counting.as_store(), lo, lo + 3600)  # same quantum: no read
    assert len(counting.calls) == 1
    for k in range(1, 6):
        hist.advance(counting.as_store(), lo + k * 300, lo + 3600 + k * 300)
        # Only the new 5 minutes are read (end 1 ms short of the next slice).
        _, _, start, end = counting.calls[-1]
        assert (start, end) == (lo + 3300 + k * 300, lo + 3600 + k * 300 - 0.001)
    assert len(counting.calls) == 6 and hist.reads == 6
    whole = BucketHistory("x", step=60.0, by=("model",))
    whole.advance(store, lo + 1500, lo + 5100)
    assert hist.data.keys() == whole.data.keys()
    for key, arr in whole.data.items():
        np.testing.assert_array_equal(hist.data[key], arr)
    assert hist.timestamps()[0] == lo + 1500 and len(hist.timestamps()) == 60
    # Kept as float32 (half the bytes), whichever way they were read: the buckets' float64
    # means rounded once.
    assert hist.values.dtype == whole.values.dtype == np.float32
    grid = whole._read(store, lo + 1500, lo + 5100)[1]
    assert grid.dtype == np.float64
    np.testing.assert_array_equal(whole.values, grid.astype(np.float32))


@pytest.mark.parametrize("slice_s", [60.0, 420.0, 3600.0])
def test_a_window_read_a_slice_at_a_time_equals_it_read_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch, slice_s: float
) -> None:
    # A restart's cold read of a 4-hour window is read an hour at a time (the store's
    # columns of a whole window were its peak): the same groups, in the same order, the
    # same buckets, a group gone after the first half hour and one only in the last included.
    fill(store, T0, T0 + 3 * 3600, gone_after=T0 + 1800)
    store.write("t1", T0 + 2.5 * 3600, [Sample("x", make_labels({"model": "c"}), 5.0)])
    store.flush()
    lo, hi = T0 + 600.0, T0 + 3 * 3600.0 - 300.0
    monkeypatch.setattr(history, "READ_SLICE_S", 1e9)
    whole = BucketHistory("x", step=60.0, by=("model",))
    keys, grid = whole._read(store, lo, hi)
    assert grid.dtype == np.float64 and len(keys) == 3
    monkeypatch.setattr(history, "READ_SLICE_S", slice_s)
    counting = CountingStore(store)
    sliced = BucketHistory("x", step=60.0, by=("model",))
    got_keys, got = sliced._read(counting.as_store(), lo, hi)
    assert len(counting.calls) == math.ceil((hi - lo) / slice_s) and sliced.reads == 1
    assert got_keys == keys
    np.testing.assert_array_equal(got, grid.astype(got.dtype))


def test_a_value_beyond_float32_is_kept_as_float64_not_as_an_infinity(store: Store) -> None:
    fill(store, T0, T0 + 3600)
    store.write("t1", T0 + 4000, [Sample("x", A, 1e300)])
    store.flush()
    hist = BucketHistory("x", step=60.0, by=("model",))
    hist.advance(store, T0, T0 + 3600)
    assert hist.values.dtype == np.float32
    hist.advance(store, T0 + 300, T0 + 3900)
    hist.advance(store, T0 + 600, T0 + 4200)  # the slice holding 1e300
    assert hist.values.dtype == np.float64
    row = hist.row(next(k for k in hist.rows if k[1] == (("model", "a"),)))
    assert row is not None and np.nanmax(row) == 1e300 and np.isfinite(row).any()


def test_vanished_groups_are_dropped_and_time_going_back_reads_whole(store: Store) -> None:
    fill(store, T0, T0 + 3 * 3600, gone_after=T0 + 1800)
    hist = BucketHistory("x", step=60.0, by=("model",))
    hist.advance(store, T0, T0 + 1800)
    assert {labels for _, labels in hist.data} == {(("model", "a"),), (("model", "b"),)}
    hist.advance(store, T0 + 1800, T0 + 3600)  # no overlap: read whole
    assert {labels for _, labels in hist.data} == {(("model", "a"),)}
    hist.advance(store, T0, T0 + 1800)  # backwards: read whole again
    assert len(hist.data) == 2 and hist.reads == 3
    for k in range(1, 7):  # slide until b's last bucket leaves the window
        hist.advance(store, T0 + k * 300, T0 + 1800 + k * 300)
        assert len(hist.data) == (2 if k < 6 else 1)


@pytest.mark.parametrize("step", [60.0, 45.0])
def test_slices_on_the_quantum_grid_give_whole_buckets(store: Store, step: float) -> None:
    fill(store, T0, T0 + 2 * 3600)
    q = quantum_for(step)
    lo = np.ceil(T0 / q) * q
    hist = BucketHistory("x", step=step, by=("model",))
    hist.advance(store, lo, lo + 4 * q)
    hist.advance(store, lo + q, lo + 5 * q)
    whole = BucketHistory("x", step=step, by=("model",))
    whole.advance(store, lo + q, lo + 5 * q)
    for key, arr in whole.data.items():
        np.testing.assert_allclose(hist.data[key], arr)


@pytest.mark.parametrize("step", [60.0, 45.0])
def test_a_recent_window_reads_once_per_evaluation_only_what_is_new_and_equals_a_whole_read(
    store: Store, step: float,
) -> None:
    # A store whose "b" series stops half-way: a group that leaves the kept part first.
    fill(store, T0, T0 + 2 * 3600, gone_after=T0 + 5400)
    counting = CountingStore(store)
    recent = history.RecentBuckets("x", step=step, by=("model",))
    window = 900.0
    prev_split = None
    for i in range(120):  # every 30 s, as serve evaluates, over an hour
        now = T0 + 3000.0 + 30.0 * i + 7.0  # off any grid
        start = now - window
        calls = len(counting.calls)
        stamps, got = recent.read(counting.as_store(), start, now)
        assert recent.read(counting.as_store(), start, now)[1] is got  # the same read again
        new = counting.calls[calls:]
        split = max(history.floor_to(now - history.GRACE_S, step),
                    history.ceil_to(start, step))
        if prev_split is None:  # the first: the kept part whole, then the rest
            assert len(new) == 2
        else:
            # One read: what the kept part gained with the rest of the window, from where it
            # ended, so no more than a step and the grace (and the 30 s since) raw.
            assert len(new) == 1
            assert new[0][2] == prev_split and new[0][3] == now
            assert now - new[0][2] <= history.GRACE_S + step + 30.0
        prev_split = split
        # Equal to the window read whole: the kept buckets as float32, the rest as read.
        first = history.ceil_to(start, step)
        n = round((history.floor_to(now, step) + step - first) / step)
        keys, whole = group_grid(
            store.read(Query("x", start=first, end=now, step=step, agg="avg")), ("model",),
            lo=first, n=n, step=step, how="mean")
        np.testing.assert_array_equal(stamps, first + step * np.arange(n))
        assert sorted(got) == sorted(k for k, row in zip(keys, whole, strict=True)
                                     if not np.isnan(row).all())
        kept = round((split - first) / step)
        for key, row in zip(keys, whole, strict=True):
            if key in got:
                np.testing.assert_array_equal(got[key][:kept],
                                              row[:kept].astype(np.float32))
                np.testing.assert_array_equal(got[key][kept:], row[kept:])
    assert recent.history.reads == 120
