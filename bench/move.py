"""Memory and CPU of the hourly move of one large name from the sample log into chunks.

    .venv/bin/python -m bench.move [--series 2000] [--flushes 240]

The NVML host's target holds a GPU series of every target of a fleet: one of its names is
``--series`` series (2,000: a 1,000-target fleet of 2 GPUs each), flushed ``--flushes`` times
(240: an hour at 15 s), one sample per series a flush, as ``serve`` writes them.  The log's rows
are then moved into chunks (``store.samplelog.transpose``, what the maintenance job runs every
hour) with ``tracemalloc`` on: prints the samples moved, the process CPU of the move and the
peak of traced memory (numpy's arrays included) during it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from contextlib import nullcontext

import numpy as np

from tests.store_sql import raw_engine
from tritonwatch.schemas.samples import Labels
from tritonwatch.store import open_store, samplelog

T0 = 1_700_000_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--series", type=int, default=2000)
    parser.add_argument("--flushes", type=int, default=240)
    args = parser.parse_args()
    labels: list[Labels] = [(("gpu_uuid", f"GPU-{g:05d}"), ("hostname", f"triton-{g // 2}"))
                            for g in range(args.series)]
    names = ["nv_gpu_utilization"] * args.series
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="tw-move-") as tmp:
        store = open_store(f"sqlite:///{tmp}/move.db")
        try:
            store.migrations.apply()
            for k in range(args.flushes):
                store.write_columns("nvml", T0 + 15 * k, names, labels, rng.random(args.series))
                store.flush()
            tracemalloc.start()
            c0 = time.process_time()
            moved = samplelog.transpose(raw_engine(store), gate=nullcontext())
            cpu = time.process_time() - c0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        finally:
            store.close()
    print(f"moved {moved:,} samples of {args.series:,} series ({args.flushes} flushes) in "
          f"{cpu:.2f} CPU s; traced peak {peak / 2**20:.1f} MiB "
          f"({peak / max(moved, 1):.1f} bytes a sample)")


if __name__ == "__main__":
    main()
