"""`tritonwatch serve` as a process: API up, scraping a real Triton, SIGTERM flushes the buffer."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures_http import free_port
from tests.fixtures_rig import serve_config
from tritonwatch.store import Query, open_store

EXE = Path(sys.executable).with_name("tritonwatch")


def start_serve(args, cwd):
    return subprocess.Popen([str(EXE), "serve", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))


def wait_for(url, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=2)
            if predicate(last):
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} never became ready; last answer {last}")


def scrape_ts(answer):
    """When the rig's metrics were last scraped, by /api/v1/targets (0 if not yet)."""
    return max((t["ts"] for t in answer.json()["data"]
                if t["target"] == "rig" and t["source"] == "metrics"), default=0.0)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out


def test_serve_without_config_starts_empty_on_defaults(tmp_path):
    port = free_port()
    proc = start_serve(["--listen", f"127.0.0.1:{port}"], tmp_path)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", lambda r: r.status_code == 200)
        # No targets; at most the local NVML source, which on a host without a GPU says why.
        health = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets").json()["data"]
        assert all(h["source"] == "nvml" for h in health)
        assert all(h["up"] or h["error"].startswith("NVML unavailable") for h in health)
    finally:
        code, out = stop(proc)
    assert code == 0, out
    assert (tmp_path / "tritonwatch-data" / "tritonwatch.db").exists()


