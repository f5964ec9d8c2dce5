"""Fast replay and backtest (issue 20 item 5): the fast paths give the alerts the slow ones do.

``replay`` holds its time series in memory (``store.memory``) instead of SQLite tables; its
scratch store remembers health reads between its own writes; ``backtest`` loads the window it
evaluates into memory once.  Each is checked here against the path it replaces, through the
real ``replay`` / ``backtest`` / CLI.
"""

from __future__ import annotations

from pathlib import Path

from tests.alerts.test_replay import T0
from tests.alerts.test_replay_fast import _recording, _rules
from tritonwatch.replay import _Replayer, backtest, load_recording, replay
from tritonwatch.schemas.samples import Sample, TargetHealth, make_labels
from tritonwatch.store import Query, Store, open_store
from tritonwatch.store.memory import HELD_SPAN_S


def test_replay_in_memory_gives_the_alerts_of_the_sqlite_scratch_store(tmp_path: Path) -> None:
    rec = _recording(tmp_path / "rec")
    memory = replay(rec, _rules(), ttft_slo=0.2)
    sqlite = replay(rec, _rules(), ttft_slo=0.2, memory=False)
    assert memory == sqlite
    assert {a.alertname for a in memory.alerts} >= {"BusyBatcher", "SlowTTFT", "TargetDown"}
    # Resolutions too, not only firings.
    assert any(a.resolved_at is not None for a in memory.alerts)


def test_scratch_store_health_reads_see_every_write(tmp_path: Path) -> None:
    # A scratch store answers health from memory between its own writes: each write shows.
    with open_store(f"sqlite:///{tmp_path}/s.db", scratch=True) as store:
        store.migrations.apply()
        assert store.health() == []
        store.write_health(TargetHealth("a", "metrics", 100.0, True, 0.1, 5))
        assert [(h.target, h.up) for h in store.health()] == [("a", True)]
        assert [(h.target, h.up) for h in store.health()] == [("a", True)]
        store.write_health(TargetHealth("a", "metrics", 130.0, False, 0.1, 0, "refused"))
        store.write_health(TargetHealth("b", "metrics", 130.0, True, 0.1, 5))
        store.flush()
        assert [(h.target, h.up) for h in store.health()] == [("a", False), ("b", True)]
        assert [(h.target, h.up) for h in store.health(limit=1)] == [("a", False)]
        assert [h.target for h in store.health(targets={"b"})] == ["b"]


def _stored(tmp_path: Path) -> tuple[Store, float, float]:
    """A durable store holding the recording as ``serve`` keeps it (flushed, maintained)."""
    recording = load_recording(_recording(tmp_path / "rec"))
    store = open_store(f"sqlite:///{tmp_path}/tw.db")
    store.migrations.apply()
    times = [s.ts for s in recording.scrapes] + [p["ts"] for p in recording.probes]
    start, end = min(times), max(times)
    _Replayer(recording, store, target="replay", ttft_slo=0.2, itl_slo=None).ingest_until(end)
    store.flush()
    store.maintenance.rollup(end + 3600)
    return store, start, end


def test_backtest_held_in_memory_gives_the_alerts_of_reading_the_database(
        tmp_path: Path) -> None:
    store, start, end = _stored(tmp_path)
    with store:
        held = backtest(store, _rules(), start=start, end=end, step=5.0)
        sql = backtest(store, _rules(), start=start, end=end, step=5.0, held=False)
    assert held == sql
    assert {a.alertname for a in held.alerts} >= {"BusyBatcher", "SlowTTFT"}


def test_held_reads_come_from_memory_inside_the_window_only(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        store.migrations.apply()
        labels = make_labels({"gpu": "0"})
        for i in range(40):
            store.write("t", T0 + 15 * i, [Sample("g", labels, float(i))])
        store.flush()
        inside = Query("g", start=T0, end=T0 + 300)
        want = store.read(inside).series()
        span = HELD_SPAN_S * 1000
        with store.held() as window:
            assert window is not None
            assert store.read(inside).series() == want
            assert window.names == {"g": {round(T0 * 1000) // span}}
            assert window.samples == 40
            # Written after its span was read: a held read does not see it (it answers from
            # memory); reads the holding leaves to the database do.
            store.write("t", T0 + 150, [Sample("g", labels, 1000.0)])
            store.flush()
            assert store.read(inside).series() == want
            assert store.read(Query("g", start=T0 - 3 * 86400, end=T0 + 300)).series() == want
            assert 1000.0 in store.read(Query("g", start=T0, end=T0 + 300, step=300,
                                              agg="max")).values
            assert 1000.0 in store.read(Query("g", start=T0, end=T0 + 300,
                                              max_samples=100)).values
        assert 1000.0 in store.read(inside).values
        # A name past the bound is left to the database.
        with store.held(max_samples=10) as window:
            assert 1000.0 in store.read(inside).values
            assert window is not None and window.names == {"g": None}


def test_held_fleet_with_unaligned_scrapes_holds_its_samples_not_a_grid_of_them(
        tmp_path: Path) -> None:
    # 20 targets scraped a few ms apart: one block per target and name, so what is held is
    # the samples, not (every target's timestamps) x (every target's series).
    with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        store.migrations.apply()
        for i in range(30):
            for t in range(20):
                store.write(f"t{t}", T0 + 15 * i + t / 1000,
                            [Sample("g", make_labels({"gpu": "0"}), float(i))])
        store.flush()
        q = Query("g", start=T0, end=T0 + 600)
        want = store.read(q)
        with store.held() as window:
            got = store.read(q)
            assert window is not None and window.samples == 600
        assert got.series() == want.series() and len(got.keys) == 20
