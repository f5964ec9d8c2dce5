"""Memory and CPU of the hourly move of one large name, or of a fleet's targets, from the
sample log into chunks.

    .venv/bin/python -m bench.move [--series 2000] [--flushes 240]
    .venv/bin/python -m bench.move --targets 20 [--flushes 240]
        [--backend sqlite|postgres]

The NVML host's target holds a GPU series of every target of a fleet: one of its names is
``--series`` series (2,000: a 1,000-target fleet of 2 GPUs each), flushed ``--flushes`` times
(240: an hour at 15 s), one sample per series a flush, as ``serve`` writes them.  The log's rows
are then moved into chunks (``store.samplelog.transpose``, what the maintenance job runs every
hour) with ``tracemalloc`` on: prints the samples moved, the process CPU of the move and the
peak of traced memory (numpy's arrays included) during it.

With ``--targets``, the log holds that many Triton targets of 566 series in 50 names (as
``bench.fleet`` simulates them) instead: an hour of one is 135,840 samples, more than a move
transaction's budget.  It also prints a digest of the chunks written, the same for any
grouping of the move (to compare two versions of it side by side).

``--backend postgres`` moves them in a throwaway PostgreSQL (``bench.alerts_eval``'s) and
prints the server's CPU during the move beside this process's (a group read that scans the
whole log shows there, growing with the fleet).
"""

from __future__ import annotations

import argparse
import hashlib
import time
import tracemalloc
from contextlib import nullcontext

import numpy as np
from sqlalchemy import select

from bench.alerts_eval import backend
from bench.common import process_tree_cpu
from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Labels
from tritonwatch.store import Store, open_store, samplelog

T0 = 1_700_000_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--series", type=int, default=2000)
    parser.add_argument("--flushes", type=int, default=240)
    parser.add_argument("--targets", type=int, default=0,
                        help="move this many targets of 566 series instead of one large name")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    with backend(args.backend) as (url, server_pid):
        store = open_store(url)
        try:
            store.migrations.apply()
            if args.targets:
                _fill_fleet(store, args.targets, args.flushes, rng)
            else:
                _fill_name(store, args.series, args.flushes, rng)
            tracemalloc.start()
            s0 = process_tree_cpu(server_pid) if server_pid else 0.0
            c0 = time.process_time()
            moved = samplelog.transpose(raw_engine(store), gate=nullcontext())
            cpu = time.process_time() - c0
            server = process_tree_cpu(server_pid) - s0 if server_pid else 0.0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            chunks, digest = _chunks_digest(store)
        finally:
            store.close()
    what = (f"{args.targets} targets of 566 series" if args.targets
            else f"{args.series:,} series of one name")
    on_server = f" (+ {server:.2f} s of PostgreSQL's)" if server_pid else ""
    print(f"{args.backend}: moved {moved:,} samples of {what} ({args.flushes} flushes) in "
          f"{cpu:.2f} CPU s{on_server}; traced peak {peak / 2**20:.1f} MiB "
          f"({peak / max(moved, 1):.1f} bytes a sample); {chunks:,} chunks, digest {digest}")


def _fill_name(store: Store, series: int, flushes: int, rng: np.random.Generator) -> None:
    labels: list[Labels] = [(("gpu_uuid", f"GPU-{g:05d}"), ("hostname", f"triton-{g // 2}"))
                            for g in range(series)]
    names = ["nv_gpu_utilization"] * series
    for k in range(flushes):
        store.write_columns("nvml", T0 + 15 * k, names, labels, rng.random(series))
        store.flush()


#: A simulated Triton's series (``bench.fleet``'s count) and how many names they have.
FLEET_SERIES, FLEET_NAMES = 566, 50


def _fill_fleet(store: Store, targets: int, flushes: int, rng: np.random.Generator) -> None:
    names = [f"nv_metric_{i % FLEET_NAMES}" for i in range(FLEET_SERIES)]
    labels: list[Labels] = [(("model", f"m{i % 7}"), ("series", str(i)))
                            for i in range(FLEET_SERIES)]
    start = T0 - T0 % 3600  # one whole hour
    base = rng.random((targets, FLEET_SERIES)) * 1000  # counters, rising at random rates
    for k in range(flushes):
        for target in range(targets):
            store.write_columns(f"triton-{target}", start + 15 * k + target / 1000, names,
                                labels, base[target] + k * rng.random(FLEET_SERIES))
        store.flush()


def _chunks_digest(store: Store) -> tuple[int, str]:
    """How many chunks the move wrote, and a digest of them (keys, seqs and bytes)."""
    c = t.sample_chunks.c
    h = hashlib.sha256()
    n = 0
    with raw_engine(store).connect() as conn:
        for row in conn.execute(select(c.series_id, c.start_ms, c.seq, c.n, c.data)
                                .order_by(c.series_id, c.start_ms, c.seq)):
            h.update(repr(tuple(row[:4])).encode())
            h.update(bytes(row[4]))
            n += 1
    return n, h.hexdigest()[:16]

if __name__ == "__main__":
    main()
