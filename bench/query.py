"""Query side: 7 days of 15 s data for 50 series, answered from rollups; maintenance vs ingest.

    .venv/bin/python -m bench.query [--backend sqlite|postgres|both] [--repeat 15]

Per backend (SQLite in a temp file; a throwaway durable PostgreSQL 15):

1. **Queries.**  50 series (``sli:request_rate`` of 50 models on one target) get 7 days of
   15 s samples (40,320 each, 2.0 M rows) through ``Store.write``/``flush``;
   ``Store.maintenance.rollup`` builds the 5 m and 1 h rollups.  Then each dashboard / report
   query below runs ``--repeat`` times (after one untimed run) and its p50 and max latency
   are printed; the same 7-day panel read from raw samples (a step that is no multiple of
   5 min) is timed for reference.
2. **Maintenance does not stall ingestion.**  A ``Collector`` scrapes 4 simulated targets
   (``bench.common``, ~2,900 series each) every second, flushing every 5 s as ``serve`` does,
   first for a baseline period, then while the store's rollup and retention run in a worker
   thread exactly as the ``store:maintain`` job runs them (here: the first rollup of the whole
   7 days after the watermarks were reset, and a retention of 2 days of raw data, deleting
   5 days of it).  Printed: scrape latency (``Collector.scrape`` awaited, p50 / p99 / max),
   the event loop's largest lag (a 10 ms ticker), and flush times, for both periods.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.common import Fleet, simulated_fleet
from bench.ingest import postgres_backend
from tests.store_sql import raw_engine
from tritonwatch.collector.jobs import Collector
from tritonwatch.schemas.config import validate_config
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store
from tritonwatch.store.engine import transaction
from tritonwatch.store.maintenance import WATERMARK_1H, WATERMARK_5M

DAY = 86_400.0
STEP = 15.0
SERIES = 50
NAME = "sli:request_rate"
TARGET = "triton-report"


@contextmanager
def store_at(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tw-query-") as tmp:
            yield f"sqlite:///{tmp}/tw.db"
    else:
        with postgres_backend(durable=True) as pg:
            yield pg.new_database("tw_bench_query")


#: The 30-day panel: 200 series (a fleet's models), their history sampled every 5 min (the
#: rollups a 15 s history leaves are the same rows; loading 35 M raw samples would take an hour
#: here), the last two hours every 15 s.
SERIES_30D = 200
NAME_30D = "sli:inference_rate"
TARGET_30D = "triton-fleet"


def load_30d(store: Store, now: float) -> int:
    """30 days of the 200 series; returns samples written."""
    rng = np.random.default_rng(2)
    names = [NAME_30D] * SERIES_30D
    labels = [make_labels({"model": f"model_{i:03d}", "version": "1"})
              for i in range(SERIES_30D)]
    level = rng.uniform(1, 300, SERIES_30D)
    start = now - 30 * DAY
    stamps = [start + k * 300.0 for k in range(int((30 * DAY - 7200) / 300))]
    stamps += [now - 7200 + k * STEP for k in range(int(7200 / STEP))]
    for k, ts in enumerate(stamps):
        level = np.maximum(0.0, level + rng.normal(0, 1, SERIES_30D))
        store.write_columns(TARGET_30D, ts, names, labels, level.copy())
        if k % 500 == 499:
            store.flush()
    store.flush()
    return len(stamps) * SERIES_30D


def load(store: Store, now: float) -> tuple[int, float]:
    """7 days of 15 s samples for the 50 series; returns (rows, seconds)."""
    rng = random.Random(1)
    labels = [make_labels({"model": f"model_{i:02d}", "version": "1"}) for i in range(SERIES)]
    start = now - 7 * DAY
    steps = int(7 * DAY / STEP)
    level = [rng.uniform(1, 300) for _ in range(SERIES)]
    t0 = time.perf_counter()
    for k in range(steps):
        ts = start + k * STEP
        for i in range(SERIES):
            level[i] = max(0.0, level[i] + rng.gauss(0, 1))
        store.write(TARGET, ts, [Sample(NAME, labels[i], level[i]) for i in range(SERIES)])
        if k % 2000 == 1999:
            store.flush()
    store.flush()
    return steps * SERIES, time.perf_counter() - t0


@dataclass
class Timing:
    what: str
    source: str
    points: int
    times: list[float] = field(default_factory=list)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.times) * 1000


def queries(store: Store, now: float, repeat: int) -> list[Timing]:
    week, day = now - 7 * DAY, now - DAY
    cases: list[tuple[str, str, Callable[[], Any]]] = [
        ("dashboard 7 d, 1 h avg", "rollups",
         lambda: store.read(Query(NAME, start=week, end=now, step=3600, agg="avg",
                                  target=TARGET)).series()),
        ("dashboard 7 d, 1 h max", "rollups",
         lambda: store.read(Query(NAME, start=week, end=now, step=3600, agg="max",
                                  target=TARGET)).series()),
        ("dashboard 24 h, 5 m avg", "rollups",
         lambda: store.read(Query(NAME, start=day, end=now, step=300, agg="avg",
                                  target=TARGET)).series()),
        ("report 7 d, 1 d avg", "rollups",
         lambda: store.read(Query(NAME, start=week, end=now, step=DAY, agg="avg",
                                  target=TARGET)).series()),
        ("report 7 d, 1 d last", "rollups",
         lambda: store.read(Query(NAME, start=week, end=now, step=DAY, agg="last",
                                  target=TARGET)).series()),
        ("dashboard 7 d, 1 model", "rollups",
         lambda: store.read(Query(NAME, start=week, end=now, step=3600, agg="avg",
                                  match={"model": "model_07"})).series()),
        ("dashboard 30 d x 200, 1 h", "rollups",
         lambda: store.read(Query(NAME_30D, start=now - 30 * DAY, end=now, step=3600, agg="avg",
                                  target=TARGET_30D)).series()),
        ("REFERENCE 7 d from raw", "raw samples",
         lambda: store.read(Query(NAME, start=week, end=now, step=3599, agg="avg",
                                  target=TARGET)).series()),
    ]
    out = []
    for what, source, fn in cases:
        result = fn()  # untimed: connection pool, caches
        points = sum(len(d.ts) for d in result)
        timing = Timing(what, source, points)
        for _ in range(repeat if source == "rollups" else max(3, repeat // 5)):
            t0 = time.perf_counter()
            fn()
            timing.times.append(time.perf_counter() - t0)
        out.append(timing)
    return out


@dataclass
class Period:
    name: str
    scrape_s: list[float] = field(default_factory=list)
    flush_s: list[float] = field(default_factory=list)
    loop_lag_s: float = 0.0
    seconds: float = 0.0

    def pct(self, p: float) -> float:
        xs = sorted(self.scrape_s)
        return xs[min(len(xs) - 1, math.ceil(p * len(xs)) - 1)] * 1000 if xs else math.nan


async def ingest_during(store: Store, fleet: Fleet, targets: int, *, baseline_s: float,
                        maintenance: Callable[[], None]) -> tuple[Period, Period, float]:
    config = validate_config({
        "targets": [{"name": f"triton-{i}", "metrics_url": fleet.url(i)} for i in range(targets)],
        "scrape": {"interval": "1s", "timeout": "1s"},
        "store": {"url": "sqlite:///unused.db"},
    }, "<bench>")
    collector = Collector(config, store)
    names = list(collector.targets)
    period = Period("baseline")
    done = threading.Event()
    maint_s = [0.0]

    async def ticker() -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            period.loop_lag_s = max(period.loop_lag_s, time.perf_counter() - t0 - 0.01)

    async def one(name: str) -> None:
        t0 = time.perf_counter()
        await collector.scrape(name)
        period.scrape_s.append(time.perf_counter() - t0)

    async def flusher() -> None:
        while True:
            await asyncio.sleep(5)
            t0 = time.perf_counter()
            await collector.flush()
            period.flush_s.append(time.perf_counter() - t0)

    def run_maintenance() -> None:
        t0 = time.perf_counter()
        try:
            maintenance()
        finally:
            maint_s[0] = time.perf_counter() - t0
            done.set()

    tasks = [asyncio.create_task(ticker()), asyncio.create_task(flusher())]
    try:
        for _ in range(3):  # warm-up: series, rate baselines
            await asyncio.gather(*(one(n) for n in names))
            await asyncio.sleep(1)
        period.scrape_s.clear()
        period.loop_lag_s = 0.0
        start = time.perf_counter()
        while time.perf_counter() - start < baseline_s:
            tick = time.perf_counter()
            await asyncio.gather(*(one(n) for n in names))
            await asyncio.sleep(max(0.0, 1 - (time.perf_counter() - tick)))
        period.seconds = time.perf_counter() - start
        base, period = period, Period("rollup + retention running")
        start = time.perf_counter()
        worker = asyncio.create_task(asyncio.to_thread(run_maintenance))
        while not done.is_set() or time.perf_counter() - start < 10:
            tick = time.perf_counter()
            await asyncio.gather(*(one(n) for n in names))
            await asyncio.sleep(max(0.0, 1 - (time.perf_counter() - tick)))
        await worker
        period.seconds = time.perf_counter() - start
    finally:
        for task in tasks:
            task.cancel()
        await collector.close()
    return base, period, maint_s[0]


def reset_rollups(store: Store) -> None:
    with transaction(raw_engine(store), write=True) as conn:  # bench only: start rollups afresh
        for table in ("rollup_chunks_5m", "rollup_chunks_1h"):
            conn.exec_driver_sql(f"DELETE FROM {table}")
        conn.exec_driver_sql(
            f"DELETE FROM meta WHERE key IN ('{WATERMARK_5M}', '{WATERMARK_1H}')"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--targets", type=int, default=4, help="scraped during maintenance")
    parser.add_argument("--baseline", type=float, default=15.0, help="seconds without jobs")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    now = math.floor(time.time() / 3600) * 3600 + 1800.0  # mid-hour, like any dashboard load
    print(f"Query benchmark: {SERIES} series x 7 days of {STEP:g} s samples "
          f"({int(7 * DAY / STEP) * SERIES:,} rows); {args.repeat} timed runs per query")
    table: list[tuple[str, list[Timing], str, tuple[Period, Period, float]]] = []
    with simulated_fleet(args.targets) as fleet:
        for backend in backends:
            with store_at(backend) as url:
                store = Store(url)
                store.migrations.apply()
                rows, load_s = load(store, now)
                rows_30d = load_30d(store, now)
                t0 = time.perf_counter()
                store.maintenance.rollup(now)
                roll_s = time.perf_counter() - t0
                info = (f"loaded {rows:,} rows in {load_s:.1f} s (and {rows_30d:,} for the "
                        f"30-day panel); first rollup {roll_s:.1f} s")
                timings = queries(store, now, args.repeat)
                reset_rollups(store)

                def maintenance(store: Store = store) -> None:
                    store.maintenance.rollup(now)
                    store.maintenance.apply_retention(now, raw_s=2 * DAY, rollup_5m_s=90 * DAY,
                                                      rollup_1h_s=400 * DAY)

                periods = asyncio.run(ingest_during(
                    store, fleet, args.targets, baseline_s=args.baseline,
                    maintenance=maintenance,
                ))
                store.close()
                table.append((backend, timings, info, periods))

    for backend, timings, info, (base, busy, maint_s) in table:
        print()
        print(f"[{backend}] {info}")
        head = f"  {'query':<26} {'source':<12} {'points':>7} {'p50 ms':>8} {'max ms':>8}"
        print(head)
        print("  " + "-" * (len(head) - 2))
        for t in timings:
            print(f"  {t.what:<26} {t.source:<12} {t.points:>7,} {t.p50_ms:>8.1f} "
                  f"{max(t.times) * 1000:>8.1f}")
        print(f"  ingest of {args.targets} targets x {fleet.series:,} series every 1 s; "
              f"maintenance (first rollup of 7 d + retention of 5 d of raw) took {maint_s:.1f} s")
        print(f"  {'period':<28} {'scrapes':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
              f"{'loop lag ms':>11} {'flush max s':>11}")
        for p in (base, busy):
            print(f"  {p.name:<28} {len(p.scrape_s):>7} {p.pct(0.5):>7.1f} {p.pct(0.99):>7.1f} "
                  f"{p.pct(1.0):>7.1f} {p.loop_lag_s * 1000:>11.1f} "
                  f"{max(p.flush_s, default=0.0):>11.2f}")
    print()
    print("target: 7-day query for 50 series < 150 ms p50 on SQLite and PostgreSQL "
          "(reference: raw scans took 0.5 s on SQLite, 2 s on PostgreSQL); 30-day panel of "
          "200 series <= 150 ms p50 (issue 22)")


if __name__ == "__main__":
    main()
