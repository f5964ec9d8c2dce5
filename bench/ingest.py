"""End-to-end ingest benchmark: scrape → parse → derive → store, against a real HTTP target.

    .venv/bin/python -m bench.ingest [--targets N] [--scrapes K] [--backend sqlite|postgres|both]

A simulated Triton fleet (``bench.common.simulated_fleet``: ~2,900 series, ~390 KB per scrape,
20 models, 8 GPUs, TRT-LLM families, series listed in the same order every scrape as Triton
does, counters growing with every scrape) runs in a **separate process**; its CPU is reported
for information and excluded from every figure.

Per backend (SQLite in a temp file; a throwaway PostgreSQL 15 started with
``tests.fixtures_pg.running_postgres``), two measurements, each on a fresh database and the
same payload sequence (the server's counters are reset between them):

1. **End to end**: ``collector.jobs.Collector.scrape(name)`` for all targets concurrently per
   round (one round = one scrape interval, 15 s of simulated clock), then
   ``Collector.flush()``; two warm-up rounds (series creation, rate baselines) are not timed.
   Figures: samples ingested (accepted by ``Store.write``: raw without NaN, derived SLIs and
   the three ``up`` samples), wall time, CPU of this process (all threads, resource.getrusage)
   and of the PostgreSQL server (postmaster plus children, from /proc/<pid>/stat).
2. **Per stage**: the same path taken apart and timed stage by stage, one target at a time:
   fetch (httpx, collector.scrape.fetch_metrics), parse (collector.shape.parse_columns: the
   payload as a value array against the target's shape), derive (Deriver.derive_columns: the
   value array through the deriver's per-source plans), store write (Store.write_columns,
   buffering), health
   (Store.write_health, which Collector.scrape does once per scrape) and flush (Store.flush,
   once per round).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from bench.common import Fleet, fleet_models, proc_stat, process_tree_cpu, simulated_fleet
from tritonwatch.collector.derive import Deriver
from tritonwatch.collector.jobs import Collector
from tritonwatch.collector.scrape import fetch_metrics, make_client
from tritonwatch.collector.shape import Shape, parse_columns
from tritonwatch.memory import tune_gc
from tritonwatch.schemas.config import Config, validate_config
from tritonwatch.schemas.samples import Labels, TargetHealth
from tritonwatch.schemas.triton import ModelConfigInfo
from tritonwatch.store import Store, open_store

T0 = 1_700_000_000.0
INTERVAL_S = 15.0
WARMUP_ROUNDS = 2
MAX_BATCH_SIZE = 8  # fill-rate denominator configured for every model (as max_batch_size)
STAGES = ("fetch", "parse", "derive", "store write", "health", "flush")


# --- CPU accounting ---------------------------------------------------------------------------


def own_cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, all threads, children excluded."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


# --- backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    new_database: Callable[[str], str]  # phase name → store URL of a fresh, empty database
    count_rows: Callable[[str], int]
    server_pid: int | None = None  # the PostgreSQL postmaster

    def server_cpu(self) -> float:
        return process_tree_cpu(self.server_pid) if self.server_pid else 0.0


def count_samples(url: str) -> int:
    """Samples stored (they are stored in per-series chunks: counted by the store)."""
    with open_store(url) as store:
        return store.count_samples()


@contextmanager
def sqlite_backend() -> Iterator[Backend]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-") as tmp:

        def new_database(phase: str) -> str:
            return f"sqlite:///{tmp}/{phase}.db"

        yield Backend("sqlite", new_database, count_samples)


@contextmanager
def postgres_backend(durable: bool) -> Iterator[Backend]:
    from tests.fixtures_pg import running_postgres

    with running_postgres(durable=durable) as base_url:
        admin = base_url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            backend_pid = int(row[0])
            info = proc_stat(backend_pid)  # a backend's parent is the postmaster
            assert info is not None
            postmaster = info[0]

        def new_database(phase: str) -> str:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(phase)))
            return base_url.rsplit("/", 1)[0] + "/" + phase

        yield Backend("postgres", new_database, count_samples, postmaster)


class CountingStore(Store):
    """A Store that counts the samples Store.write / write_columns accepted (NaN excluded)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.accepted = 0
        self._count_lock = threading.Lock()

    def write_columns(
        self, target: str, ts: float, names: list[str], labels: list[Labels], values: Any
    ) -> int:
        n = super().write_columns(target, ts, names, labels, values)
        with self._count_lock:
            self.accepted += n
        return n


