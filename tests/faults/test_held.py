"""Faults that already held before the fault suite existed, kept here so that they keep holding:
``serve`` killed with SIGKILL mid-run, and a SQLite database that is full.

(The other kinds that held — slow, endless and unreachable targets, oversized and
unauthenticated webhook bodies, URL redaction, an Alertmanager outage — have their tests beside
the code: tests/collector/test_scrape.py, tests/alerts/test_receiver.py, tests/alerts/
test_notify.py, tests/e2e/test_alerting_e2e.py. ``pytest -m fault`` runs them all together.)
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_serve import start_serve, wait_for
from tests.fixtures_http import free_port, serve_fake_targets
from tests.store_sql import raw_engine
from tritonwatch.schemas.samples import Sample
from tritonwatch.store import Query, StoreError, open_store

pytestmark = pytest.mark.fault


def _stored_scrapes(db: Path) -> int:
    with open_store(f"sqlite:///{db}") as store:
        return sum(len(s.values) for s in store.read(Query("up", start=0,
                                                           end=time.time() + 60)).series())


def _integrity(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def test_sigkill_mid_run_never_corrupts_sqlite_nor_loses_what_was_flushed(tmp_path: Path) -> None:
    db = tmp_path / "tw.db"
    with serve_fake_targets() as targets:
        config = tmp_path / "tw.yaml"
        config.write_text(
            f"targets: [{{name: t, metrics_url: '{targets.url('/ok')}'}}]\n"
            "scrape: {interval: 1s, timeout: 1s}\n"
            f"store: {{url: 'sqlite:///{db}', flush_interval: 1s}}\n"
            "nvml: {enabled: false}\n"
        )
        stored = [0]
        for _ in range(3):
            port = free_port()
            proc = start_serve(["--config", str(config), "--listen", f"127.0.0.1:{port}"],
                               tmp_path)
            try:
                wait_for(f"http://127.0.0.1:{port}/healthz", lambda r: r.status_code == 200)
                # Until this run has flushed scrapes of its own (generous: a loaded machine).
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    health = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets").json()["data"]
                    if any(h["up"] for h in health):
                        break
                    time.sleep(0.2)
                time.sleep(2.5)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.communicate(timeout=30)
            assert _integrity(db) == "ok"
            stored.append(_stored_scrapes(db))
            # Everything stored before the kill is still there, and this run added to it.
            assert stored[-1] > stored[-2]
        scraped = sum(1 for path, _ in targets.hits if path == "/ok")
    # What a kill loses is what was buffered: at most the last flush interval's scrapes.
    assert 0 <= scraped - stored[-1] <= 3 * 6, (scraped, stored)


def test_a_full_sqlite_database_keeps_the_buffer_and_names_the_store(tmp_path: Path) -> None:
    # SQLite's own "database or disk is full" (SQLITE_FULL), reached through max_page_count:
    # the same error path as a full disk, without filling the machine's disk.
    db = tmp_path / "tw.db"
    with open_store(f"sqlite:///{db}") as store:
        store.migrations.apply()
        store.write("t", 1_000.0, [Sample("g", (), 1.0)])
        store.flush()
        with sqlite3.connect(db) as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
        store.write("t", 1_001.0, [Sample(f"g{i}", (("k", "v" * 200),), float(i))
                                   for i in range(20_000)])
        engine = raw_engine(store)  # the store's own connections must hit the limit

        from sqlalchemy import event

        @event.listens_for(engine, "connect")
        def _cap(dbapi_conn: sqlite3.Connection, _: object) -> None:
            dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 2}")

        engine.dispose()  # new connections take the cap
        with pytest.raises(StoreError) as err:
            store.flush()
        assert "full" in str(err.value) and str(db.name) in str(err.value)
        assert store.buffered == 20_000  # nothing of the failed flush is lost
        event.remove(engine, "connect", _cap)
        engine.dispose()
        assert store.flush() == 20_000  # room again: all of it is written
    assert _integrity(db) == "ok"
