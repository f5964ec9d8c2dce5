"""Write throughput of the store for a 3,000-series Triton scrape, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.ingest_store [--scrapes 40] [--series 3000]

Prints samples/s for write()+flush() with the series already known (steady state), flushing
every ``--per-flush`` scrapes as the collector would.  PostgreSQL runs durable (fsync on).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from tests.fixtures_pg import running_postgres
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store, open_store


def scrape_samples(n: int, tick: int) -> list[Sample]:
    return [
        Sample(
            f"nv_metric_{i % 30}",
            make_labels({"model": f"model_{i // 30 % 20}", "version": "1", "gpu_uuid": f"GPU-{i}"}),
            float(tick * 10 + i % 7),
        )
        for i in range(n)
    ]


def run(store: Store, *, series: int, scrapes: int, per_flush: int) -> float:
    store.migrations.apply()
    t0 = 1_700_000_000.0
    store.write("triton-0:8002", t0, scrape_samples(series, 0))
    store.flush()  # creates the series: not part of the steady-state figure
    batches = [scrape_samples(series, tick) for tick in range(1, scrapes + 1)]
    start = time.perf_counter()
    for tick, samples in enumerate(batches, start=1):
        store.write("triton-0:8002", t0 + 15 * tick, samples)
        if tick % per_flush == 0:
            store.flush()
    store.flush()
    elapsed = time.perf_counter() - start
    store.close()
    return series * scrapes / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--series", type=int, default=3000)
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--per-flush", type=int, default=4)
    args = parser.parse_args()
    opts = {"series": args.series, "scrapes": args.scrapes, "per_flush": args.per_flush}
    with tempfile.TemporaryDirectory() as tmp:
        rate = run(open_store(f"sqlite:///{tmp}/bench.db"), **opts)
        print(f"sqlite      {rate:>10,.0f} samples/s")
    with running_postgres(durable=True) as url:
        rate = run(open_store(url), **opts)
        print(f"postgresql  {rate:>10,.0f} samples/s")


if __name__ == "__main__":
    main()
