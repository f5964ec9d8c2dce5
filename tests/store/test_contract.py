"""One contract suite, run against every store backend (SQLite file and a real PostgreSQL)."""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import numpy as np
import psycopg
import pytest
from psycopg import sql

from tritonwatch.schemas.samples import Labels, Sample, TargetHealth, make_labels
from tritonwatch.store import Agg, Query, QueryError, SeriesKey, Store, StoreError

# Real-looking times: series record when they were last resolved in wall-clock time, and
# retention compares that with `now`.  T0 is an hour boundary three days ago.
T0 = (int(time.time()) // 3600 - 72) * 3600.0
SCRAPE = 15.0

HOSTILE = make_labels(
    {
        "model": "x'); DROP TABLE samples;--",
        "quote": 'say "hi" \\ back\\slash',
        "unicode": "模型-ü-🚀",
        "percent": "%s %(x)s ?",
        "newline": "a\nb",
    }
)


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


@pytest.fixture
def outage(store_url: str) -> Callable[[], AbstractContextManager[None]]:
    """A context manager during which the database refuses the store's writes."""

    @contextmanager
    def sqlite_locked() -> Iterator[None]:
        # Another process holding the write lock longer than the store's busy timeout.
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()

    @contextmanager
    def postgres_refusing() -> Iterator[None]:
        # The database stops accepting connections and drops the open ones, as in a restart.
        base, name = store_url.rsplit("/", 1)
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            db = sql.Identifier(name)
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(db))
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            try:
                yield
            finally:
                admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(db))

    return sqlite_locked if store_url.startswith("sqlite") else postgres_refusing


def scrape(store: Store, target: str, ts: float, values: dict[tuple[str, Labels], float]) -> int:
    return store.write(target, ts, [Sample(n, labels, v) for (n, labels), v in values.items()])


def by_key(results: list[tuple[SeriesKey, float]]) -> dict[SeriesKey, float]:
    return dict(results)


# --- write / read --------------------------------------------------------------------------


def test_round_trip_keeps_values_and_hostile_labels_exactly(store: Store) -> None:
    values = [0.0, -1.5, 1e300, 5e-324, math.inf, -math.inf, 42.0]
    for i, v in enumerate(values):
        assert scrape(store, "triton-a:8002", T0 + i * SCRAPE, {("g", HOSTILE): v}) == 1
    assert store.flush() == len(values)
    assert store.buffered == 0

    (data,) = store.read(Query("g", start=T0, end=T0 + 3600)).series()
    assert data.key == SeriesKey("triton-a:8002", "g", HOSTILE)
    assert data.values == tuple(values)
    assert data.ts == tuple(T0 + i * SCRAPE for i in range(len(values)))
    # The labels went in as data: the table they name is still there.
    assert store.series(Query("g", match={"model": "x'); DROP TABLE samples;--"})) == [data.key]


def test_range_is_inclusive_and_filters_by_target_and_labels(store: Store) -> None:
    a, b = make_labels({"model": "a"}), make_labels({"model": "b", "version": "2"})
    for i in range(5):
        for target in ("t1", "t2"):
            scrape(store, target, T0 + i * SCRAPE, {("c", a): i, ("c", b): 10 + i, ("d", a): 0})
    store.flush()

    ranged = store.read(Query("c", start=T0 + SCRAPE, end=T0 + 3 * SCRAPE, target="t1")).series()
    assert [(d.target, d.labels) for d in ranged] == [("t1", a), ("t1", b)]
    assert ranged[0].values == (1.0, 2.0, 3.0)  # both ends included
    assert [d.labels for d in store.read(Query("c", start=T0, end=T0 + 60,
                                               match={"version": "2"})).series()] == [
        b,
        b,
    ]
    # As in PromQL, an empty matcher selects series without that label.
    assert {k.labels for k in store.series(Query("c", match={"version": ""}))} == {a}
    assert store.read(Query("c", start=T0 + 600, end=T0 + 700)).series() == []
    assert store.read(Query("nope", start=T0, end=T0 + 60)).series() == []


