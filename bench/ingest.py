"""End-to-end ingest benchmark: scrape → parse → derive → store, against a real HTTP target.

    .venv/bin/python -m bench.ingest [--targets N] [--scrapes K] [--backend sqlite|postgres|both]

A simulated Triton fleet runs in a **separate process**: one ``ThreadingHTTPServer`` on
127.0.0.1 serving ``/t/<i>/metrics`` for target ``i`` as
``bench.payloads.triton_payload(seed=i, step=n)``, where ``n`` counts that target's requests,
so every scrape sees its counters grow (~2,900 series, ~390 KB each).  Payloads are generated
before the clock starts, so the server only copies bytes while measured; its CPU is reported
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
   fetch (httpx, collector.scrape.fetch_metrics), parse (collector.parse.parse plus flattening
   to samples), derive (Deriver.derive), store write (Store.write, buffering), health
   (Store.write_health, which Collector.scrape does once per scrape) and flush (Store.flush,
   once per round).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import sqlite3
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

import psycopg
from psycopg import sql

from bench.payloads import triton_payload
from collector.derive import Deriver
from collector.jobs import Collector
from collector.parse import parse
from collector.scrape import fetch_metrics, make_client
from schemas.config import Config, validate_config
from schemas.samples import Sample, Snapshot, TargetHealth, label_value
from schemas.triton import ModelConfigInfo
from store import Store

T0 = 1_700_000_000.0
INTERVAL_S = 15.0
WARMUP_ROUNDS = 2
MAX_BATCH_SIZE = 8  # fill-rate denominator configured for every model (as max_batch_size)
STAGES = ("fetch", "parse", "derive", "store write", "health", "flush")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the simulated Triton fleet (separate process) --------------------------------------------


def _serve(conn: Connection, targets: int, steps: int) -> None:
    payloads = [
        [triton_payload(seed=i, step=s).encode() for s in range(steps)] for i in range(targets)
    ]
    counters = [0] * targets
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as prometheus-cpp

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if parts == ["reset"]:
                with lock:
                    counters[:] = [0] * targets
                self._send(b"ok\n")
            elif len(parts) == 3 and parts[0] == "t" and parts[2] == "metrics":
                i = int(parts[1])
                with lock:
                    step = counters[i]
                    counters[i] += 1
                body = (
                    payloads[i][step]
                    if step < steps
                    else triton_payload(seed=i, step=step).encode()
                )
                self._send(body)
            else:
                self.send_error(404)

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    conn.send((server.server_address[1], len(payloads[0][0]) if payloads else 0))
    server.serve_forever()


@dataclass
class Fleet:
    port: int
    pid: int
    payload_bytes: int

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/t/{i}/metrics"

    def reset(self) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/reset", timeout=10) as r:
            r.read()


@contextmanager
def simulated_fleet(targets: int, steps: int) -> Iterator[Fleet]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, targets, steps), daemon=True)
    proc.start()
    try:
        if not parent.poll(300):
            raise RuntimeError("simulated Triton did not start within 300 s")
        port, size = parent.recv()
        assert proc.pid is not None
        yield Fleet(port, proc.pid, size)
    finally:
        proc.terminate()
        proc.join(10)


# --- CPU accounting ---------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own CPU s, reaped children's CPU s) of ``pid``, or None if it is gone.

    Own CPU is the larger of stat's utime + stime (whole clock ticks, all threads, exited ones
    included) and the nanosecond run time of its live threads (/proc/<pid>/task/*/schedstat),
    so a single-threaded PostgreSQL backend is counted to the nanosecond and a process whose
    threads come and go is not under-counted.  Reaped children exist only in cutime + cstime.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # comm may hold spaces and parentheses
    # fields[0] is field 3 (state): ppid=4, utime=14, stime=15, cutime=16, cstime=17.
    ppid, utime, stime, cutime, cstime = (int(fields[k]) for k in (1, 11, 12, 13, 14))
    return ppid, max((utime + stime) / _CLK_TCK, _live_threads_ns(pid) / 1e9), (
        cutime + cstime
    ) / _CLK_TCK


def _live_threads_ns(pid: int) -> int:
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def process_tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live children, plus children it has already reaped."""
    own = _stat(root)
    if own is None:
        return 0.0
    total = own[1] + own[2]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != root:
            st = _stat(int(entry))
            if st is not None and st[0] == root:
                total += st[1] + st[2]
    return total


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


