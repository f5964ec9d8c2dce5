"""CPU per sample of ``Store.flush`` alone, in the two shapes the collector flushes.

    .venv/bin/python -m bench.flush [--backend sqlite|postgres|both]
        [--shape ingest|ingest1|fleet|all] [--flushes 6] [--profile FILE] [--reresolve]

Shapes (payloads from ``tests.payloads.Template``, parsed once with the collector's parser;
later scrapes move every counter on as the simulated server does):

* **ingest**: 8 targets of 2,879 series, 15 scrapes 1 s apart per target per flush
  (``bench.ingest``'s 1 s scrapes flushed every 15 s);
* **ingest1**: the same targets, one scrape per target per flush (what ``bench.ingest``'s
  per-stage figures time: a flush every round);
* **fleet**: 300 targets of 566 series, one scrape per target per flush (``bench.fleet``'s
  15 s interval).

The scrapes are buffered with ``Store.write_columns`` (not timed), then ``Store.flush`` is timed
with this process's CPU clock (the store flushes in the calling thread; PostgreSQL's server CPU
is not counted).  Two warm-up flushes (series creation) are not timed.  Prints the median and
spread of CPU per sample over ``--flushes`` flushes, and the CPU of a read of the last 5
minutes of one name across every target (``Store.read``).  ``--profile`` writes a cProfile of
the timed flushes.  ``--reresolve`` also times the flushes after every target's layout
expired (``Store.series_ttl_s``: each series upserted again to mark it in use for retention).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.payloads import Template
from tritonwatch.collector.shape import parse_columns
from tritonwatch.schemas.config import SERIES_CACHE_TTL_MAX_S, SERIES_CACHE_TTL_MIN_S
from tritonwatch.store import Store, open_store
from tritonwatch.store.reads import Query

T0 = 1_700_000_000.0
WARMUP = 2
READ_NAME = "nv_inference_count"


@dataclass(frozen=True)
class Shape:
    name: str
    targets: int
    models: int
    gpus: int
    scrapes: int  # per target per flush
    every_s: float  # between a target's scrapes


SHAPES = {
    "ingest": Shape("ingest", 8, 20, 8, 15, 1.0),
    "ingest1": Shape("ingest1", 8, 20, 8, 1, 15.0),
    "fleet": Shape("fleet", 300, 7, 2, 1, 15.0),
}


@dataclass
class Source:
    """One target's series and how its values move per scrape."""

    names: list[str]
    labels: list[Any]
    v0: np.ndarray[Any, np.dtype[np.float64]]
    dv: np.ndarray[Any, np.dtype[np.float64]]


def sources(shape: Shape) -> list[Source]:
    out = []
    for i in range(shape.targets):
        tpl = Template(i, shape.models, shape.gpus)
        parsed, v0 = parse_columns(tpl.render(0).decode(), None)
        _, v1 = parse_columns(tpl.render(1).decode(), parsed)
        out.append(Source(parsed.names, parsed.labels, v0, v1 - v0))
    return out


@contextmanager
def backend_url(name: str) -> Iterator[str]:
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/flush.db"
    else:
        from tests.fixtures_pg import running_postgres

        with running_postgres() as url:
            yield url