@pytest.mark.triton
def test_serve_scrapes_the_rig_and_flushes_on_sigterm(triton_rig, rig_load, tmp_path):
    rig_load(concurrency=4)
    port = free_port()
    db = tmp_path / "tw.db"
    config = tmp_path / "tw.yaml"
    # A flush interval far beyond the test: only the shutdown flush can write the samples.
    config.write_text(serve_config(triton_rig, db, "1h"))
    proc = start_serve(["--config", str(config), "--listen", f"127.0.0.1:{port}"], tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        targets = wait_for(f"{base}/api/v1/targets",
                           lambda r: len([t for t in r.json()["data"] if t["up"]]) == 2)
        sources = {t["source"] for t in targets.json()["data"] if t["target"] == "rig"}
        assert sources == {"metrics", "api"}
        first = scrape_ts(targets)
        # A few more scrapes, so rates exist: waited for (a fixed 3 s could hold fewer than
        # two rates on a busy machine), within wait_for's bound.
        wait_for(f"{base}/api/v1/targets", lambda r: scrape_ts(r) >= first + 2.9)
        wait_for(f"{base}/metrics", lambda r: (
            'tritonwatch_target_up{source="metrics",target="rig"} 1.0' in r.text
        ))
    finally:
        code, out = stop(proc)
    assert code == 0, out
    with open_store(f"sqlite:///{db}") as store:
        names = {k.name for k in store.series(Query(target="rig"))}
        assert {"nv_inference_count", "sli:request_rate", "sli:batch_fill_rate"} <= names
        (rate,) = store.read(Query("sli:request_rate", start=0, end=time.time(),
                                   match={"model": "batcher"})).series()
        assert len(rate.values) >= 2 and min(rate.values) > 0, rate


def test_serve_spills_what_the_final_flush_could_not_write_and_stores_it_at_the_next_start(
        tmp_path, monkeypatch, caplog):
    # The database goes away just before shutdown: the final flush gives up after its attempts,
    # closing the store must not flush (and fail) once more and raise out of serve(), the
    # samples go to a spill file (one warning line naming it), the signal handlers serve()
    # installed must be gone afterwards, and the next start writes the spilled samples.
    import asyncio

    from tritonwatch import serve as serve_mod
    from tritonwatch.schemas.config import validate_config
    from tritonwatch.schemas.samples import Sample
    from tritonwatch.store import StoreError

    monkeypatch.setattr(serve_mod, "FINAL_FLUSH_DELAY_S", 0.0, raising=False)
    config = validate_config({
        "store": {"url": f"sqlite:///{tmp_path}/tw.db"},
        "nvml": {"enabled": False},
        "api": {"listen": f"127.0.0.1:{free_port()}"},
    })
    calls = []
    stop = asyncio.Event()
    url = []
    ts = time.time()

    async def database_goes_away(collector):
        await asyncio.sleep(0.5)  # after the jobs' first runs (a flush of nothing)
        store = collector.store
        url.append(store.url_redacted)

        def refuse(chunks):
            calls.append(len(chunks))
            raise StoreError(f"flush on {store.url_redacted} failed: db down",
                             url=store.url_redacted)

        monkeypatch.setattr(store._writer, "write", refuse)
        store.write("t", ts, [Sample("x", (), 1.0), Sample("y", (), 2.0)])
        stop.set()

    async def main():
        await serve_mod.serve(config, sidecar=database_goes_away, stop=stop)
        loop = asyncio.get_running_loop()
        # remove_signal_handler() is False when no handler is installed for the signal.
        return [loop.remove_signal_handler(sig) for sig in (signal.SIGINT, signal.SIGTERM)]

    with caplog.at_level("INFO", logger="tritonwatch.serve"):
        still_installed = asyncio.run(main())
    assert still_installed == [False, False]
    assert len(calls) == serve_mod.FINAL_FLUSH_ATTEMPTS  # no extra flush on close
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    (spill_file,) = (tmp_path / "spill").glob("spill-*.jsonl")
    kept = [r.getMessage() for r in caplog.records if "saved to" in r.getMessage()]
    assert len(kept) == 1, kept
    assert "2 samples" in kept[0] and url[0] in kept[0] and str(spill_file) in kept[0]

    # The next start stores them before anything else, and the file goes.
    store = serve_mod.prepare_store(config)
    try:
        assert [list(p.values) for p in store.read(Query("x", start=ts - 1,
                                                         end=ts + 1)).series()] == [[1.0]]
        assert [list(p.values) for p in store.read(Query("y", start=ts - 1,
                                                         end=ts + 1)).series()] == [[2.0]]
    finally:
        store.close()
    assert not list((tmp_path / "spill").glob("spill-*"))


def test_running_jobs_count_a_missed_run_as_ended():
    # A real scheduler: a run due 10 s ago with 1 s of grace is submitted, then missed, and
    # no executed or error event ever follows; a run that raises, and one that works, end too.
    import asyncio
    from datetime import UTC, datetime, timedelta

    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from tritonwatch.serve import _RunningJobs

    async def ok():
        await asyncio.sleep(0.2)

    async def boom():
        raise RuntimeError("boom")

    async def main():
        scheduler = AsyncIOScheduler(timezone="UTC")
        now = datetime.now(UTC)
        for job_id, func, when in (("late", ok, now - timedelta(seconds=10)),
                                   ("fails", boom, now), ("works", ok, now)):
            scheduler.add_job(func, "interval", seconds=3600, id=job_id, next_run_time=when,
                              misfire_grace_time=1, coalesce=True, max_instances=1)
        running = _RunningJobs(scheduler)
        scheduler.start()
        await asyncio.sleep(0.05)
        seen = dict(running.running)
        done = await running.wait(10)
        scheduler.shutdown(wait=False)
        return seen, done, running.running

    seen, done, left = asyncio.run(main())
    assert "works" in seen  # it was counted while it ran
    assert done and left == {}


def test_close_store_ends_by_its_deadline_and_spills_while_sqlite_stays_locked(
        tmp_path, monkeypatch, caplog):
    # Another program holds SQLite's write lock past the shutdown deadline (a real lock): the
    # final flush retries until the deadline, less the store's timeout that a busy wait in
    # progress may still take, then the samples go to a spill file.
    import sqlite3

    from tritonwatch import serve as serve_mod
    from tritonwatch.schemas.samples import Sample
    from tritonwatch.store import spill

    monkeypatch.setattr(serve_mod, "STORE_TIMEOUT_S", 1.0)
    db = tmp_path / "tw.db"
    store = open_store(f"sqlite:///{db}", timeout_s=1.0)
    store.migrations.apply()
    store.write("t", 1_700_000_000, [Sample("x", (), 1.0)])
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        with caplog.at_level("INFO", logger="tritonwatch.serve"):
            serve_mod.close_store(store, deadline=start + 4.0, spill_to=tmp_path / "spill")
        took = time.monotonic() - start
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert took < 4.0 + 2.0, took  # the deadline, and a generous second or two of slack
    attempts = [r for r in caplog.records if "final flush failed (attempt" in r.getMessage()]
    assert len(attempts) >= 2  # it did retry
    (path,) = (tmp_path / "spill").glob("spill-*.jsonl")
    _, pending = spill.read(path)
    assert pending.samples == 1


@pytest.mark.parametrize(("raw", "ttl"), [("15d", 3600.0), ("50m", 1500.0)])
def test_serve_keeps_series_ids_as_long_as_its_raw_retention_allows(tmp_path, raw, ttl):
    # The store serve opens re-resolves its series (marking them in use for retention) within
    # the configured raw retention, and no more often than it must.
    from tritonwatch import serve as serve_mod
    from tritonwatch.schemas.config import validate_config

    config = validate_config({
        "store": {"url": f"sqlite:///{tmp_path}/tw.db", "retention": {"raw": raw}},
    })
    store = serve_mod.prepare_store(config)
    try:
        assert store.series_ttl_s == ttl
    finally:
        store.close()
