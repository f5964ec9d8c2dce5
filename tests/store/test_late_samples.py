"""Samples committed after their bucket was rolled up (an outage's buffer, a lagging second
collector) are rolled up too, and retention does not delete them first; on both backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import func, select

from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Sample
from tritonwatch.store import Query, Store, maintenance, open_store, retention
from tritonwatch.store.engine import transaction
from tritonwatch.store.maintenance import _PG_LOCK_ROLLUP, WATERMARK_5M, watermarks
from tritonwatch.store.query import ROLLUP_1H_MS, ROLLUP_5M_MS

# An hour boundary three days ago (series record wall-clock resolve times; see test_contract).
T = (int(time.time()) // 3600 - 72) * 3600.0
SCRAPE = 15.0
PER_BUCKET = int(300 / SCRAPE)  # samples of one series per 5 m bucket


@pytest.fixture(autouse=True)
def every_5_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Roll up each 5 m bucket as soon as it is complete, not a whole hour at a time once the
    log has moved (``maintenance.ROLLUP_5M_EVERY_MS``): the rules for late samples are the
    same at either cadence, and these scenarios read plainly at the finer one.  The hourly
    default has tests of its own (end of this module)."""
    monkeypatch.setattr(maintenance, "ROLLUP_5M_EVERY_MS", ROLLUP_5M_MS)


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    return make_store()


def write(store: Store, start: float, end: float, target: str = "a") -> None:
    ts = start
    while ts < end:
        store.write(target, ts, [Sample("x", (), 1.0)])
        ts += SCRAPE


def marks(store: Store) -> dict[int, int]:
    with transaction(raw_engine(store), write=False) as conn:
        return watermarks(conn)


def counts(store: Store, step: float, end: float = T + 3600 - 0.001) -> dict[float, float]:
    """Samples per ``step`` bucket; steps of 5 m / 1 h are served from the rollups."""
    (data,) = store.read(Query("x", start=T, end=end, step=step, agg="count")).series()
    return dict(zip(data.ts, data.values, strict=True))