@contextmanager
def sqlite_backend() -> Iterator[Backend]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-") as tmp:

        def new_database(phase: str) -> str:
            return f"sqlite:///{tmp}/{phase}.db"

        def count_rows(url: str) -> int:
            with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
                row = conn.execute("SELECT count(*) FROM samples").fetchone()
            return int(row[0])

        yield Backend("sqlite", new_database, count_rows)


@contextmanager
def postgres_backend(durable: bool) -> Iterator[Backend]:
    from tests.fixtures_pg import running_postgres

    with running_postgres(durable=durable) as base_url:
        admin = base_url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            backend_pid = int(row[0])
            info = _stat(backend_pid)  # a backend's parent is the postmaster
            assert info is not None
            postmaster = info[0]

        def new_database(phase: str) -> str:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(phase)))
            return base_url.rsplit("/", 1)[0] + "/" + phase

        def count_rows(url: str) -> int:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM samples").fetchone()
            assert row is not None
            return int(row[0])

        yield Backend("postgres", new_database, count_rows, postmaster)


class CountingStore(Store):
    """A Store that counts the samples Store.write accepted (NaN excluded)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.accepted = 0
        self._count_lock = threading.Lock()

    def write(self, target: str, ts: float, samples: Iterable[Sample]) -> int:
        n = super().write(target, ts, samples)
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
    url = backend.new_database("tw_bench_e2e")
    store = CountingStore(url)
    store.create_schema()
    now = [T0]
    collector = Collector(
        fleet_config(fleet, targets, url, models), store, clock=lambda: now[0]
    )
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
    url = backend.new_database("tw_bench_stages")
    store = CountingStore(url)
    store.create_schema()
    config = fleet_config(fleet, targets, url, models)
    client = make_client()
    derivers = [Deriver(t.name) for t in config.targets]
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
                    snap = Snapshot(target.name, ts, tuple(parse(body.text)))
                    raw = list(snap.samples())
                with timer("derive"):
                    derived = derivers[i].derive(snap, configs)
                health = TargetHealth(
                    target.name, "metrics", ts, True, time.perf_counter() - start, len(raw)
                )
                with timer("store write"):
                    store.write(target.name, ts, raw + derived + Collector._up_samples(health))
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
    steps = WARMUP_ROUNDS + args.scrapes
    first = triton_payload(seed=0, step=0)
    families = parse(first)
    series = sum(len(f.samples) for f in families)
    models = sorted(
        {label_value(s.labels, "model") for f in families for s in f.samples} - {""}
    )
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]

    print(
        f"Tritonwatch ingest benchmark: {args.targets} targets x {args.scrapes} timed scrapes "
        f"(+{WARMUP_ROUNDS} warm-up rounds, not timed), {os.cpu_count()} CPUs"
    )
    print(
        f"payload: bench.payloads.triton_payload(seed=target, step=n), {series:,} series, "
        f"{len(first.encode()) / 1024:.0f} KiB per scrape, counters grow every scrape; "
        f"max_batch_size={MAX_BATCH_SIZE} configured for {len(models)} models"
    )
    print(f"generating {args.targets * steps} payloads in the simulated Triton process ...")
    e2e: list[EndToEnd] = []
    per_stage: list[Stages] = []
    with simulated_fleet(args.targets, steps) as fleet:
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
            f"  {e.backend}: rows flushed in timed rounds {e.flushed:,}; rows in samples table "
            f"{e.rows_in_db:,} (incl. warm-up)"
        )
    print()
    print(
        "PER STAGE: same payload sequence on a fresh database, one target at a time, each "
        "stage timed on its own"
    )
    print(
        "  parse includes flattening to samples; health = Store.write_health (one "
        "transaction per scrape, as Collector.scrape does); flush once per round of "
        f"{fleet_targets(args.targets)}; ms are per scrape; samples/s = samples / stage time"
    )
    for line in _fmt_stages(per_stage):
        print("  " + line)
    print(
        f"EXCLUDED: the simulated Triton HTTP server (pid {fleet.pid}, separate process) used "
        f"{fleet_cpu:.2f} CPU s during all runs (payloads pre-generated, serving only); it is "
        "not in any figure above, but it shares the machine's CPUs with the client and the DB."
    )


def fleet_targets(n: int) -> str:
    return f"{n} target{'s' if n != 1 else ''}"


if __name__ == "__main__":
    main()
