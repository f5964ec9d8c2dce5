"""``Store.read`` (raw): a raw range read as two columns, equal to reading each series."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pytest

from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, SeriesColumns, SeriesKey, Store, query

T0 = (int(time.time()) // 3600 - 24) * 3600.0


def test_range_columns_equal_each_series_read_alone(make_store: Callable[..., Store]) -> None:
    store = make_store()
    # 640 series over two targets (the reads go 500 ids at a time), written in an order that
    # is not their key order; some only before the window, some with infinities.
    for step in range(6):
        ts = T0 + 15 * step
        for target in ("b-target", "a-target"):
            samples = []
            for i in range(320):
                if i % 7 == 3 and step >= 2:
                    continue  # gone before the window
                value = math.inf if (i + step) % 11 == 0 else float(i * 100 + step)
                samples.append(Sample("x", make_labels({"gpu": str(i % 3), "i": str(i)}), value))
            store.write(target, ts, samples[::-1])
    store.write("a-target", T0, [Sample("other", (), 1.0)])
    store.flush()

    start, end = T0 + 30, T0 + 75
    cols = store.read(Query("x", start=start, end=end))
    assert cols.keys == sorted(cols.keys)
    assert len(cols.keys) == 2 * (320 - len(range(3, 320, 7)))
    assert int(cols.bounds[-1]) == len(cols.ts) == len(cols.values)
    for key, data in zip(cols.keys, cols.series(), strict=True):
        alone = store.read(Query("x", start=start, end=end, target=key.target,
                                 match=dict(key.labels))).series()
        assert len(alone) == 1 and alone[0] == data
        assert data.ts == (T0 + 30, T0 + 45, T0 + 60, T0 + 75)
    assert store.read(Query("x", start=T0 + 1000, end=T0 + 2000)).keys == []
    empty = store.read(Query("nothing", start=start, end=end))
    assert empty.series() == [] and len(empty.bounds) == 1


@pytest.mark.parametrize("seed", range(5))
def test_finite_sums_equal_a_loop_over_the_points(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    counts = rng.integers(1, 9, n)
    ts = np.concatenate([np.sort(rng.choice(100, c, replace=False)).astype(float)
                         for c in counts])
    values = rng.normal(size=len(ts)) * 1e3
    values[rng.random(len(ts)) < 0.15] = np.nan
    values[rng.random(len(ts)) < 0.05] = np.inf
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cols = SeriesColumns([SeriesKey("t", "x", (("i", str(i)),)) for i in range(n)], bounds,
                         ts, values)
    after = float(rng.integers(0, 100))
    sums, found = cols.finite_sums(after)
    for i, sd in enumerate(cols.series()):
        kept = [v for t, v in zip(sd.ts, sd.values, strict=True)
                if t > after and math.isfinite(v)]
        assert found[i] == len(kept)
        assert sums[i] == pytest.approx(math.fsum(kept), rel=1e-12, abs=1e-9)
    assert cols.finite_sums()[1].sum() == np.isfinite(values).sum()


@pytest.mark.parametrize("agg", ["avg", "min", "max", "sum", "count", "last"])
def test_bucketed_columns_read_in_batches_equal_each_series_read_alone(
    make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch, agg: query.Agg
) -> None:
    # Batches of 7 series: a read of 80 series merges a dozen batches, each from the 5-minute
    # rollup and from raw samples (the watermark falls inside the window).
    monkeypatch.setattr(query, "_ID_CHUNK", 7)
    store = make_store()
    for step in range(40):  # every 60 s for 40 minutes
        ts = T0 + 60 * step
        for target in ("b-target", "a-target"):
            samples = [Sample("x", make_labels({"i": str(i)}),
                              math.inf if (i + step) % 13 == 0 else float(i * 100 + step % 7))
                       for i in range(40) if (i + step) % 9]
            store.write(target, ts, samples[::-1])
        store.flush()  # series created in an order that is not their key order
    store.maintenance.rollup(T0 + 25 * 60)
    start, end = T0, T0 + 40 * 60
    cols = store.read(Query("x", start=start, end=end, step=300, agg=agg))
    assert cols.keys == sorted(cols.keys) and len(cols.keys) == 80
    for key, data in zip(cols.keys, cols.series(), strict=True):
        (alone,) = store.read(Query("x", start=start, end=end, step=300, agg=agg,
                                    target=key.target, match=dict(key.labels))).series()
        assert alone == data
        assert len(data.ts) == 8