def test_series_are_unique_whatever_the_label_order_and_writer(make_store) -> None:
    first, second = make_store(), make_store()
    sorted_labels = make_labels({"a": "1", "b": "2"})
    unsorted = (("b", "2"), ("a", "1"))
    first.write("t", T0, [Sample("x", sorted_labels, 1.0)])
    first.write("t", T0 + 15, [Sample("x", unsorted, 2.0)])
    first.flush()
    second.write("t", T0 + 30, [Sample("x", make_labels({"b": "2", "a": "1"}), 3.0)])
    second.flush()

    assert first.series() == [SeriesKey("t", "x", sorted_labels)]
    (data,) = second.read(Query("x", start=T0, end=T0 + 60)).series()
    assert data.values == (1.0, 2.0, 3.0)


def test_duplicate_samples_keep_the_last_value_written(store: Store) -> None:
    store.write("t", T0, [Sample("g", (), 1.0), Sample("g", (), 2.0)])
    store.flush()
    store.write("t", T0, [Sample("g", (), 3.0)])  # a re-sent scrape replaces, never fails
    store.flush()
    assert store.read(Query("g", start=T0, end=T0)).series()[0].values == (3.0,)


def test_nan_is_skipped_and_infinities_are_kept(store: Store, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="tritonwatch.store")
    n = store.write(
        "t", T0, [Sample("g", (), math.nan), Sample("h", (), math.inf), Sample("i", (), 1.0)]
    )
    assert n == 2
    assert store.flush() == 2
    assert [k.name for k in store.series()] == ["h", "i"]
    assert store.read(Query("h", start=T0, end=T0)).series()[0].values == (math.inf,)
    assert "skipped 1 NaN" in caplog.text


def test_write_flushes_by_itself_once_batch_rows_are_buffered(make_store) -> None:
    s = make_store(batch_rows=10)
    for i in range(3):
        s.write("t", T0 + i, [Sample(f"m{j}", (), float(j)) for j in range(4)])
    assert s.buffered == 0  # the third write crossed 10 and flushed all 12
    assert len(s.series()) == 4


# --- counters ------------------------------------------------------------------------------


def test_increase_and_rate_count_a_reset_as_a_restart_from_zero(store: Store) -> None:
    counter = [100.0, 110.0, 130.0, 5.0, 25.0, 40.0]  # restarted between 130 and 5
    for i, v in enumerate(counter):
        scrape(store, "t", T0 + i * SCRAPE, {("requests_total", ()): v, ("once", ()): v})
    store.write("t", T0, [Sample("single", (), 7.0)])
    store.flush()

    end = T0 + 10 * SCRAPE
    inc = by_key(store.increase(Query("requests_total", start=T0, end=end)))
    key = SeriesKey("t", "requests_total", ())
    assert inc == {key: 10 + 20 + 5 + 20 + 15}
    assert by_key(store.rate(Query("requests_total", start=T0,
                                   end=end)))[key] == pytest.approx(70 / 75)
    # Only the samples inside the window count: 130 -> 5 (reset) -> 25.
    assert by_key(store.increase(Query("requests_total", start=T0 + 30,
                                       end=T0 + 60))) == {key: 25.0}
    # One sample is no increase at all, not zero.
    assert store.increase(Query("single", start=T0, end=end)) == []


def test_a_counter_below_zero_never_gives_a_negative_increase(store: Store) -> None:
    for i, v in enumerate([10.0, 20.0, -50.0, -60.0]):  # was -100 before the clamp
        scrape(store, "t", T0 + i * SCRAPE, {("requests_total", ()): v})
    store.flush()
    (inc,) = store.increase(Query("requests_total", start=T0, end=T0 + 10 * SCRAPE))
    assert inc[1] >= 0.0
    (rate,) = store.rate(Query("requests_total", start=T0, end=T0 + 10 * SCRAPE))
    assert rate[1] >= 0.0