# --- measurements -----------------------------------------------------------------------------


def fleet_config(fleet: Fleet, targets: int, url: str, models: list[str]) -> Config:
    return validate_config(
        {
            "targets": [
                {
                    "name": f"triton-{i}",
                    "metrics_url": fleet.url(i),
                    "max_batch_size": dict.fromkeys(models, MAX_BATCH_SIZE),
                }
                for i in range(targets)
            ],
            "scrape": {"interval": "15s", "timeout": "10s"},
            "store": {"url": url},
        },
        "<bench>",
    )


def fleet_store(
    backend: Backend, database: str, fleet: Fleet, targets: int, models: list[str]
) -> tuple[str, CountingStore, Config]:
    """A new database with the schema, a CountingStore on it, and the fleet's config for it."""
    url = backend.new_database(database)
    store = CountingStore(url)
    store.migrations.apply()
    return url, store, fleet_config(fleet, targets, url, models)


@dataclass
class EndToEnd:
    backend: str
    scrapes: int
    samples: int  # accepted by Store.write in the timed rounds
    raw: int  # exposed samples scraped (NaN included)
    derived: int
    flushed: int  # rows Store.flush wrote in the timed rounds
    rows_in_db: int  # all rows at the end, warm-up included
    wall_s: float
    client_user_s: float
    client_sys_s: float
    server_s: float

    @property
    def client_s(self) -> float:
        return self.client_user_s + self.client_sys_s


async def _end_to_end(
    backend: Backend, fleet: Fleet, targets: int, scrapes: int, models: list[str]
) -> EndToEnd:
    url, store, config = fleet_store(backend, "tw_bench_e2e", fleet, targets, models)
    now = [T0]
    collector = Collector(config, store, clock=lambda: now[0])
    names = list(collector.targets)

    async def round_(r: int) -> list[TargetHealth]:
        now[0] = T0 + INTERVAL_S * r
        healths = await asyncio.gather(*(collector.scrape(n) for n in names))
        for h in healths:
            if not h.up:
                raise RuntimeError(f"scrape of {h.target} failed: {h.error}")
        return list(healths)

    try:
        for r in range(WARMUP_ROUNDS):
            await round_(r)
            await collector.flush()
        accepted0, raw, derived, flushed = store.accepted, 0, 0, 0
        user0, sys0 = own_cpu()
        server0 = backend.server_cpu()
        start = time.perf_counter()
        for r in range(WARMUP_ROUNDS, WARMUP_ROUNDS + scrapes):
            healths = await round_(r)
            raw += sum(h.samples for h in healths)
            derived += sum(len(collector.targets[n].latest) for n in names)
            flushed += await collector.flush()
        wall = time.perf_counter() - start
        user1, sys1 = own_cpu()
        server1 = backend.server_cpu()
    finally:
        await collector.close()
        store.close()
    return EndToEnd(
        backend.name, targets * scrapes, store.accepted - accepted0, raw, derived, flushed,
        backend.count_rows(url), wall, user1 - user0, sys1 - sys0, server1 - server0,
    )


@dataclass
class Stage:
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this thread (everything in this loop runs on it)
    server_s: float = 0.0
    calls: int = 0


@dataclass
class Stages:
    backend: str
    scrapes: int
    samples: int
    stages: dict[str, Stage] = field(default_factory=lambda: {s: Stage() for s in STAGES})


class _Timer:
    def __init__(self, stages: Stages, backend: Backend, timed: bool) -> None:
        self.stages, self.backend, self.timed = stages, backend, timed

    @contextmanager
    def __call__(self, name: str, server: bool = False) -> Iterator[None]:
        s0 = self.backend.server_cpu() if server and self.timed else 0.0
        c0, w0 = time.thread_time(), time.perf_counter()
        yield
        w1, c1 = time.perf_counter(), time.thread_time()
        if self.timed:
            stage = self.stages.stages[name]
            stage.wall_s += w1 - w0
            stage.cpu_s += c1 - c0
            stage.calls += 1
            if server:
                stage.server_s += self.backend.server_cpu() - s0


