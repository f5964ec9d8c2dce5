"""Bytes written per sample, and CPU, of a fleet's flushes and of each maintenance step.

    PYTHONPATH=. .venv/bin/python -m bench.writes [--targets 100] [--hours 2.2]

``--targets`` targets of 566 series (``bench.flush``'s fleet payloads) scraped every 15 s,
each scrape flushed as ``serve`` flushes it, and maintenance's steps run every 5 simulated
minutes as ``Maintenance.rollup`` runs them (the log moved into chunks, rollups, compaction),
each step measured apart: bytes this process passed to write() (SQLite's WAL and checkpoints,
``/proc/self/io`` wchar) and its CPU, both per sample ingested, and the most one run of it
raised the process's peak RSS above its RSS when the run started (its transient memory; the
collector's ``serve`` holds these at once with everything else, ``bench.fleet``).  SQLite
only: PostgreSQL's writes are its server's (``bench.storage`` counts them, for one target).

Why a fleet and not one target: what a flush rewrites depends on how many (target, name) rows
share the log's pages and index, which one target does not show (``bench.storage`` measures
one).  Two hours and a bit, so that the hourly move of the log and compaction both run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import TypeVar

from bench.common import peak_rss_mib, reset_peak_rss, rss_mib
from bench.flush import T0, Shape, _wchar, sources
from tests.store_sql import raw_engine
from tritonwatch.store import maintenance, open_store, samplelog

STEPS = ("flush", "move log", "rollup", "compact")
_T = TypeVar("_T")


def run(targets: int, hours: float) -> None:
    srcs = sources(Shape("fleet", targets, 7, 2, 1, 15.0))
    written = dict.fromkeys(STEPS, 0)
    cpu = dict.fromkeys(STEPS, 0.0)
    rise = dict.fromkeys(STEPS, 0.0)  # the most a run of the step took RSS above its start
    samples = 0
    pid = os.getpid()

    def timed(step: str, fn: Callable[[], _T]) -> _T:
        reset_peak_rss(pid)
        r0, w0, c0 = rss_mib(pid), _wchar(), time.process_time()
        out = fn()
        written[step] += _wchar() - w0
        cpu[step] += time.process_time() - c0
        rise[step] = max(rise[step], peak_rss_mib(pid) - r0)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        # Flushed only where the loop says (a smaller batch would flush inside the writes).
        store = open_store(f"sqlite:///{tmp}/writes.db", batch_rows=1 << 30)
        store.migrations.apply()
        engine = raw_engine(store)
        try:
            for k in range(round(hours * 240)):
                ts = T0 + k * 15
                for i, src in enumerate(srcs):
                    store.write_columns(f"triton-{i}:8002", ts, src.names, src.labels,
                                        src.v0 + k * src.dv)
                samples += timed("flush", store.flush)
                if k % 20 == 19:  # every 5 minutes, as serve's maintenance job
                    now_ms = round(ts * 1000)
                    timed("move log", partial(samplelog.transpose, engine, gate=nullcontext(),
                                              before_ms=samplelog.move_before(now_ms)))
                    timed("rollup", partial(maintenance.rollup, engine, now_ms=now_ms))
                    timed("compact", partial(maintenance.compact, engine, now_ms=now_ms))
            size = os.path.getsize(f"{tmp}/writes.db")
            end_rss = rss_mib(pid)
        finally:
            store.close()
    print(f"{targets} targets x 566 series, {hours:g} h at 15 s: {samples:,} samples; "
          f"database {size / samples:.1f} B per sample before VACUUM")
    print(f"  {'step':10} {'B written/sample':>17} {'CPU ns/sample':>14} {'RSS rise MiB':>13}")
    for step in STEPS:
        print(f"  {step:10} {written[step] / samples:17.1f} {cpu[step] * 1e9 / samples:14.0f} "
              f"{rise[step]:13.1f}")
    print(f"  {'total':10} {sum(written.values()) / samples:17.1f} "
          f"{sum(cpu.values()) * 1e9 / samples:14.0f}")
    print(f"RSS at the end {end_rss:.0f} MiB; a step's RSS rise: the most one run of it took "
          "the process's peak RSS above its RSS when it started")
    print("target (issue 22): <= 50 B written per sample ingested")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--hours", type=float, default=2.2)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    run(args.targets, args.hours)


if __name__ == "__main__":
    main()
