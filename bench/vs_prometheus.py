"""Tritonwatch next to Prometheus: samples ingested per CPU-second on the same targets.

    .venv/bin/python -m bench.vs_prometheus [--targets 20] [--interval 1] [--duration 45]
        [--warmup 25] [--backend sqlite|postgres|both] [--rounds 1]

A simulated fleet (``bench.common.simulated_fleet``: N targets of ~2,900 series, 20 models,
8 GPUs, TRT-LLM families, counters advancing on every scrape; a separate process whose CPU is
in no figure) is scraped **in turn** by

1. a real Prometheus (``/usr/bin/prometheus``, the Debian package) at ``--interval``;
2. ``tritonwatch serve`` (a subprocess, as deployed) storing into SQLite;
3. ``tritonwatch serve`` storing into a throwaway PostgreSQL 15 (durable: fsync on).

Each runs ``--warmup`` seconds (series creation, rate baselines), then is measured over the
next ``--duration`` seconds:

* samples: Prometheus's ``prometheus_tsdb_head_samples_appended_total`` (every exposed
  sample, NaN included, plus its 5 synthetic ``up``-style samples per scrape); tritonwatch's
  stored samples, ``Store.count_samples()`` (exposed samples except NaN, the derived SLIs,
  3 ``up``-style samples per scrape).  Both are read at the start and the end of the window;
* CPU: user+system of the scraper process (all threads) from /proc, plus for PostgreSQL its
  postmaster and every backend (the database server's CPU counts).  Sample counts are read outside
  the CPU window, so counting costs no one;
* peak RSS: VmHWM of the scraper process (PostgreSQL's shared buffers not included).

``--rounds N`` runs the three in turn N times (one PostgreSQL server for all, a new database
each round) and ends with each scraper's median samples/CPU-s and the median of its rounds'
ratios, each against that round's own Prometheus run: Prometheus's CPU over the same window
has moved by a third between runs on one machine, and a single round's ratio carries all of
that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass

import yaml

from bench.common import (
    Fleet,
    fleet_models,
    http_get,
    peak_rss_mib,
    process_tree_cpu,
    simulated_fleet,
    wait_until,
)
from bench.ingest import postgres_backend
from tests.fixtures_pg import _free_port
from tritonwatch.schemas.config import StoreConfig
from tritonwatch.store import Query, open_store

PROMETHEUS = "/usr/bin/prometheus"


@dataclass
class Result:
    who: str
    samples: int
    window_s: float
    cpu_s: float  # scraper process
    db_cpu_s: float  # PostgreSQL server (0 for SQLite: it runs inside the scraper)
    peak_rss_mib: float
    scrapes: int  # successful scrapes stored in the window (both: from their ``up`` series)
    expected: int  # targets x window / interval
    failed: str = ""  # why the run produced no figure (the scraper died or never answered)

    @property
    def total_cpu_s(self) -> float:
        return self.cpu_s + self.db_cpu_s

    @property
    def per_cpu_s(self) -> float:
        return self.samples / self.total_cpu_s if self.total_cpu_s > 0 else 0.0


def _prom_appended(port: int) -> int:
    total = 0.0
    for line in http_get(f"http://127.0.0.1:{port}/metrics").splitlines():
        if line.startswith("prometheus_tsdb_head_samples_appended_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def run_prometheus(fleet: Fleet, targets: int, interval: float, warmup: float,
                   duration: float) -> Result:
    with tempfile.TemporaryDirectory(prefix="tw-vs-prom-") as tmp:
        config = {
            "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s"},
            "scrape_configs": [{
                "job_name": "triton",
                "static_configs": [
                    {"targets": [fleet.address],
                     "labels": {"__metrics_path__": fleet.path(i), "target": f"triton-{i}"}}
                    for i in range(targets)
                ],
            }],
        }
        path = os.path.join(tmp, "prometheus.yml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        port = _free_port()
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: "Ready" in http_get(f"http://127.0.0.1:{port}/-/ready"), 60,
                       "Prometheus to be ready")
            time.sleep(warmup)
            n0, c0, t0 = _prom_appended(port), process_tree_cpu(proc.pid), time.perf_counter()
            time.sleep(duration)
            c1, t1 = process_tree_cpu(proc.pid), time.perf_counter()
            n1 = _prom_appended(port)
            rss = peak_rss_mib(proc.pid)
            scrapes = _prom_scrapes(port, t1 - t0)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    expected = int(targets * (t1 - t0) // interval)
    return Result("prometheus 2.42", n1 - n0, t1 - t0, c1 - c0, 0.0, rss, scrapes, expected)


def _prom_scrapes(port: int, window_s: float) -> int:
    """Successful scrapes in the last ``window_s``: ``sum(sum_over_time(up[window]))``."""
    query = urllib.parse.quote(f"sum(sum_over_time(up[{int(window_s * 1000)}ms]))")
    answer = json.loads(http_get(f"http://127.0.0.1:{port}/api/v1/query?query={query}"))
    result = answer["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0



def run_tritonwatch(fleet: Fleet, targets: int, interval: float, warmup: float, duration: float,
                    *, url: str, who: str, db_pid: int | None,
                    flush_interval: float | None = None) -> Result:
    models = fleet_models(fleet)
    with tempfile.TemporaryDirectory(prefix="tw-vs-tw-") as tmp:
        port = _free_port()
        config = {
            "version": 1,
            "targets": [
                {"name": f"triton-{i}", "metrics_url": fleet.url(i),
                 "max_batch_size": dict.fromkeys(models, 8)}
                for i in range(targets)
            ],
            "scrape": {"interval": f"{interval:g}s", "timeout": f"{interval:g}s"},
            "store": {"url": url, **(
                {"flush_interval": f"{flush_interval:g}s"} if flush_interval else {}
            )},
            "api": {"listen": f"127.0.0.1:{port}"},
        }
        path = os.path.join(tmp, "tritonwatch.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        exe = os.path.join(os.path.dirname(sys.executable), "tritonwatch")
        proc = subprocess.Popen([exe, "serve", "--config", path], cwd=tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def count() -> int:
            with open_store(url) as store:
                return store.count_samples()

        def db_cpu() -> float:
            return process_tree_cpu(db_pid) if db_pid else 0.0

        try:
            wait_until(lambda: http_get(f"http://127.0.0.1:{port}/api/v1/targets") != "", 60,
                       "tritonwatch serve to answer")
            # Series are created at the first flush: it must fall in the warm-up.
            time.sleep(max(warmup, (flush_interval or StoreConfig().flush_interval) + 5))
            # Counts outside the CPU window: counting costs neither side.
            n0 = count()
            c0, d0, t0 = process_tree_cpu(proc.pid), db_cpu(), time.perf_counter()
            wall0 = time.time()
            time.sleep(duration)
            c1, d1, t1 = process_tree_cpu(proc.pid), db_cpu(), time.perf_counter()
            wall1 = time.time()
            n1 = count()
            rss = peak_rss_mib(proc.pid)
        except (RuntimeError, OSError) as exc:
            # Overloaded past answering (or dead): a row that says so, not a crash.
            proc.kill()
            _, err = proc.communicate(timeout=120)
            reason = f"{exc}; stderr: {err.decode()[-300:]!r}"
            return Result(who, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, failed=reason)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=300)
        if proc.returncode:
            tail = err.decode()[-2000:]
            raise RuntimeError(f"tritonwatch serve exited {proc.returncode}: {tail}")
        # After the final flush: every scrape of the window is stored by now.
        with open_store(url) as store:
            ups = store.read(Query("up", start=wall0, end=wall1)).series()
        scrapes = sum(
            sum(1 for v in d.values if v == 1) for d in ups if d.target.startswith("triton-")
        )
    expected = int(targets * (t1 - t0) // interval)
    return Result(who, n1 - n0, t1 - t0, c1 - c0, d1 - d0, rss, scrapes, expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval, seconds")
    # Longer than tritonwatch's flush interval (15 s by default): its series are created at its
    # first flush, as Prometheus's are at its first scrape, and both belong in the warm-up.
    parser.add_argument("--warmup", type=float, default=25.0)
    parser.add_argument("--duration", type=float, default=45.0, help="measured window, seconds")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--flush-interval", type=float, default=None,
                        help="tritonwatch's store.flush_interval, s (default: the product's)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every scraper this many times, in turn, and add the medians")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")

    print(f"Tritonwatch vs Prometheus: {args.targets} simulated targets, scrape interval "
          f"{args.interval:g} s, {args.warmup:g} s warm-up + {args.duration:g} s measured each, "
          f"{os.cpu_count()} CPUs; tritonwatch store.flush_interval "
          f"{f'{args.flush_interval:g} s' if args.flush_interval else 'default (15 s)'}"
          f"{f'; {args.rounds} rounds' if args.rounds > 1 else ''}")
    rounds: list[list[Result]] = []
    with simulated_fleet(args.targets) as fleet, contextlib.ExitStack() as stack:
        print(f"payload: {fleet.series:,} series, {fleet.payload_bytes / 1024:.0f} KiB per "
              "scrape per target, series order fixed, counters advance every scrape")
        postgres = (stack.enter_context(postgres_backend(durable=True))
                    if args.backend in ("postgres", "both") else None)
        for n in range(args.rounds):
            # Each round measures every scraper, Prometheus first: its figure is the round's
            # reference, taken minutes apart from the others at most.
            results = [run_prometheus(fleet, args.targets, args.interval, args.warmup,
                                      args.duration)]
            if args.backend in ("sqlite", "both"):
                with tempfile.TemporaryDirectory(prefix="tw-vs-db-") as tmp:
                    results.append(run_tritonwatch(
                        fleet, args.targets, args.interval, args.warmup, args.duration,
                        url=f"sqlite:///{tmp}/tw.db", who="tritonwatch sqlite", db_pid=None,
                        flush_interval=args.flush_interval,
                    ))
            if postgres is not None:
                results.append(run_tritonwatch(
                    fleet, args.targets, args.interval, args.warmup, args.duration,
                    url=postgres.new_database(f"tw_vs_prometheus_{n}"),
                    who="tritonwatch postgres", db_pid=postgres.server_pid,
                    flush_interval=args.flush_interval,
                ))
            if args.rounds > 1:
                print(f"\nround {n + 1} of {args.rounds}")
            _table(results)
            rounds.append(results)
        fleet_cpu = process_tree_cpu(fleet.pid)

    if args.rounds > 1:
        _medians(rounds)
    print()
    print("scrapes: successful scrapes stored in the window / (targets x window / interval); "
          "a scraper that falls behind stores fewer, and its figure covers less work")
    print("samples: Prometheus = head samples appended (NaN kept, +5 synthetic per scrape); "
          "tritonwatch = rows stored (NaN skipped, + derived SLIs, +3 synthetic per scrape)")
    print(f"target: tritonwatch >= 70% of Prometheus's samples/CPU-s on each backend; the "
          f"simulated fleet (excluded) used {fleet_cpu:.1f} CPU s in all")


def _table(results: list[Result]) -> None:
    """One round's rows, each against that round's Prometheus."""
    head = (f"{'scraper':<22} {'samples':>10} {'samples/s':>10} {'proc CPU s':>10} "
            f"{'DB CPU s':>9} {'samples/CPU-s':>13} {'vs prom':>8} {'peak RSS MiB':>12} "
            f"{'scrapes':>15}")
    print()
    print(head)
    print("-" * len(head))
    ref = results[0].per_cpu_s
    for r in results:
        if r.failed:
            print(f"{r.who:<22} FAILED: {r.failed}")
            continue
        db = f"{r.db_cpu_s:9.2f}" if r.db_cpu_s else f"{'-':>9}"
        done = f"{r.scrapes:,}/{r.expected:,}"
        print(f"{r.who:<22} {r.samples:>10,} {r.samples / r.window_s:>10,.0f} {r.cpu_s:10.2f} "
              f"{db} {r.per_cpu_s:>13,.0f} {r.per_cpu_s / ref:>8.1%} {r.peak_rss_mib:>12.0f} "
              f"{done:>15}")


def _medians(rounds: list[list[Result]]) -> None:
    """Per scraper, across rounds: the median samples/CPU-s and the median of its rounds'
    ratios to their own Prometheus.  Prometheus's CPU for the same window has moved by a
    third between runs on this machine (4.5 to 7.2 s); one round's ratio carries all of it."""
    print(f"\nmedians over {len(rounds)} rounds (each ratio against its own round's "
          "Prometheus):")
    print(f"{'scraper':<22} {'samples/CPU-s':>13} {'vs prom':>8}   per round")
    for i, who in enumerate(r.who for r in rounds[0]):
        rows = [(results[i], results[0]) for results in rounds
                if not results[i].failed and results[0].per_cpu_s > 0]
        if not rows:
            print(f"{who:<22} FAILED in every round")
            continue
        ratios = [r.per_cpu_s / ref.per_cpu_s for r, ref in rows]
        rates = statistics.median(r.per_cpu_s for r, _ in rows)
        each = " ".join(f"{x:.1%}" for x in ratios)
        print(f"{who:<22} {rates:>13,.0f} {statistics.median(ratios):>8.1%}   {each}")


if __name__ == "__main__":
    main()