async def _per_stage(
    backend: Backend, fleet: Fleet, targets: int, scrapes: int, models: list[str]
) -> Stages:
    _, store, config = fleet_store(backend, "tw_bench_stages", fleet, targets, models)
    client = make_client()
    derivers = [Deriver(t.name) for t in config.targets]
    shapes: dict[int, Shape] = {}
    configs = {m: ModelConfigInfo(name=m, max_batch_size=MAX_BATCH_SIZE) for m in models}
    result = Stages(backend.name, targets * scrapes, 0)
    try:
        for r in range(WARMUP_ROUNDS + scrapes):
            timed = r >= WARMUP_ROUNDS
            timer = _Timer(result, backend, timed)
            ts = T0 + INTERVAL_S * r
            accepted0 = store.accepted
            for i, target in enumerate(config.targets):
                start = time.perf_counter()
                with timer("fetch"):
                    body = await fetch_metrics(
                        client, target.name, target.metrics_url,
                        timeout=config.timeout_for(target),
                        max_bytes=config.scrape.max_body_bytes,
                    )
                with timer("parse"):
                    shape, values = parse_columns(body.text, shapes.get(i))
                    shapes[i] = shape
                with timer("derive"):
                    derived = derivers[i].derive_columns(shape, values, ts, configs)
                health = TargetHealth(
                    target.name, "metrics", ts, True, time.perf_counter() - start, len(values)
                )
                with timer("store write"):
                    # As Collector._ingest does.
                    extra = derived + Collector._up_samples(health)
                    store.write_columns(
                        target.name, ts, shape.names + [s.name for s in extra],
                        shape.labels + [s.labels for s in extra],
                        np.concatenate([values, np.array([s.value for s in extra])]),
                    )
                with timer("health", server=True):
                    store.write_health(health)
            with timer("flush", server=True):
                store.flush()
            if timed:
                result.samples += store.accepted - accepted0
    finally:
        await client.aclose()
        store.close()
    return result


# --- report -----------------------------------------------------------------------------------


def _fmt_e2e(rows: list[EndToEnd]) -> list[str]:
    head = (
        f"{'backend':<9} {'scrapes':>7} {'samples':>9} {'raw':>8} {'derived':>8} {'wall s':>7} "
        f"{'samples/s':>10} {'client CPU s':>12} {'(usr+sys)':>12} {'DB srv CPU s':>12} "
        f"{'total CPU s':>11} {'samples/CPU-s':>13}"
    )
    out = [head, "-" * len(head)]
    for e in rows:
        total = e.client_s + e.server_s
        server = f"{e.server_s:12.2f}" if e.backend == "postgres" else f"{'(in client)':>12}"
        out.append(
            f"{e.backend:<9} {e.scrapes:>7} {e.samples:>9,} {e.raw:>8,} {e.derived:>8,} "
            f"{e.wall_s:7.2f} {e.samples / e.wall_s:>10,.0f} {e.client_s:12.2f} "
            f"{f'{e.client_user_s:.2f}+{e.client_sys_s:.2f}':>12} {server} {total:11.2f} "
            f"{e.samples / total:>13,.0f}"
        )
    return out


def _fmt_stages(rows: list[Stages]) -> list[str]:
    head = (
        f"{'backend':<9} {'stage':<12} {'total s':>8} {'ms/scrape':>10} {'client CPU ms':>13} "
        f"{'DB srv CPU ms':>13} {'share':>6} {'samples/s':>11}"
    )
    out = [head, "-" * len(head)]
    for res in rows:
        total_wall = sum(s.wall_s for s in res.stages.values())
        for name, s in res.stages.items():
            server = (
                f"{s.server_s * 1000 / res.scrapes:13.2f}"
                if res.backend == "postgres" and name in ("health", "flush")
                else f"{'-':>13}"
            )
            out.append(
                f"{res.backend:<9} {name:<12} {s.wall_s:8.3f} "
                f"{s.wall_s * 1000 / res.scrapes:10.2f} {s.cpu_s * 1000 / res.scrapes:13.2f} "
                f"{server} {s.wall_s / total_wall:6.1%} {res.samples / s.wall_s:>11,.0f}"
            )
        cpu = sum(s.cpu_s for s in res.stages.values())
        srv = sum(s.server_s for s in res.stages.values())
        out.append(
            f"{res.backend:<9} {'ALL':<12} {total_wall:8.3f} "
            f"{total_wall * 1000 / res.scrapes:10.2f} {cpu * 1000 / res.scrapes:13.2f} "
            f"{(f'{srv * 1000 / res.scrapes:13.2f}' if res.backend == 'postgres' else '-'):>13} "
            f"{1:6.1%} {res.samples / total_wall:>11,.0f}"
        )
        out.append("")
    return out