def _wchar() -> int:
    """Bytes this process has passed to write() (SQLite's WAL and checkpoints; PostgreSQL's
    writes are the server's)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def run(url: str, shape: Shape, flushes: int, profile: cProfile.Profile | None, *,
        reresolve: bool = False) -> None:
    srcs = sources(shape)
    store: Store = open_store(url, batch_rows=1 << 30)
    store.migrations.apply()
    cpu: list[float] = []
    wrote: list[float] = []
    samples = 0
    step = 0
    try:
        for f in range(WARMUP + flushes):
            step = _buffer(store, srcs, shape, step)
            if profile is not None and f >= WARMUP:
                profile.enable()
            w0, c0 = _wchar(), time.process_time()
            n = store.flush()
            c1, w1 = time.process_time(), _wchar()
            if profile is not None and f >= WARMUP:
                profile.disable()
            if f >= WARMUP:
                cpu.append((c1 - c0) / n)
                wrote.append((w1 - w0) / n)
                samples = n
        if reresolve:
            step = _reresolve(store, srcs, shape, step)
        end = T0 + step * shape.every_s
        reads = []
        for _ in range(5):
            c0 = time.process_time()
            got = store.read(Query(READ_NAME, start=end - 300, end=end))
            reads.append(time.process_time() - c0)
        read_series, read_n = len(got.keys), len(got.ts)
    finally:
        store.close()
    print(
        f"  {shape.name:6} {samples:>8,} samples/flush  flush CPU "
        f"{statistics.median(cpu) * 1e9:7.0f} ns/sample (min {min(cpu) * 1e9:.0f}, "
        f"max {max(cpu) * 1e9:.0f}; {len(cpu)} flushes), {statistics.median(wrote):.0f} B/sample "
        f"written by this process  read 5 min of {READ_NAME} "
        f"({read_series} series, {read_n} samples) {statistics.median(reads) * 1e3:.2f} ms CPU"
    )


def _buffer(store: Store, srcs: list[Source], shape: Shape, step: int) -> int:
    """Buffer the next flush's scrapes of every target from scrape ``step``; returns the step
    after them."""
    for k in range(step, step + shape.scrapes):
        for i, src in enumerate(srcs):
            store.write_columns(f"triton-{i}:8002", T0 + k * shape.every_s, src.names,
                                src.labels, src.v0 + k * src.dv)
    return step + shape.scrapes


def _reresolve(store: Store, srcs: list[Source], shape: Shape, step: int) -> int:
    """Print what the expiry of every target's layout costs (``Store.series_ttl_s``): the
    flushes that resolve all their series again, a budget of ``store.flush.RESOLVE_SLICE``
    keys each as in serve, against as many steady flushes.  Returns the scrape step reached.
    """
    writer = store._writer  # a bench: its TTL moved for these flushes, then put back
    ttl = writer.ttl_s

    def flush() -> tuple[float, int]:
        nonlocal step
        step = _buffer(store, srcs, shape, step)
        w0, c0 = _wchar(), time.process_time()
        store.flush()
        return time.process_time() - c0, _wchar() - w0

    expired_at = time.monotonic()
    again: list[tuple[float, int]] = []
    # Layouts resolved before ``expired_at`` are past the TTL, those resolved since are not.
    while any(lay.born < expired_at for lay in writer._layouts.values()):
        writer.ttl_s = time.monotonic() - expired_at
        again.append(flush())
    writer.ttl_s = ttl
    steady = [flush() for _ in again]
    series = sum(len(src.names) for src in srcs)
    cpu = sum(c for c, _ in again) - sum(c for c, _ in steady)
    wrote = sum(w for _, w in again) - sum(w for _, w in steady)
    print(f"  {shape.name:6} every layout expired: {series:,} series resolved again in "
          f"{len(again)} flush(es), {cpu / series * 1e6:.2f} us of CPU and {wrote / series:.0f} "
          f"bytes written by this process a series beyond steady flushes; at 1,000 targets of "
          f"566 series, {cpu / series * 566_000 / SERIES_CACHE_TTL_MIN_S:.2%} of a core every "
          f"{SERIES_CACHE_TTL_MIN_S:g} s, {cpu / series * 566_000 / SERIES_CACHE_TTL_MAX_S:.2%}"
          f" every {SERIES_CACHE_TTL_MAX_S:g} s")
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--shape", choices=("ingest", "ingest1", "fleet", "all"), default="all")
    parser.add_argument("--flushes", type=int, default=6)
    parser.add_argument("--profile", help="write a cProfile of the timed flushes here")
    parser.add_argument("--reresolve", action="store_true",
                        help="also time the flushes after every layout expired")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    shapes = tuple(SHAPES) if args.shape == "all" else (args.shape,)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for backend in backends:
        print(backend)
        for shape in shapes:
            with backend_url(backend) as url:
                run(url, SHAPES[shape], args.flushes, profile, reresolve=args.reresolve)
    if profile is not None:
        profile.dump_stats(args.profile)


if __name__ == "__main__":
    main()
