"""The in-memory time series of replay's scratch store (``store.memory``, issue 20 item 5).

The store contract's write/read, counter and bucket cases run here unchanged against a store
whose time series live in a ``MemorySeries`` (as ``test_contract_tsdb`` runs them on
VictoriaMetrics); then generated data (counters with resets, gauges with infinities, NaN,
re-sent and late samples, millisecond jitter) is written to it and to a SQLite store, and
every kind of read is compared: raw, buckets of each aggregation at each step (rollup steps
included, also against a SQLite store whose rollups are done), increase, rate, series pages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures_store import stores

# The contract's time-series cases, imported so that pytest collects them here again and runs
# them with this module's `make_store`: on memory.
from tests.store.test_contract import (  # noqa: F401
    T0,
    test_a_counter_below_zero_never_gives_a_negative_increase,
    test_bad_query_arguments_raise_query_error,
    test_buckets_aggregate_each_step_like_a_reference,
    test_duplicate_samples_keep_the_last_value_written,
    test_increase_and_rate_count_a_reset_as_a_restart_from_zero,
    test_range_is_inclusive_and_filters_by_target_and_labels,
    test_series_appearing_and_disappearing,
    test_series_are_unique_whatever_the_label_order_and_writer,
)
from tritonwatch.schemas.samples import Labels, Sample, make_labels
from tritonwatch.store import Agg, Query, SeriesKey, Store, open_store
from tritonwatch.store.errors import LimitExceeded
from tritonwatch.store.memory import HeldWindow, MemorySeries

AGGS: list[Agg] = ["avg", "min", "max", "sum", "count", "last"]


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., Store]]:
    # One MemorySeries for every store of a test: they share it as SQL stores share a file.
    series = MemorySeries()
    yield from stores(lambda **kwargs: open_store(
        f"sqlite:///{tmp_path}/tw.db", timeseries=series, sink=series, **kwargs))


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


@pytest.fixture
def sql_store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/sql.db")
    s.migrations.apply()
    yield s
    s.close()


def _generate(seed: int, *, minus_inf: bool = True) -> list[tuple[str, float, list[Sample]]]:
    """Writes ``(target, ts, samples)`` in write order: 3 hours at about 15 s of two targets,
    counters that reset, gauges with +-inf (only +inf without ``minus_inf``) and NaN, re-sent
    scrapes and late ones."""
    rng = np.random.default_rng(seed)
    writes: list[tuple[str, float, list[Sample]]] = []
    counters = {(t, m): 0.0 for t in ("a", "b") for m in ("m1", "m2", "m3")}
    for i in range(720):
        for target in ("a", "b"):
            ts = T0 + 3 + i * 15 + int(rng.integers(0, 1000)) / 1000
            samples = []
            for model in ("m1", "m2", "m3"):
                c = counters[(target, model)]
                c = float(rng.integers(0, 5)) if rng.random() < 0.02 else c + float(
                    rng.integers(0, 20))
                counters[(target, model)] = c
                # The label order varies: the series is the same.
                lbl: Labels = (("version", "1"), ("model", model)) if i % 2 else make_labels(
                    {"model": model, "version": "1"})
                samples.append(Sample("req_total", lbl, c))
            for gpu in ("0", "1"):
                r = rng.random()
                v = float(rng.normal(50, 20))
                if r < 0.01:
                    v = math.inf
                elif r < 0.02:
                    v = -math.inf if minus_inf else math.inf
                elif r < 0.05:
                    v = math.nan
                samples.append(Sample("gpu_util", make_labels({"gpu": gpu}), v))
            if i % 50 < 40:  # a series that comes and goes
                samples.append(Sample("queue", (), float(i % 7)))
            writes.append((target, ts, samples))
            if rng.random() < 0.03:  # a re-sent scrape with other values: the last one wins
                writes.append((target, ts, [s._replace(value=s.value + 1) for s in samples]))
    # Late samples: an hour-old scrape written at the end, and one in between existing ones.
    writes.append(("a", T0 + 3600.5, [Sample("gpu_util", make_labels({"gpu": "0"}), 7.0)]))
    writes.append(("b", T0 + 18, [Sample("req_total", make_labels({"model": "m1",
                                                                   "version": "1"}), 1e6)]))
    return writes


def _fill(s: Store, writes: list[tuple[str, float, list[Sample]]]) -> None:
    for n, (target, ts, samples) in enumerate(writes):
        s.write(target, ts, samples)
        if n % 97 == 0:
            s.flush()
    s.flush()


def _same(got: Store, want: Store, q: Query) -> None:
    g, w = got.read(q).series(), want.read(q).series()
    assert [(d.key, d.ts) for d in g] == [(d.key, d.ts) for d in w], q
    for a, b in zip(g, w, strict=True):
        assert a.values == pytest.approx(b.values, rel=1e-12, nan_ok=True), q


WINDOWS = [(0, 3 * 3600 + 60), (31.5, 5000.25), (3600, 7200), (18, 18), (900, 900.999)]
STEPS = [15, 60, 45, 7.5, 123.457, 300, 900, 3600]


@pytest.mark.parametrize("seed", [1, 2])
def test_every_read_equals_the_sqlite_store(store: Store, sql_store: Store, seed: int) -> None:
    writes = _generate(seed)
    _fill(store, writes)
    _fill(sql_store, writes)
    assert store.series() == sql_store.series()
    for lo, hi in WINDOWS:
        start, end = T0 + lo, T0 + hi
        for q in (Query("gpu_util", start=start, end=end),
                  Query(names={"gpu_util", "req_total", "queue"}, start=start, end=end),
                  Query("req_total", start=start, end=end, target="b",
                        match={"model": "m2"})):
            _same(store, sql_store, q)
        for step in STEPS:
            for agg in AGGS:
                _same(store, sql_store, Query(names={"gpu_util", "req_total", "queue"},
                                              start=start, end=end, step=step, agg=agg))
        q = Query("req_total", start=start, end=end)
        for got, want in ((store.increase(q), sql_store.increase(q)),
                          (store.rate(q), sql_store.rate(q))):
            assert [k for k, _ in got] == [k for k, _ in want]
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-12)


def test_buckets_at_rollup_steps_equal_a_rolled_up_sqlite_store(
        store: Store, sql_store: Store) -> None:
    # SQLite's rollups leave out a 5-minute bucket holding both +inf and -inf (its sum is NaN,
    # which SQLite stores as NULL), where raw buckets give NaN: not what is compared here.
    writes = _generate(3, minus_inf=False)
    _fill(store, writes)
    _fill(sql_store, writes)
    assert sql_store.maintenance.rollup(T0 + 4 * 3600) > 0
    # Windows on hour boundaries: a rollup row is then wholly inside or outside each one.
    for lo, hi in [(0, 3 * 3600 - 0.001), (3600, 7200 - 0.001)]:
        for step in (300, 900, 3600):
            for agg in AGGS:
                _same(store, sql_store, Query(names={"gpu_util", "req_total"}, start=T0 + lo,
                                              end=T0 + hi, step=step, agg=agg))


def test_series_pages_equal_the_sqlite_store(store: Store, sql_store: Store) -> None:
    writes = _generate(4)
    _fill(store, writes)
    _fill(sql_store, writes)

    def where(target: str, name: str, labels: Labels) -> bool:
        return name != "gpu_util" or (target == "b" and labels != ())
    for q in (Query(where=where), Query(target="a"), Query(start=T0 + 750, end=T0 + 760),
              Query(start=T0 + 50_000, end=T0 + 60_000), Query("queue", start=T0 + 600,
                                                             end=T0 + 9000)):
        for limit in (None, 2, 5):
            pages: list[list[SeriesKey]] = []
            for s in (store, sql_store):
                page = s.series_page(q, limit=limit)
                rest = s.series_page(q, after=page[-1]) if page else []
                pages.append(page + rest)
            assert pages[0] == pages[1], (q, limit)


def test_limits_refuse_before_reading(store: Store) -> None:
    _fill(store, _generate(5))
    with pytest.raises(LimitExceeded, match="more than 3 series"):
        store.read(Query("req_total", start=T0, end=T0 + 60, max_series=3))
    with pytest.raises(LimitExceeded, match="more than 100 samples"):
        store.read(Query("gpu_util", start=T0, end=T0 + 3600, max_samples=100))
    with pytest.raises(LimitExceeded, match="more than 100 samples"):
        store.read(Query("gpu_util", start=T0, end=T0 + 3600, step=60, agg="avg",
                         max_samples=100))
    assert len(store.read(Query("gpu_util", start=T0, end=T0 + 60, max_samples=100)).keys) == 4


def test_a_read_after_a_long_history_returns_the_window_exactly() -> None:
    # Two days of 50 series at 30 s, then a 5-minute read at the end: exactly its samples.
    series = MemorySeries()
    labels = [make_labels({"i": str(i)}) for i in range(50)]
    names = ["g"] * 50
    for k in range(5760):
        series.append_columns("t", T0 + 30 * k, names, labels, np.full(50, float(k)))
    cols = series.read(Query("g", start=T0 + 30 * 5750, end=T0 + 30 * 5759))
    assert len(cols.keys) == 50 and len(cols.values) == 500
    assert set(cols.values.tolist()) == set(map(float, range(5750, 5760)))


def test_a_held_window_answers_as_the_database_span_by_span(sql_store: Store) -> None:
    # Spans of 30 minutes, read in no particular order: later spans merge into a name's block
    # before and after the ones it holds.
    _fill(sql_store, _generate(6))
    held = HeldWindow(sql_store.read, span_s=1800)
    for lo, hi in [(3600, 7200), (18, 18), (31.5, 5000.25), (0, 3 * 3600 + 60)]:
        start, end = T0 + lo, T0 + hi
        for q in (Query("gpu_util", start=start, end=end),
                  Query(names={"gpu_util", "req_total", "queue"}, start=start, end=end),
                  *(Query(names={"gpu_util", "queue"}, start=start, end=end, step=step,
                          agg=agg) for step in (15, 60, 7.5, 123.457) for agg in AGGS)):
            got, want = held.read(q), sql_store.read(q)
            assert got is not None, q
            assert [(d.key, d.ts) for d in got.series()] == [
                (d.key, d.ts) for d in want.series()], q
            assert got.values.tolist() == pytest.approx(want.values.tolist(), rel=1e-12,
                                                        nan_ok=True)
        q = Query("req_total", start=start, end=end)
        inc = held.increase(q)
        assert inc is not None
        want_inc = sql_store.increase(q)
        assert [k for k, _, _, _ in inc] == [k for k, _ in want_inc]
        assert [i for _, i, _, _ in inc] == pytest.approx([i for _, i in want_inc])
    assert held.names["gpu_util"] == set(range(round(T0 * 1000) // 1_800_000,
                                               round((T0 + 3 * 3600 + 60) * 1000) // 1_800_000
                                               + 1))
    # Steps the database may answer from rollups, and bounded reads, are left to it.
    assert held.read(Query("gpu_util", start=T0, end=T0 + 600, step=300, agg="avg")) is None
    assert held.read(Query("gpu_util", start=T0, end=T0 + 600, max_samples=10**6)) is None
    assert held.read(Query(start=T0, end=T0 + 600)) is None