def main() -> None:
    tune_gc()  # as `tritonwatch serve` does
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--targets", type=int, default=8, help="simulated Triton servers")
    parser.add_argument("--scrapes", type=int, default=50, help="timed scrapes per target")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--pg-no-fsync", action="store_true",
        help="PostgreSQL with fsync/synchronous_commit off (default: durable, as in production)",
    )
    args = parser.parse_args()
    if args.targets < 1 or args.scrapes < 1:
        parser.error("--targets and --scrapes must be at least 1")
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]

    print(
        f"Tritonwatch ingest benchmark: {args.targets} targets x {args.scrapes} timed scrapes "
        f"(+{WARMUP_ROUNDS} warm-up rounds, not timed), {os.cpu_count()} CPUs"
    )
    e2e: list[EndToEnd] = []
    per_stage: list[Stages] = []
    with simulated_fleet(args.targets) as fleet:
        models = fleet_models(fleet)
        print(
            f"payload: bench.common.simulated_fleet, {fleet.series:,} series, "
            f"{fleet.payload_bytes / 1024:.0f} KiB per scrape, series order fixed, counters "
            f"grow every scrape; max_batch_size={MAX_BATCH_SIZE} configured for "
            f"{len(models)} models"
        )
        fleet_cpu0 = process_tree_cpu(fleet.pid)
        for name in backends:
            with (
                sqlite_backend() if name == "sqlite"
                else postgres_backend(durable=not args.pg_no_fsync)
            ) as backend:
                fleet.reset()
                e2e.append(
                    asyncio.run(_end_to_end(backend, fleet, args.targets, args.scrapes, models))
                )
                fleet.reset()
                per_stage.append(
                    asyncio.run(_per_stage(backend, fleet, args.targets, args.scrapes, models))
                )
        fleet_cpu = process_tree_cpu(fleet.pid) - fleet_cpu0

    pg_mode = "fsync off" if args.pg_no_fsync else "durable: fsync + synchronous_commit on"
    print()
    print(
        "END TO END: Collector.scrape() for all targets concurrently per round, then "
        "Collector.flush()"
    )
    print(
        "  samples = accepted by Store.write (raw minus NaN + derived SLIs + up/duration/"
        "scraped); raw = exposed samples scraped; derived = SLIs"
    )
    print(
        "  client CPU = this process, all threads (getrusage); DB srv CPU = PostgreSQL "
        f"postmaster + children from /proc ({pg_mode}); SQLite runs inside the client"
    )
    for line in _fmt_e2e(e2e):
        print("  " + line)
    for e in e2e:
        print(
            f"  {e.backend}: rows flushed in timed rounds {e.flushed:,}; samples stored "
            f"{e.rows_in_db:,} (incl. warm-up)"
        )
    print()
    print(
        "PER STAGE: same payload sequence on a fresh database, one target at a time, each "
        "stage timed on its own"
    )
    print(
        "  parse = parse_columns (values against the target's shape); health = "
        "Store.write_health (one transaction per scrape, as Collector.scrape does); flush "
        "once per round of "
        f"{fleet_targets(args.targets)}; ms are per scrape; samples/s = samples / stage time"
    )
    for line in _fmt_stages(per_stage):
        print("  " + line)
    print(
        f"EXCLUDED: the simulated Triton HTTP server (pid {fleet.pid}, separate process) used "
        f"{fleet_cpu:.2f} CPU s during all runs (rendering and serving payloads); it is "
        "not in any figure above, but it shares the machine's CPUs with the client and the DB."
    )



def fleet_targets(n: int) -> str:
    return f"{n} target{'s' if n != 1 else ''}"


if __name__ == "__main__":
    main()