def test_samples_buffered_through_an_outage_are_rolled_up(store: Store) -> None:
    # Normal operation: the first 5 minutes are flushed and rolled up.
    write(store, T, T + 300)
    store.flush()
    store.maintenance.rollup(T + 600)
    assert marks(store)[ROLLUP_5M_MS] == (T + 300) * 1000
    # Database outage: ten minutes stay in the buffer, while the maintenance job (which does
    # not need the buffer) moves the watermark past them.
    write(store, T + 300, T + 900)
    store.maintenance.rollup(T + 1200)
    assert marks(store)[ROLLUP_5M_MS] == (T + 900) * 1000
    # The database is back: the flush moves the watermark back, in its own transaction.
    store.flush()
    assert marks(store)[ROLLUP_5M_MS] == (T + 300) * 1000
    assert counts(store, 300, T + 899) == {T: 20, T + 300: 20, T + 600: 20}  # raw after the mark
    store.maintenance.rollup(T + 1500)
    assert marks(store)[ROLLUP_5M_MS] == (T + 1200) * 1000
    assert counts(store, 300, T + 899) == {T: 20, T + 300: 20, T + 600: 20}

    # Raw retention then deletes them: the rollups hold every one.
    store.maintenance.apply_retention(T + 1200 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.read(Query("x", start=T, end=T + 899)).series() == []
    assert counts(store, 300, T + 899) == {T: 20, T + 300: 20, T + 600: 20}


def test_retention_keeps_late_samples_until_rolled_up(make_store: Callable[[], Store]) -> None:
    store, late = make_store(), make_store()  # a second collector on the same database
    write(store, T, T + 600)
    store.flush()
    store.maintenance.rollup(T + 900)
    late.write("b", T + 100, [Sample("x", (), 1.0)])
    late.flush()
    # Before the next rollup, retention must leave the late sample (and its bucket) alone.
    store.maintenance.apply_retention(T + 900 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert [len(d.values) for d in store.read(Query("x", start=T, end=T + 299)).series()] == [20, 1]
    store.maintenance.rollup(T + 900)
    store.maintenance.apply_retention(T + 900 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.read(Query("x", start=T, end=T + 599)).series() == []
    (a, b) = store.read(Query("x", start=T, end=T + 599, step=300, agg="count")).series()
    assert (a.target, a.values) == ("a", (20.0, 20.0))
    assert (b.target, b.values) == ("b", (1.0,))


def test_a_second_writers_late_flush_rewinds_the_hour_too(
    make_store: Callable[[], Store],
) -> None:
    first, second = make_store(), make_store()
    write(first, T, T + 3600)
    first.flush()
    first.maintenance.rollup(T + 3600 + 600)
    assert marks(first) == {ROLLUP_5M_MS: (T + 3900) * 1000, ROLLUP_1H_MS: (T + 3600) * 1000}
    assert counts(first, 3600) == {T: 240}

    # The other collector's buffer lagged: its scrape of T+1000 is committed only now.
    second.write("a", T + 1010, [Sample("x", (), 1.0)])
    second.flush()
    assert marks(first) == {ROLLUP_5M_MS: (T + 900) * 1000, ROLLUP_1H_MS: T * 1000}
    assert counts(first, 3600) == {T: 241}  # served from 5 m rows and raw meanwhile

    first.maintenance.rollup(T + 3600 + 600)
    assert marks(first) == {ROLLUP_5M_MS: (T + 3900) * 1000, ROLLUP_1H_MS: (T + 3600) * 1000}
    assert counts(first, 3600) == {T: 241}  # the 1 h rollup row
    assert counts(first, 300)[T + 900] == 21  # the 5 m rollup row
    # Everything came from the rollups: they survive the raw samples.
    first.maintenance.apply_retention(T + 3600 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert first.read(Query("x", start=T, end=T + 3599)).series() == []
    assert counts(first, 3600) == {T: 241}
    assert counts(first, 300)[T + 900] == 21


def test_late_samples_behind_raw_retention_never_overwrite_rollups(store: Store) -> None:
    write(store, T, T + 3600)
    store.flush()
    store.maintenance.rollup(T + 3600 + 600)
    # Retention cuts the raw samples in the middle of the bucket [T+900, T+1200).
    store.maintenance.apply_retention(T + 1000 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.read(Query("x", start=T, end=T + 999)).series() == []
    assert len(store.read(Query("x", start=T + 1000, end=T + 1199)).series()[0].values) == 13
    before = counts(store, 300)
    assert set(before.values()) == {20.0}

    # A sample older than raw retention arrives (a clock-skewed or very late writer): its
    # bucket and the partly deleted one must keep their complete rollup rows.
    store.write("a", T + 950, [Sample("x", (), 1.0)])
    store.write("a", T + 10, [Sample("x", (), 1.0)])
    store.flush()
    assert marks(store)[ROLLUP_5M_MS] >= (T + 1200) * 1000
    store.maintenance.rollup(T + 3600 + 600)
    assert counts(store, 300) == before
    assert counts(store, 3600) == {T: 240}


@pytest.mark.postgres
def test_a_late_flush_waits_for_a_rollup_in_progress_on_another_process(
    postgres_db_url: str,
) -> None:
    # The rollup of another process is summarising [T+300, T+900) in a transaction that began
    # before our samples of T+400 were committed: it cannot see them.  Our flush must wait for
    # it and then move the watermark it committed back, not compare against the old one.
    store = open_store(postgres_db_url)
    store.migrations.apply()
    try:
        write(store, T, T + 300)
        store.flush()
        store.maintenance.rollup(T + 600)
        assert marks(store)[ROLLUP_5M_MS] == (T + 300) * 1000
        with psycopg.connect(postgres_db_url) as other:
            other.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK_ROLLUP,))
            other.execute(
                "UPDATE meta SET value = %s WHERE key = %s",
                (str(int((T + 900) * 1000)), WATERMARK_5M),
            )
            store.write("a", T + 400, [Sample("x", (), 1.0)])
            flush = threading.Thread(target=store.flush)
            flush.start()
            flush.join(0.5)
            assert flush.is_alive(), "the flush did not wait for the rollup transaction"
            other.commit()
        flush.join(10)
        assert not flush.is_alive()
        assert marks(store)[ROLLUP_5M_MS] == (T + 300) * 1000
    finally:
        store.close()


# --- the hourly default ---------------------------------------------------------------------


def test_5m_buckets_are_rolled_up_an_hour_at_a_time_once_its_log_has_moved(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "ROLLUP_5M_EVERY_MS", ROLLUP_1H_MS)
    write(store, T, T + 3600)
    store.flush()
    store.maintenance.rollup(T + 3600 + 240)  # the hour ended 4 minutes ago: not yet moved
    assert marks(store) == {}
    assert counts(store, 300) == {T + k * 300: 20 for k in range(12)}  # from raw samples
    store.maintenance.rollup(T + 3600 + 300)
    assert marks(store) == {ROLLUP_5M_MS: (T + 3600) * 1000, ROLLUP_1H_MS: (T + 3600) * 1000}
    # The rollups alone hold the hour once raw retention has cut it.
    store.maintenance.apply_retention(T + 3600 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.read(Query("x", start=T, end=T + 3599)).series() == []
    assert counts(store, 300) == {T + k * 300: 20 for k in range(12)}
    assert counts(store, 3600) == {T: 240}


def test_a_late_flush_between_two_batches_of_a_step_stops_its_watermark(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step rolls up a batch of series per transaction.  A second collector's late flush
    # committed after the batch holding its series was done must not be skipped when the
    # step ends: the watermark stops at its bucket and the next run rolls up from there.
    monkeypatch.setattr(maintenance, "ROLLUP_5M_EVERY_MS", ROLLUP_1H_MS)
    monkeypatch.setattr(maintenance, "ID_BATCH", 1)
    store, late = make_store(), make_store()
    write(store, T, T + 3600, "a")
    write(store, T, T + 3600, "b")
    store.flush()
    asked = [0]

    def stop() -> bool:
        asked[0] += 1
        if asked[0] == 3:  # the 5 m step's first batch (series of "a") is committed
            late.write("a", T + 1010, [Sample("x", (), 1.0)])
            late.flush()
        return False

    maintenance.rollup(raw_engine(store), now_ms=round((T + 3600 + 300) * 1000), stop=stop)
    assert asked[0] >= 3
    assert marks(store)[ROLLUP_5M_MS] == (T + 900) * 1000
    (a,) = store.read(Query("x", start=T + 900, end=T + 1199, step=300, agg="count",
                            target="a")).series()
    assert a.values == (21.0,)  # above the watermark: from raw samples
    store.maintenance.rollup(T + 3600 + 300)
    assert marks(store)[ROLLUP_5M_MS] == (T + 3600) * 1000
    store.maintenance.apply_retention(T + 3600 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.read(Query("x", start=T, end=T + 3599)).series() == []
    a, b = store.read(Query("x", start=T, end=T + 3599, step=300, agg="count")).series()
    assert (a.target, a.values[3], sum(a.values)) == ("a", 21.0, 241.0)
    assert (b.target, sum(b.values)) == ("b", 240.0)


@pytest.mark.parametrize("n_series", [4, 5])
def test_maintenance_walks_every_series_a_batch_at_a_time(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch, n_series: int
) -> None:
    # Rollups, compaction and retention list the series a batch at a time, each batch the ids
    # above the last one's (``maintenance.series_id_batch``).  With batches of 2, every series
    # is still rolled up, compacted and cut, whether the last batch is full (4: the walk ends
    # on an empty one) or not (5).
    monkeypatch.setattr(maintenance, "ID_BATCH", 2)
    monkeypatch.setattr(maintenance, "_COMPACT_IDS", 2)
    monkeypatch.setattr(retention, "ID_BATCH", 2)
    store = make_store()
    targets = [f"t{k}" for k in range(n_series)]
    for target in targets:
        write(store, T, T + 7200, target)
    store.flush()
    store.maintenance.rollup(T + 7200 + 600)
    # A late sample in the first hour of every series: a second chunk there, which the next
    # run's compaction merges (the flush marked the hour), and a bucket rolled up again.
    for target in targets:
        store.write(target, T + 10, [Sample("x", (), 1.0)])
    store.flush()
    store.maintenance.rollup(T + 7200 + 900)

    c = t.sample_chunks.c
    with transaction(raw_engine(store), write=False) as conn:
        per_series = conn.execute(
            select(c.series_id, func.count()).group_by(c.series_id)).all()
    assert sorted(n for _, n in per_series) == [2] * n_series  # one chunk an hour each
    hourly = store.read(Query("x", start=T, end=T + 7199, step=3600, agg="count")).series()
    assert sorted(d.target for d in hourly) == targets
    assert all(d.values == (241.0, 240.0) for d in hourly)

    store.maintenance.apply_retention(T + 7200 + 86400,
                                      raw_s=86400, rollup_5m_s=1e8, rollup_1h_s=1e8)
    assert store.read(Query("x", start=T, end=T + 7199)).series() == []
    hourly = store.read(Query("x", start=T, end=T + 7199, step=3600, agg="count")).series()
    assert sorted(d.target for d in hourly) == targets
    assert all(d.values == (241.0, 240.0) for d in hourly)