def test_series_appearing_and_disappearing(store: Store) -> None:
    for i in range(8):
        values = {}
        if i < 5:
            values[("c", make_labels({"model": "old"}))] = 10.0 * i
        if i >= 3:
            values[("c", make_labels({"model": "new"}))] = 1.0 * i
        scrape(store, "t", T0 + i * SCRAPE, values)
    store.flush()

    def models(results) -> list[str]:
        return [dict(data.labels)["model"] for data in results]

    assert models(store.read(Query("c", start=T0, end=T0 + 2 * SCRAPE)).series()) == ["old"]
    assert models(store.read(Query("c", start=T0 + 5 * SCRAPE,
                                   end=T0 + 7 * SCRAPE)).series()) == ["new"]
    inc = {dict(k.labels)["model"]: v for k, v in store.increase(Query("c", start=T0,
                                                                       end=T0 + 600))}
    assert inc == {"old": 40.0, "new": 4.0}
    (old_buckets,) = store.read(Query(
        "c", start=T0, end=T0 + 600, step=60, agg="count", match={"model": "old"}
    )).series()
    assert sum(old_buckets.values) == 5


# --- buckets and rollups -------------------------------------------------------------------


#: What each bucket aggregation means, on a plain list of the bucket's values (oldest first).
REFERENCE_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "avg": lambda vs: sum(vs) / len(vs),
    "min": min,
    "max": max,
    "sum": sum,
    "count": len,
    "last": lambda vs: vs[-1],
}


