"""CPU of one scrape's HTTP fetch: ``collector.scrape.fetch_metrics``, before and after.

    .venv/bin/python -m bench.fetch [--fetches 200] [--repeats 7] [--malloc]

Two simulated Triton targets (``bench.common.simulated_fleet``, in their own process, whose
CPU is in no figure): 20 models and 8 GPUs (2,879 series, ~380 KiB, as bench.ingest's) and 7
models and 2 GPUs (566 series, ~75 KiB, as bench.fleet's).  Each is fetched over a kept
connection, back to back, by

* ``httpx``: the fetch as it was before ``ScrapeClient`` and ``collector.http_backend``: a
  plain ``httpx.AsyncClient`` with the collector's headers over httpx's own transport
  (httpcore on anyio), ``client.stream``, the chunks joined and then decoded (``_before``,
  fetch_metrics' former body less its error handling, which costs nothing when all is well);
* ``scrape client``: ``make_client()``, what the collector, record and inspect use.

Per repeat and client, ``--fetches`` fetches after five untimed ones; the CPU of this process
(user and system, ``resource.getrusage``) and its minor page faults per fetch, medians over
``--repeats`` (the two clients alternate).  ``--malloc`` first applies ``tritonwatch.memory.
tune_malloc`` as ``tritonwatch serve`` does (blocks of 256 KiB or more mapped, so a 380 KiB
body costs page faults).  Prints the load average before and after: figures on a busy machine
are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
from collections.abc import Awaitable, Callable

import httpx

from bench.common import simulated_fleet
from tritonwatch.collector.scrape import (
    ACCEPT,
    KEEPALIVE_EXPIRY_S,
    USER_AGENT,
    fetch_metrics,
    make_client,
)

#: (label, models, gpus) of the simulated targets.
PAYLOADS = (("380 KiB", 20, 8), ("75 KiB", 7, 2))


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


async def _measure(fetch: Callable[[], Awaitable[object]], n: int) -> tuple[float, float, float]:
    """(user ms, system ms, minor faults) per fetch."""
    for _ in range(5):
        await fetch()
    u0, s0, f0 = _usage()
    for _ in range(n):
        await fetch()
    u1, s1, f1 = _usage()
    return (u1 - u0) / n * 1e3, (s1 - s0) / n * 1e3, (f1 - f0) / n


async def _before(client: httpx.AsyncClient, url: str, max_bytes: int) -> str:
    async with asyncio.timeout(30):
        async with client.stream("GET", url, headers={}, timeout=30) as response:
            assert response.status_code == 200
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                assert size <= max_bytes
                chunks.append(chunk)
    return b"".join(chunks).decode("utf-8")


def _httpx_client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=1,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(limits=limits, trust_env=False),
        headers={"User-Agent": USER_AGENT, "Accept": ACCEPT, "Accept-Encoding": "gzip"},
        follow_redirects=False, trust_env=False,
    )


async def _run(url: str, fetches: int, repeats: int) -> dict[str, list[tuple[float, float, float]]]:
    clients = {"httpx": _httpx_client(), "scrape client": make_client()}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in clients}
    try:
        for _ in range(repeats):
            for name, client in clients.items():
                async def fetch(client: httpx.AsyncClient = client, name: str = name) -> object:
                    if name == "httpx":
                        return await _before(client, url, 1 << 26)
                    return await fetch_metrics(client, "bench", url, timeout=30,
                                               max_bytes=1 << 26)
                results[name].append(await _measure(fetch, fetches))
    finally:
        for client in clients.values():
            await client.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fetches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--malloc", action="store_true",
                        help="tune glibc's malloc as tritonwatch serve does")
    args = parser.parse_args()
    if args.malloc:
        from tritonwatch.memory import tune_malloc

        tune_malloc()
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"{'payload':<8} {'series':>6} {'bytes':>7}  {'client':<14} {'user ms':>8} "
          f"{'sys ms':>7} {'CPU ms':>7} {'faults':>6}  (per fetch, median of {args.repeats})")
    for label, models, gpus in PAYLOADS:
        with simulated_fleet(1, models=models, gpus=gpus) as fleet:
            results = asyncio.run(_run(fleet.url(0), args.fetches, args.repeats))
        for name, rows in results.items():
            user = statistics.median(r[0] for r in rows)
            system = statistics.median(r[1] for r in rows)
            total = statistics.median(r[0] + r[1] for r in rows)
            faults = statistics.median(r[2] for r in rows)
            print(f"{label:<8} {fleet.series:>6} {fleet.payload_bytes:>7}  {name:<14} "
                  f"{user:>8.3f} {system:>7.3f} {total:>7.3f} {faults:>6.0f}")
    print("load average after:  {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
