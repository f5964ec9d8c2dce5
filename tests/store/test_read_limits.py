"""Read limits in the store itself, on both backends: one page of the catalogue (LIMIT and
keyset), a series cap read with LIMIT, sample counts taken before a range is read, health
pages of configured targets."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import pytest

from tritonwatch.schemas.samples import Sample, TargetHealth, make_labels
from tritonwatch.store import Query, SeriesColumns, SeriesKey, Store
from tritonwatch.store.errors import LimitExceeded, QueryError

T0 = (int(time.time()) // 3600 - 48) * 3600.0  # an hour boundary two days ago

LABELS = [{"i": "1"}, {"i": "10"}, {"i": "2"}, {"i": "2", "z": 'q"u\\o'}, {"a": "模型"}, {}]


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


def test_pages_of_series_add_up_to_every_series_once(store: Store) -> None:
    for target in ("b", "a"):
        store.write(target, T0, [Sample(n, make_labels(lbl), 1.0)
                                 for n in ("x", "y") for lbl in LABELS])
    store.flush()
    every = set(store.series())
    for size in (1, 2, 5, 100):
        pages: list[SeriesKey] = []
        after = None
        while True:
            page = store.series_page(after=after, limit=size)
            pages += page
            if len(page) < size:
                break
            after = page[-1]
        assert len(pages) == len(every) == 24 and set(pages) == every, size
        assert [(k.target, k.name) for k in pages] == sorted((k.target, k.name) for k in pages)
    assert {k.target for k in store.series_page(Query("y", target="b"), limit=100)} == {"b"}
    assert len(store.series_page(Query("y", target="b"), limit=100)) == len(LABELS)


def _buckets(store: Store, *, end: float, step: float = 60.0,
             match: dict[str, str] | None = None, max_series: int | None = None,
             max_samples: int | None = None) -> SeriesColumns:
    return store.read(Query("g", start=T0, end=end, step=step, agg="avg", match=match,
                            max_series=max_series, max_samples=max_samples))


def test_more_series_than_allowed_is_refused(store: Store) -> None:
    store.write("t", T0, [Sample("g", (("i", str(i)),), 1.0) for i in range(30)])
    store.flush()
    assert len(_buckets(store, end=T0 + 60, max_series=30).keys) == 30
    with pytest.raises(LimitExceeded) as err:
        _buckets(store, end=T0 + 60, max_series=29)
    assert (err.value.what, err.value.limit) == ("series", 29)
    assert isinstance(err.value, QueryError)
    # With a label match the cap counts the matching series only.
    assert len(_buckets(store, end=T0 + 60, match={"i": "3"}, max_series=1).keys) == 1


def test_samples_are_counted_before_they_are_read(store: Store) -> None:
    # Two hours of one series every 15 s: 480 samples.  The older hour is moved into chunks
    # and rolled up; the newer one stays in the sample log.
    for k in range(480):
        store.write("t", T0 + 15 * k, [Sample("g", (), float(k))])
        if k == 239:
            store.flush()
            store.maintenance.rollup(T0 + 7200)
    store.flush()
    end = T0 + 7199
    assert len(_buckets(store, end=end, max_samples=480).values) == 120
    with pytest.raises(LimitExceeded) as err:
        _buckets(store, end=end, max_samples=479)
    assert (err.value.what, err.value.limit) == ("samples", 479)
    # A 5-minute step reads the first hour's 12 rollup rows instead of its 240 samples.
    assert len(_buckets(store, end=end, step=300.0, max_samples=240 + 12).values) == 24
    with pytest.raises(LimitExceeded):
        _buckets(store, end=end, step=300.0, max_samples=240 + 11)


def test_batched_reads_bound_the_whole_read_not_each_batch(store: Store) -> None:
    # Two hours of 4 series every 15 s: 1,920 samples; the older hour moved and rolled up.
    for k in range(480):
        store.write("t", T0 + 15 * k, [Sample("g", (("i", str(i)),), float(k)) for i in range(4)])
        if k == 239:
            store.flush()
            store.maintenance.rollup(T0 + 7200)
    store.flush()
    end = T0 + 7199
    raw = Query("g", start=T0, end=end, max_samples=1920)
    assert store.finite_sums(raw, batch=1).counts.tolist() == [480] * 4
    with pytest.raises(LimitExceeded):  # each batch of one series reads 480
        store.finite_sums(replace(raw, max_samples=1919), batch=1)
    assert sum(len(p.values) for p in store.read_batches(raw, batch=1)) == 1920
    with pytest.raises(LimitExceeded):  # before the first batch is read
        next(store.read_batches(replace(raw, max_samples=1919), batch=1))
    five = Query("g", start=T0, end=end, step=300.0, agg="count", max_samples=4 * (240 + 12))
    assert store.finite_sums(five, batch=1).sums.tolist() == [480.0] * 4
    with pytest.raises(LimitExceeded):
        store.finite_sums(replace(five, max_samples=4 * (240 + 12) - 1), batch=1)


def test_health_pages_of_configured_targets(store: Store) -> None:
    for name in ("a", "b", "c", "d"):
        for source in ("api", "metrics"):
            store.write_health(TargetHealth(name, source, T0, True, 0.1, 1, None))
    assert len(store.health()) == 8
    page = store.health(targets={"a", "c", "d"}, limit=3)
    assert [(h.target, h.source) for h in page] == [("a", "api"), ("a", "metrics"),
                                                     ("c", "api")]
    rest = store.health(targets={"a", "c", "d"}, after=("c", "api"), limit=10)
    assert [(h.target, h.source) for h in rest] == [("c", "metrics"), ("d", "api"),
                                                    ("d", "metrics")]


def test_a_lookup_read_in_batches_finds_every_series_once_in_key_order(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The series table is read a batch of driver rows at a time (query.SCAN_BATCH): batches
    # of 4 rows over 36 series, with a match and a series cap cutting across them.
    from tritonwatch.store import query

    monkeypatch.setattr(query, "SCAN_BATCH", 4)
    for target in ("c", "a", "b"):
        store.write(target, T0, [Sample("x", make_labels({**lbl, "k": k}), 1.0)
                                 for lbl in LABELS for k in ("0", "1")])
    store.flush()
    every = store.series(Query("x"))
    assert len(every) == 36 and len(set(every)) == 36
    assert every == sorted(every)
    assert [k.target for k in every] == ["a"] * 12 + ["b"] * 12 + ["c"] * 12
    only = store.series(Query("x", match={"k": "1", "i": "2"}))
    assert [(k.target, dict(k.labels)) for k in only] == [
        (t, lbl) for t in "abc"
        for lbl in ({"i": "2", "k": "1"}, {"i": "2", "k": "1", "z": 'q"u\\o'})]
    assert len(store.series(Query("x", max_series=36))) == 36
    with pytest.raises(LimitExceeded):
        store.series(Query("x", match={"k": "0"}, max_series=17))


def test_reads_through_one_prepared_statement_each_get_their_own_series_and_window(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The log's and the chunks' reads are built once per backend (id_lists.prepared) and
    # bound at each execution: reads of other ids and windows through the same statement
    # objects must each answer for their own, from the log and from moved chunks alike.
    from tests.store_sql import raw_engine
    from tritonwatch.store import id_lists, maintenance, query, samplelog

    for k in range(8):
        store.write("a", T0 + 15 * k, [Sample("x", (("i", str(i)),), 100.0 * i + k)
                                       for i in range(5)])
        store.write("b", T0 + 15 * k, [Sample("x", (("i", str(i)),), -1.0 - i - k)
                                       for i in range(3)])
        store.flush()

    def read(target: str, match: dict[str, str] | None, lo: float, hi: float
             ) -> dict[str, list[tuple[float, float]]]:
        cols = store.read(Query("x", target=target, match=match, start=lo, end=hi))
        return {dict(s.labels)["i"]: list(zip(s.ts, s.values, strict=True))
                for s in cols.series()}

    def both_ways() -> None:
        assert read("a", {"i": "3"}, T0 + 30, T0 + 60) == {
            "3": [(T0 + 15 * k, 300.0 + k) for k in (2, 3, 4)]}
        assert read("b", None, T0, T0 + 15) == {
            str(i): [(T0, -1.0 - i), (T0 + 15, -2.0 - i)] for i in range(3)}
        assert read("a", {"i": "9"}, T0, T0 + 120) == {}
        buckets = store.read(Query("x", target="a", start=T0, end=T0 + 119, step=60,
                                   agg="max"))
        assert {dict(s.labels)["i"]: s.values for s in buckets.series()} == {
            str(i): (100.0 * i + 3, 100.0 * i + 7) for i in range(5)}

    both_ways()
    statements = {id(id_lists.prepared(build, store.dialect))
                  for build in (samplelog._log_rows, query._chunk_rows)}
    assert len(statements) == 2
    assert id_lists.prepared(samplelog._log_rows, store.dialect) is id_lists.prepared(
        samplelog._log_rows, store.dialect)
    # The hour moved into chunks: the same reads, now from the chunks' statement.
    moved = samplelog.transpose(raw_engine(store), gate=nullcontext())
    assert moved == 8 * 8
    marks: list[int] = []
    real = maintenance.watermarks

    def counted(conn: Any) -> dict[int, int]:
        marks.append(1)
        return real(conn)

    monkeypatch.setattr(maintenance, "watermarks", counted)
    both_ways()
    # A bucketed read of several batches reads the rollup watermarks once, not per batch.
    marks.clear()
    batches = list(store.read_batches(Query("x", start=T0, end=T0 + 119, step=60, agg="avg"),
                                      batch=2))
    assert len(batches) == 4 and marks == [1]
