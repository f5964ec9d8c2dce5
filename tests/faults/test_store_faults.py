"""Store and shutdown faults of issue 19, each through the real component.

- Item 6: a PostgreSQL that stops answering (its postmaster and backends frozen with SIGSTOP:
  the TCP connections stay open and the kernel acknowledges every packet, as with a frozen
  host) neither hangs a store call for ever nor ``tritonwatch serve``'s shutdown, and the
  samples it could not write reach the store after the next start (spill file).
- Item 8: a missed APScheduler run does not hold shutdown, and a maintenance run over a large
  store stops at a batch boundary without corrupting anything.
- Item 10: two ``serve`` on one store: the second exits with one line naming the first and a
  distinct status, on SQLite (a file lock the OS drops with its process) and on PostgreSQL
  (an advisory lock, which a config flag turns off); readers still read while serve runs; the
  demo never shares serve's default store.

Each frozen PostgreSQL is a dedicated server (``running_postgres``), so the session's shared
one is never frozen under other tests; every freeze is undone in a ``finally``.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import event

from tests.fixtures_http import FakeTargets, free_port, serve_fake_targets
from tests.fixtures_pg import running_postgres
from tests.store_sql import raw_engine
from tritonwatch import serve as serve_mod
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.config import DEFAULT_STORE_URL, validate_config
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store, StoreError, engine, maintenance, open_store
from tritonwatch.store.maintenance import WATERMARK_5M, rollup_5m_until
from tritonwatch.store.write import get_meta

# The CLI through the interpreter running the tests: the checkout's code (PYTHONPATH), whether
# or not a `tritonwatch` console script is installed beside it.
CLI = [sys.executable, "-m", "tritonwatch.cli"]


# --- helpers -------------------------------------------------------------------------------


class FrozenPostgres:
    """SIGSTOP / SIGCONT for a running PostgreSQL: the postmaster and all its children."""

    def __init__(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        with open(os.path.join(row[0], "postmaster.pid"), encoding="ascii") as f:
            self.postmaster = int(f.readline())
        self.frozen: list[int] = []

    def _children(self) -> list[int]:
        kids = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat, encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[1]) == self.postmaster:
                kids.append(int(stat.split("/")[2]))
        return kids

    def freeze(self) -> None:
        # The postmaster first, so that it forks no backend that would escape the freeze.
        os.kill(self.postmaster, signal.SIGSTOP)
        self.frozen.append(self.postmaster)
        for pid in self._children():
            os.kill(pid, signal.SIGSTOP)
            self.frozen.append(pid)

    def thaw(self) -> None:
        for pid in reversed(self.frozen):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen.clear()


@contextmanager
def dedicated_postgres() -> Iterator[tuple[str, FrozenPostgres]]:
    """A PostgreSQL server of its own (never the session's), and its freezer; always thawed."""
    with running_postgres() as url:
        freezer = FrozenPostgres(url)
        try:
            yield url, freezer
        finally:
            freezer.thaw()


def start_serve(config: Path, cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:
        return subprocess.Popen([*CLI, "-v", "serve", "--config", str(config)], cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))


def wait_for(url: str, predicate: Callable[[httpx.Response], bool], timeout: float = 60.0,
             proc: subprocess.Popen[bytes] | None = None) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode} before {url} was ready")
        try:
            answer = httpx.get(url, timeout=2)
            last = answer
            if predicate(answer):
                return answer
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{url} never became ready; last answer {last!r}")