def _reference_buckets(points: list[tuple[float, float]], step: float, agg: str):
    groups: dict[float, list[float]] = {}
    for ts, v in points:
        groups.setdefault(ts // step * step, []).append(v)
    reduce = REFERENCE_AGGREGATIONS[agg]
    return tuple(sorted(groups)), tuple(reduce(groups[b]) for b in sorted(groups))


@pytest.mark.parametrize("agg", ["avg", "min", "max", "sum", "count", "last"])
def test_buckets_aggregate_each_step_like_a_reference(store: Store, agg: Agg) -> None:
    points = [(T0 + i * SCRAPE, float((i * 7) % 11) - 3) for i in range(17)]
    for ts, v in points:
        scrape(store, "t", ts, {("g", ()): v})
    store.flush()

    (data,) = store.read(Query("g", start=T0, end=T0 + 3600, step=60, agg=agg)).series()
    expected_ts, expected = _reference_buckets(points, 60, agg)
    assert data.ts == expected_ts
    assert data.values == pytest.approx(expected)


def _fill_hours(store: Store, hours: int) -> None:
    for i in range(int(hours * 3600 / SCRAPE)):
        ts = T0 + i * SCRAPE
        store.write(
            "t",
            ts,
            [
                # Quarter steps add up exactly in floating point, on any summation order.
                Sample("g", make_labels({"gpu": str(g)}), ((i * (g + 3)) % 37) / 4)
                for g in range(3)
            ],
        )
    store.flush()


@pytest.mark.parametrize("step", [300, 900, 3600, 7200])
def test_buckets_read_from_rollups_equal_buckets_from_raw(store: Store, step: int) -> None:
    _fill_hours(store, 3)
    end = T0 + 3 * 3600 - 0.001
    aggs: list[Agg] = ["avg", "min", "max", "sum", "count", "last"]
    from_raw = {agg: store.read(Query("g", start=T0, end=end, step=step,
                                      agg=agg)).series() for agg in aggs}
    assert len(from_raw["count"]) == 3

    # Roll up the first two hours only: buckets then come from 1 h rows, 5 m rows and raw.
    # (5 minutes after the second hour: the log has moved it into chunks by then.)
    assert store.maintenance.rollup(T0 + 2 * 3600 + 300) > 0
    for agg in aggs:
        assert store.read(Query("g", start=T0, end=end, step=step,
                                agg=agg)).series() == from_raw[agg], agg

    # Delete the raw samples that were rolled up: the answer must not change, so it came from
    # the rollups.
    now = time.time() + 2 * 86400
    assert store.maintenance.apply_retention(
        now, raw_s=86400, rollup_5m_s=30 * 86400, rollup_1h_s=1e8) > 0
    assert store.read(Query("g", start=T0, end=T0 + 2 * 3600 - 1)).series() == []
    for agg in aggs:
        again = store.read(Query("g", start=T0, end=end, step=step, agg=agg)).series()
        assert again == from_raw[agg], agg


@pytest.mark.parametrize("batch", [1, 2, 500])
@pytest.mark.parametrize("step", [None, 60.0, 300.0])
def test_reads_and_finite_sums_in_batches_equal_one_whole_read(
    store: Store, step: float | None, batch: int
) -> None:
    # Two hours of 3 series on each of 3 targets, with infinities (NaN is not stored) and
    # rolled-up first hour: a 5-minute step reads rollups, then raw.
    for i in range(int(2 * 3600 / SCRAPE)):
        ts = T0 + i * SCRAPE
        for t in ("a", "b", "c"):
            store.write(t, ts, [
                Sample("g", make_labels({"gpu": str(g)}),
                       math.inf if (i + g) % 97 == 0 else
                       -math.inf if t == "b" and g == 1 and i % 131 == 0 else
                       ((i * (g + 3)) % 37) / 4 - 2.5)
                for g in range(3)])
    store.flush()
    assert store.maintenance.rollup(T0 + 3600 + 300) > 0
    agg: Agg | None = None if step is None else "sum"
    for start, end, after in [(T0, T0 + 7200, -math.inf), (T0 + 1000, T0 + 5000, T0 + 2000),
                              (T0 + 9000, T0 + 9999, -math.inf)]:
        q = Query("g", start=start, end=end, step=step, agg=agg)
        whole = store.read(q)
        sums, counts = whole.finite_sums(after)
        got = store.finite_sums(q, after=after, batch=batch)
        assert got.keys == whole.keys
        parts = list(store.read_batches(q, batch=batch))
        assert all(len(p.keys) <= batch for p in parts)  # (series without samples: none)
        assert [k for p in parts for k in p.keys] == whole.keys
        if parts:
            joined = [np.concatenate([getattr(p, c) for p in parts]) for c in ("ts", "values")]
            assert joined[0].tobytes() == whole.ts.tobytes()
            assert joined[1].tobytes() == whole.values.tobytes()
            assert [n for p in parts for n in np.diff(p.bounds).tolist()] == np.diff(
                whole.bounds).tolist()
        assert got.sums.tolist() == sums.tolist() and got.counts.tolist() == counts.tolist()
        if start < T0 + 7200:
            assert len(got.keys) == 9 and 0 < got.counts.sum() < len(whole.values)
    # One target's: the same as its part of every target's.
    one = store.finite_sums(Query("g", start=T0, end=T0 + 7200, target="b", step=step, agg=agg),
                            batch=batch)
    every = store.finite_sums(Query("g", start=T0, end=T0 + 7200, step=step, agg=agg))
    assert one.keys == every.keys[3:6]
    assert one.sums.tolist() == every.sums[3:6].tolist()
    with pytest.raises(QueryError, match="batch"):
        store.finite_sums(Query("g", start=T0, end=T0 + 60), batch=0)
    with pytest.raises(QueryError, match="batch"):
        list(store.read_batches(Query("g", start=T0, end=T0 + 60), batch=0))
    with pytest.raises(QueryError, match="needs a step"):
        store.finite_sums(Query("g", start=T0, end=T0 + 60, agg="sum"))


def test_rollup_is_incremental(store: Store) -> None:
    _fill_hours(store, 1)
    # The hour's 5 m buckets are rolled up together, once its log has been moved (5 minutes
    # after it ends).
    assert store.maintenance.rollup(T0 + 3600 + 150) == 0
    first = store.maintenance.rollup(T0 + 3600 + 450)
    assert first == 3 * 12 + 3  # twelve 5 m rows and one 1 h row per series
    assert store.maintenance.rollup(T0 + 3600 + 450) == 0  # nothing new completed


# --- retention -----------------------------------------------------------------------------


def test_retention_deletes_only_old_data_and_empty_series(make_store) -> None:
    s = make_store(batch_rows=7)  # several delete transactions per table
    now = time.time() + 2 * 86400
    old, recent = T0, now - 3600 * 3
    for i in range(20):
        s.write("t", old + i * SCRAPE, [Sample("gone", (), float(i)), Sample("kept", (), 1.0)])
        s.write("t", recent + i * SCRAPE, [Sample("kept", (), 2.0)])
    s.flush()
    s.maintenance.rollup(now)

    deleted = s.maintenance.apply_retention(now, raw_s=86400, rollup_5m_s=86400, rollup_1h_s=86400)
    assert deleted >= 40  # the 40 old raw samples, plus their rollup rows
    assert [k.name for k in s.series()] == ["kept"]
    (kept,) = s.read(Query("kept", start=old, end=now)).series()
    assert kept.values == (2.0,) * 20
    assert s.read(Query("gone", start=old, end=now)).series() == []
    # Retention is idempotent: nothing more to delete.
    assert s.maintenance.apply_retention(now,
                                         raw_s=86400, rollup_5m_s=86400, rollup_1h_s=86400) == 0
    # A series deleted by retention comes back as a new one when it reappears.
    s.write("t", now, [Sample("gone", (), 5.0)])
    s.flush()
    assert s.read(Query("gone", start=now - 1, end=now + 1)).series()[0].values == (5.0,)


def test_retention_keeps_raw_samples_not_rolled_up_yet(store: Store) -> None:
    store.write("t", T0, [Sample("g", (), 1.0)])
    store.flush()
    now = time.time() + 2 * 86400
    assert store.maintenance.apply_retention(now, raw_s=60, rollup_5m_s=60, rollup_1h_s=60) == 0
    assert store.read(Query("g", start=T0, end=T0)).series()[0].values == (1.0,)


# --- failures ------------------------------------------------------------------------------


def test_failed_flush_keeps_the_buffer_and_a_later_flush_retries(make_store, outage) -> None:
    s = make_store(timeout_s=0.2)
    s.write("t", T0, [Sample("g", (), 1.0)])
    s.flush()  # the series exists and its id is cached
    s.write("t", T0 + 15, [Sample("g", (), 2.0), Sample("new", (), 3.0)])

    with outage():
        with pytest.raises(StoreError) as caught:
            s.flush()
        assert s.buffered == 2
        assert s.url_redacted in str(caught.value)
        assert caught.value.url == s.url_redacted
        assert isinstance(caught.value, ConnectionError)
        s.write("t", T0 + 30, [Sample("g", (), 4.0)])  # scrapes keep coming meanwhile

    assert s.flush() == 3
    assert s.buffered == 0
    assert s.read(Query("g", start=T0, end=T0 + 60)).series()[0].values == (1.0, 2.0, 4.0)
    assert s.read(Query("new", start=T0, end=T0 + 60)).series()[0].values == (3.0,)


def test_buffer_is_bounded_during_an_outage(make_store, outage, caplog) -> None:
    s = make_store(batch_rows=10, timeout_s=0.2)
    with outage():
        for i in range(15):
            # The automatic flush fails once, then backs off instead of blocking every write.
            s.write("t", T0 + i * SCRAPE, [Sample(f"m{j}", (), float(i)) for j in range(10)])
        assert s.buffered == 100  # 10 x batch_rows: the oldest five scrapes were dropped
    assert "automatic flush failed" in caplog.text
    assert "dropped the oldest" in caplog.text
    assert s.flush() == 100
    (m0,) = s.read(Query("m0", start=T0, end=T0 + 3600)).series()
    assert m0.values == tuple(float(i) for i in range(5, 15))


def test_two_stores_creating_the_same_series_at_once_both_succeed(make_store) -> None:
    stores = [make_store(), make_store()]
    rounds, width = 4, 150
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def writer(n: int) -> None:
        try:
            for r in range(rounds):
                s = stores[n]
                s.write(
                    f"t{r}",
                    T0 + n,
                    [Sample("c", make_labels({"i": str(i)}), float(n)) for i in range(width)],
                )
                barrier.wait(timeout=30)
                s.flush()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert errors == []
    assert len(stores[0].series(Query("c"))) == rounds * width
    data = stores[1].read(Query("c", start=T0, end=T0 + 1)).series()
    assert len(data) == rounds * width
    assert {d.values for d in data} == {(0.0, 1.0)}


# --- health and model configs --------------------------------------------------------------


def test_health_keeps_the_latest_and_logs_transitions(store: Store) -> None:
    for i, up in enumerate([True, True, False, False, True]):
        store.write_health(
            TargetHealth("t1", "metrics", T0 + i, up, 0.05, 10 if up else 0, None if up else "boom")
        )
    store.write_health(TargetHealth("t1", "stats", T0, True, 0.01, 3))

    assert store.health() == [
        TargetHealth("t1", "metrics", T0 + 4, True, 0.05, 10, None),
        TargetHealth("t1", "stats", T0, True, 0.01, 3, None),
    ]
    log = store.health_log("t1")
    assert [(h.source, h.ts, h.up) for h in log] == [
        ("metrics", T0, True),
        ("stats", T0, True),
        ("metrics", T0 + 2, False),
        ("metrics", T0 + 4, True),
    ]
    assert log[2].error == "boom"
    assert [h.ts for h in store.health_log(since=T0 + 1)] == [T0 + 2, T0 + 4]


def test_model_configs_are_replaced_per_target_and_model(store: Store) -> None:
    store.put_model_config("t1", "llm", {"max_batch_size": 8, "name": "llm"}, T0)
    store.put_model_config("t1", "llm", {"max_batch_size": 16, "name": "llm"}, T0 + 60)
    store.put_model_config("t2", "llm", {"max_batch_size": 4, "note": "ü'\""}, T0)
    assert store.model_configs() == {
        ("t1", "llm"): {"max_batch_size": 16, "name": "llm"},
        ("t2", "llm"): {"max_batch_size": 4, "note": "ü'\""},
    }
    assert list(store.model_configs("t2")) == [("t2", "llm")]


def test_a_config_written_again_unchanged_keeps_its_time(store: Store) -> None:
    # A collector restart writes every config again: that is no config change.
    store.put_model_config("t1", "llm", {"max_batch_size": 8}, T0)
    store.put_model_config("t1", "llm", {"max_batch_size": 8}, T0 + 600)
    assert store.model_config_times() == {("t1", "llm"): T0}
    store.put_model_config("t1", "llm", {"max_batch_size": 16}, T0 + 1200)
    assert store.model_config_times("t1") == {("t1", "llm"): T0 + 1200}
    assert store.model_configs() == {("t1", "llm"): {"max_batch_size": 16}}


# --- schema and arguments ------------------------------------------------------------------


def test_create_schema_is_idempotent(store: Store) -> None:
    store.write("t", T0, [Sample("g", (), 1.0)])
    store.flush()
    store.migrations.apply()
    assert store.read(Query("g", start=T0, end=T0)).series()[0].values == (1.0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": T0 + 10, "end": T0}, "after end"),
        ({"start": math.nan, "end": T0}, "finite"),
        ({"start": T0, "end": T0 + 60, "step": 0}, "step"),
        ({"start": T0, "end": T0 + 60, "agg": "median"}, "agg must be one of"),
    ],
    ids=["start after end", "nan start", "zero step", "unknown agg"],
)
def test_bad_query_arguments_raise_query_error(store: Store, kwargs, message) -> None:
    args = {"step": 60, "agg": "avg", **kwargs}
    with pytest.raises(QueryError, match=message):
        store.read(Query("g", **args)).series()
    with pytest.raises(ValueError, match="positive"):
        store.maintenance.apply_retention(T0, raw_s=0, rollup_5m_s=1, rollup_1h_s=1)