def terminate(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> tuple[int, float]:
    """SIGTERM; (exit status, seconds it took).  Killed (and the test failed) past timeout."""
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        raise AssertionError(f"serve ignored SIGTERM for {timeout:.0f} s") from None
    return code, time.monotonic() - start


def ok_hits(targets: FakeTargets) -> int:
    return sum(1 for path, _ in list(targets.hits) if path == "/ok")


def serve_yaml(path: Path, *, url: str, port: int, metrics_url: str, extra: str = "") -> Path:
    path.write_text(
        "targets:\n"
        f"  - {{name: a, metrics_url: '{metrics_url}'}}\n"
        "scrape: {interval: 1s, timeout: 1s}\n"
        f"store: {{url: '{url}', flush_interval: 2s{extra}}}\n"
        "nvml: {enabled: false}\n"
        f"api: {{listen: '127.0.0.1:{port}'}}\n"
    )
    return path


# --- item 6: a PostgreSQL that stops answering -----------------------------------------------


def test_a_store_call_to_a_frozen_postgresql_fails_in_bounded_time_and_keeps_the_samples(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Normal operation (no shutdown to cut anything): the connection guard alone must end the
    # flush.  Its grace is shortened so the test waits seconds, not the production 10 s.
    monkeypatch.setattr(engine, "UNRESPONSIVE_GRACE_S", 1.0)
    with dedicated_postgres() as (url, pg):
        store = open_store(url, timeout_s=2, statement_timeout_s=2)
        try:
            store.migrations.apply()
            store.write("a", 1_700_000_000, [Sample("x", (), 1.0)])
            assert store.flush() == 1  # a pooled connection exists: its ping is what hangs
            store.write("a", 1_700_000_015, [Sample("x", (), 2.0)])
            pg.freeze()
            start = time.monotonic()
            outcome: list[BaseException | int] = []

            def flush() -> None:
                try:
                    outcome.append(store.flush())
                except BaseException as exc:
                    outcome.append(exc)

            # In a thread of its own, so that a flush that never returns fails the test
            # instead of hanging it.
            worker = threading.Thread(target=flush, daemon=True)
            worker.start()
            # statement_timeout + grace for the ping, then a connect timeout for a new
            # connection: about 5 s; the bound is generous for a loaded machine.
            worker.join(60)
            assert outcome, "the flush to a frozen server never returned"
            waited = time.monotonic() - start
            (error,) = outcome
            assert isinstance(error, StoreError), error
            assert store.url_redacted in str(error)
            assert waited < 60, waited
            assert store.buffered == 1  # kept for the next flush
            pg.thaw()
            assert store.flush() == 1
            (series,) = store.read(Query("x", start=1_699_999_999, end=1_700_000_016)).series()
            assert list(series.values) == [1.0, 2.0]
        finally:
            pg.thaw()
            store.close()


def test_serve_ends_within_its_bound_on_a_frozen_postgresql_and_the_next_start_stores_the_rest(
        tmp_path: Path) -> None:
    with dedicated_postgres() as (url, pg), serve_fake_targets() as targets:
        port = free_port()
        config = serve_yaml(tmp_path / "tw.yaml", url=url, port=port,
                            metrics_url=targets.url("/ok"),
                            extra=f", spill_dir: '{tmp_path / 'spill'}'")
        log_path = tmp_path / "serve.log"
        started_at = time.time()
        proc = start_serve(config, tmp_path, log_path)
        try:
            wait_for(f"http://127.0.0.1:{port}/api/v1/targets",
                     lambda r: any(t["up"] for t in r.json()["data"]), proc=proc)
            with open_store(url) as reader:
                # Working normally first: scrapes reach the database.
                deadline = time.monotonic() + 30
                while not reader.read(Query("up", start=0, end=time.time() + 60,
                                            target="a")).series():
                    assert time.monotonic() < deadline, "no sample was ever flushed"
                    time.sleep(0.5)
            frozen_at = time.time()
            pg.freeze()
            time.sleep(5)  # scrapes go on into the buffer; the flush job hangs on the server
            code, took = terminate(proc)
            ended_at = time.time()
            scraped = ok_hits(targets)  # every scrape of this run
        finally:
            if proc.poll() is None:
                proc.kill()
            pg.thaw()
        out = log_path.read_text()
        assert code == 0, out[-4000:]
        # The documented bound (serve.SHUTDOWN_TIMEOUT_S, plus writing a spill file of a few
        # samples), with a few seconds for the interpreter's exit on a loaded machine.
        assert took < serve_mod.SHUTDOWN_TIMEOUT_S + 5, (took, out[-4000:])
        (spilled,) = (tmp_path / "spill").glob("spill-*.jsonl")
        assert f"saved to {spilled}" in out

        # Thawed: the next start stores the spill before its first scrape, then the file goes.
        proc = start_serve(config, tmp_path, log_path)
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz", lambda r: r.status_code == 200,
                     proc=proc)
        finally:
            code, _ = terminate(proc)
        out = log_path.read_text()
        assert code == 0, out[-4000:]
        assert f"from spill file {spilled}" in out
        assert not list((tmp_path / "spill").glob("spill-*"))
        with open_store(url) as store:
            (up,) = store.read(Query("up", start=started_at - 1, end=ended_at, target="a")).series()
        # One `up` sample per scrape of the first run, the frozen seconds included (a scrape
        # cut short by the shutdown itself may lack its sample).
        assert len(up.ts) >= scraped - 1, (len(up.ts), scraped)
        assert len([ts for ts in up.ts if ts >= frozen_at]) >= 3, (frozen_at, up.ts)


# --- item 8: missed runs and long maintenance at shutdown --------------------------------------


def test_sigterm_after_a_missed_run_ends_promptly(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    # The real serve() in this process with its own SIGTERM handler.  The sidecar blocks the
    # event loop for 3 s right after start-up, while store:flush (1 s grace) waits to begin:
    # that run is *missed*, which APScheduler reports as submitted and then missed, with no
    # executed or error event.  Then a real SIGTERM.
    config = validate_config({
        "store": {"url": f"sqlite:///{tmp_path}/tw.db", "flush_interval": "1s"},
        "nvml": {"enabled": False},
        "api": {"listen": f"127.0.0.1:{free_port()}"},
    })
    sent: list[float] = []
    stores: list[Store] = []

    async def block_then_terminate(collector: Any) -> None:
        stores.append(collector.store)
        time.sleep(3)  # blocks the loop: the flush run due at start-up is missed
        await asyncio.sleep(1)  # its (missed) outcome reaches the listeners
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(60)  # cancelled by the shutdown

    with caplog.at_level(logging.INFO):
        asyncio.run(serve_mod.serve(config, sidecar=block_then_terminate))
    took = time.monotonic() - sent[0]
    messages = [r.getMessage() for r in caplog.records]
    assert "job store:flush missed its run time" in messages
    # The drain did not wait for the missed run (it used to wait the whole drain timeout).
    assert not [m for m in messages if "jobs still running" in m], messages
    assert took < serve_mod.JOB_DRAIN_TIMEOUT_S, took
    assert stores[0].maintenance.stopping  # maintenance was told to stop at its next batch


# Rollup over many series: the 5 m rollup of one 6-hour step is one transaction over every
# series, a batch of 500 at a time; 1,100 series make three batches per step.
SERIES = 1_100
SPACING = 150.0  # two samples per series per 5 m bucket
HOURS = 7  # two steps: hours 0-6 and 6-7
# Three hours into a 6-hour span about three days ago, so that the retention cutoff below
# (T0 + 3 h) is a span boundary whatever the time of day: a cutoff inside a span leaves
# only chunks straddling it, so the first DELETE removed nothing and the stopped run had
# done no part (the test failed from 00:00 to 03:00 UTC, and every 6 h after).
T0 = (int(time.time()) // 21600 - 12) * 21600.0 + 3 * 3600.0


def _fill(store: Store) -> None:
    labels = [make_labels({"i": str(i)}) for i in range(SERIES)]
    ts = T0
    k = 0
    while ts < T0 + HOURS * 3600:
        store.write("a", ts, [Sample("x", lab, i + k * 0.5) for i, lab in enumerate(labels)])
        ts += SPACING
        k += 1
    store.flush()


def _expected(agg: str) -> dict[str, list[float]]:
    """Per series label ``i``: the 5 m aggregate of every bucket, computed from the data."""
    per_bucket = round(300 / SPACING)
    buckets = HOURS * 12
    out = {}
    for i in range(SERIES):
        values = [[i + (b * per_bucket + j) * 0.5 for j in range(per_bucket)]
                  for b in range(buckets)]
        out[str(i)] = [{"sum": sum(v), "count": float(len(v)), "min": min(v),
                        "max": max(v)}[agg] for v in values]
    return out


def _rollups(store: Store, agg: Any) -> dict[str, list[float]]:
    # step = 5 m over completed, rolled-up buckets: served from rollup_chunks_5m.
    data = store.read(Query("x", start=T0, end=T0 + HOURS * 3600 - 0.001, step=300,
                            agg=agg)).series()
    return {dict(d.key.labels)["i"]: list(d.values) for d in data}


def _watermark(store: Store) -> int | None:
    with raw_engine(store).connect() as conn:
        value = get_meta(conn, WATERMARK_5M)
    return None if value is None else int(value)


def _stop_after(store: Store, prefix: str, count: int) -> list[int]:
    """Ask ``store`` to stop once ``count`` statements starting with ``prefix`` have run: a
    shutdown arriving in the middle of a maintenance run, at a known point."""
    seen = [0]

    @event.listens_for(raw_engine(store), "after_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(prefix):
            seen[0] += 1
            if seen[0] == count:
                store.maintenance.request_stop()

    return seen


def _stop_after_rollup_writes(store: Store, monkeypatch: pytest.MonkeyPatch,
                              count: int) -> list[int]:
    """Ask ``store`` to stop once the 5 m rollup has written ``count`` batches of series (its
    chunks go in through the driver's executemany or COPY, which statement events miss)."""
    seen = [0]
    real = maintenance._insert_rollups

    def counting(conn: Any, dst: Any, rows: Any, res: int) -> int:
        written = real(conn, dst, rows, res)
        if dst is t.rollup_chunks_5m and written:
            seen[0] += 1
            if seen[0] == count:
                store.maintenance.request_stop()
        return written

    monkeypatch.setattr(maintenance, "_insert_rollups", counting)
    return seen


def test_a_maintenance_run_over_a_large_store_stops_at_a_batch_boundary_and_resumes_intact(
        store_url: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(store_url)
    store.migrations.apply()
    try:
        _fill(store)
        # Stop during the second 6-hour step of the 5 m rollup, after its first batch of series.
        seen = _stop_after_rollup_writes(store, monkeypatch, 4)
        now = T0 + HOURS * 3600 + 3600  # every bucket complete
        with caplog.at_level(logging.INFO, logger="tritonwatch.store"):
            store.maintenance.rollup(now)
        assert seen[0] == 4  # it stopped at the next boundary: no further batch started
        assert any("stopped at a batch boundary" in r.getMessage() for r in caplog.records)
        # The first step is committed, the second rolled back whole (its watermark with it).
        assert _watermark(store) == (T0 + 6 * 3600) * 1000
        partial = _rollups(store, "sum")
        assert all(len(v) == HOURS * 12 for v in partial.values())  # raw fills in after it
    finally:
        store.close()

    # The next run (a new process: the stop flag is gone) resumes and completes; rollups and
    # raw samples are exactly what the data says.
    store = open_store(store_url)
    try:
        store.maintenance.rollup(now)
        # Done up to the last complete hour whose log was moved (before `now`), past the data.
        assert _watermark(store) == rollup_5m_until(round(now * 1000))
        for agg in ("sum", "count", "min", "max"):
            assert _rollups(store, agg) == _expected(agg), agg
        assert store.count_samples() == SERIES * HOURS * round(3600 / SPACING)
        (first,) = store.read(Query("x", start=T0, end=now, match={"i": "7"})).series()
        assert list(first.values) == [7 + k * 0.5 for k in range(HOURS * round(3600 / SPACING))]

        # Retention stopped after its first batch of deletes keeps everything it did not
        # reach, and the next run finishes the job; the rollups keep every bucket.
        seen = _stop_after(store, "DELETE FROM SAMPLE_CHUNKS", 1)
        cutoff = T0 + 3 * 3600
        retention = {"raw_s": now + 86400 - cutoff, "rollup_5m_s": 1e9, "rollup_1h_s": 1e9}
        store.maintenance.apply_retention(now + 86400, **retention)
        assert seen[0] == 1
        kept = store.read(Query("x", start=T0, end=now)).series()
        assert len(kept) == SERIES
        assert min(len(s.ts) for s in kept) < max(len(s.ts) for s in kept)  # part done
        assert all(s.ts[-1] == T0 + HOURS * 3600 - SPACING for s in kept)  # none past cutoff
    finally:
        store.close()
    store = open_store(store_url)
    try:
        store.maintenance.apply_retention(now + 86400, **retention)
        kept = store.read(Query("x", start=T0, end=now)).series()
        assert {len(s.ts) for s in kept} == {round((T0 + HOURS * 3600 - cutoff) / SPACING)}
        assert _rollups(store, "sum") == _expected("sum")
    finally:
        store.close()


# --- item 10: one writer per store ----------------------------------------------------------


def refused(config: Path, cwd: Path) -> list[str]:
    """Run a second serve; it must exit at once with the distinct status.  Its stderr lines."""
    proc = subprocess.run([*CLI, "serve", "--config", str(config)], cwd=cwd, timeout=60,
                          capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == serve_mod.EXIT_STORE_IN_USE, (proc.returncode, proc.stderr)
    return proc.stderr.strip().splitlines()


def test_a_second_serve_on_one_sqlite_file_exits_naming_the_first(tmp_path: Path) -> None:
    db = tmp_path / "data" / "tw.db"
    url = f"sqlite:///{db}"
    with serve_fake_targets() as targets:
        port = free_port()
        first = serve_yaml(tmp_path / "a.yaml", url=url, port=port,
                           metrics_url=targets.url("/ok"))
        second = serve_yaml(tmp_path / "b.yaml", url=url, port=free_port(),
                            metrics_url=targets.url("/ok"))
        proc = start_serve(first, tmp_path, tmp_path / "a.log")
        try:
            wait_for(f"http://127.0.0.1:{port}/api/v1/targets",
                     lambda r: any(t["up"] for t in r.json()["data"]), proc=proc)
            (line,) = refused(second, tmp_path)
            assert str(db) in line
            assert f"pid {proc.pid} on {socket.gethostname()}" in line
            # Readers are not locked out: the dashboard's read-only connection, and the
            # store's query layer, read while serve holds the lock.
            time.sleep(2.5)  # a flush (every 2 s) has written something
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:
                assert ro.execute("SELECT count(*) FROM series").fetchone()[0] > 0
            with open_store(url) as reader:
                assert "up" in {k.name for k in reader.series(Query(target="a"))}
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        finally:
            # A crash: no clean release of anything.
            proc.kill()
            proc.wait(timeout=30)
        # The OS dropped the dead process's lock: the next serve starts.
        port = free_port()
        second = serve_yaml(tmp_path / "b.yaml", url=url, port=port,
                            metrics_url=targets.url("/ok"))
        proc = start_serve(second, tmp_path, tmp_path / "b.log")
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz", lambda r: r.status_code == 200,
                     proc=proc)
        finally:
            code, _ = terminate(proc)
        assert code == 0, (tmp_path / "b.log").read_text()[-3000:]


def test_a_second_serve_on_one_postgresql_database_exits_unless_the_lock_is_turned_off(
        postgres_db_url: str, tmp_path: Path) -> None:
    with serve_fake_targets() as targets:
        port = free_port()
        ok = targets.url("/ok")
        first = serve_yaml(tmp_path / "a.yaml", url=postgres_db_url, port=port, metrics_url=ok)
        proc = start_serve(first, tmp_path, tmp_path / "a.log")
        others: list[subprocess.Popen[bytes]] = []
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz", lambda r: r.status_code == 200,
                     proc=proc)
            second = serve_yaml(tmp_path / "b.yaml", url=postgres_db_url, port=free_port(),
                                metrics_url=ok)
            (line,) = refused(second, tmp_path)
            assert f"'tritonwatch serve pid={proc.pid} host=" in line
            assert "postgres@127.0.0.1" in line and "already in use" in line
            # Deliberate sharding: store.writer_lock: false starts beside the first.
            sharded_port = free_port()
            sharded = serve_yaml(tmp_path / "c.yaml", url=postgres_db_url, port=sharded_port,
                                 metrics_url=ok, extra=", writer_lock: false")
            others.append(start_serve(sharded, tmp_path, tmp_path / "c.log"))
            wait_for(f"http://127.0.0.1:{sharded_port}/healthz",
                     lambda r: r.status_code == 200, proc=others[0])
        finally:
            codes = [terminate(p)[0] for p in [proc, *others]]
        assert codes == [0, 0], codes


def test_the_demo_and_the_quick_start_do_not_share_a_database_by_default() -> None:
    from tritonwatch.cli import build_parser

    demo = build_parser().parse_args(["demo"])
    demo_db = (Path(demo.data_dir) / "tritonwatch.db").resolve()
    # The quick start's config names no store: serve uses the default URL.
    serve_db = Path(DEFAULT_STORE_URL.removeprefix("sqlite:///")).resolve()
    assert demo_db != serve_db
    assert demo_db.parent != serve_db.parent  # nor a spill directory
