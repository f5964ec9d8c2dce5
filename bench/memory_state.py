"""What a fleet's steady-state collector memory is made of, structure by structure, in-process.

    .venv/bin/python -m bench.memory_state [--targets 1000] [--rounds 4] [--models 7 --gpus 2]
        [--tracemalloc] [--metrics [--busy 4]]

Feeds ``--rounds`` scrapes of each simulated target (``tests.payloads.Template``, as
``bench.fleet`` serves them) through the collector's own ingestion (``Collector._ingest``: the
shape, the deriver, the latest values, the store buffer) and a flush of a SQLite store after each
round, without HTTP or a scheduler, then prints the process's RSS and the size of each
long-lived structure (objects reachable from it, each object counted once, for the first
structure listed that reaches it; numpy arrays by their data).  Much faster than
``bench.fleet`` for seeing what a change to per-target state saves; the RSS of the real server
adds the API, the scheduler and the transient peaks (``bench.fleet`` measures those).

``--metrics`` then renders the collector's own /metrics of that state (the live SLIs), as the
API streams it (``api.exporter.exposition``) and, for reference, whole (``generate_latest`` of
every family at once, as the API did before stop 31): CPU, bytes, and the peak that
``tracemalloc`` sees while each renders; then serves the API (uvicorn, as ``serve`` does) and
reads /metrics over HTTP while asking /healthz every 5 ms: how long the read takes and the
longest /healthz answer (how long the event loop stalled), with ``--busy`` threads running
pure Python beside it (a collector busy parsing its fleet's scrapes holds the GIL as much).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
import tracemalloc
import types
from collections.abc import Iterable
from typing import Any

import numpy as np
import uvicorn
from prometheus_client import CollectorRegistry, generate_latest

from bench.common import http_get, wait_until
from tests.fixtures_pg import _free_port
from tests.payloads import Template
from tritonwatch import memory
from tritonwatch.api.app import create_app
from tritonwatch.api.exporter import Live, exposition, install_exporter
from tritonwatch.collector import parse
from tritonwatch.collector.derive import accumulate
from tritonwatch.collector.jobs import Collector
from tritonwatch.schemas.config import Config
from tritonwatch.store import Store, open_store

_MIB = 1024 * 1024
_ATOMIC = (int, float, bool, type(None), complex)


def deep_size(roots: Iterable[Any], seen: set[int]) -> int:
    """Bytes of everything reachable from ``roots`` not already in ``seen`` (which it fills)."""
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        # Modules are the program's, not a structure's: through a driver's ``dbapi`` module a
        # store would reach every module's globals, and the whole process with them.
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)) or (
                callable(obj) and not hasattr(
            obj, "__dict__"
        )):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            # An array owning its data counts it in its size; a view counts its base (once:
            # the rows of one 2-D array are not its bytes as many times over).
            total += sys.getsizeof(obj)
            if obj.base is not None:
                stack.append(obj.base)
            continue
        total += sys.getsizeof(obj)
        if isinstance(obj, (str, bytes, *_ATOMIC)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            d = getattr(obj, "__dict__", None)
            if d is not None:
                stack.append(d)
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if slot in ("__dict__", "__weakref__"):
                        continue
                    try:
                        stack.append(getattr(obj, slot))
                    except AttributeError:
                        pass
    return total


def _rss() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * 4096 / _MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--targets", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--models", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also list the top allocation lines after the last round")
    parser.add_argument("--metrics", action="store_true",
                        help="then render /metrics of that state, streamed and whole")
    parser.add_argument("--busy", type=int, default=4,
                        help="threads of pure Python while /metrics is read over HTTP")
    args = parser.parse_args()
    memory.tune_malloc()
    if args.tracemalloc:
        tracemalloc.start()
    rss0, blocks0 = _rss(), sys.getallocatedblocks()
    templates = [Template(i, args.models, args.gpus) for i in range(args.targets)]
    with tempfile.TemporaryDirectory(prefix="tw-memstate-") as tmp:
        config = Config.model_validate({
            "version": 1,
            "targets": [{"name": f"triton-{i}", "metrics_url": f"http://127.0.0.1:1/t/{i}/metrics"}
                        for i in range(args.targets)],
            "store": {"url": f"sqlite:///{tmp}/tw.db"},
        })
        store = open_store(config.store.url)
        store.migrations.apply()
        collector = Collector(config, store)
        memory.tune_gc()
        now = time.time() - 15 * args.rounds
        t0 = time.process_time()
        for step in range(args.rounds):
            for i, state in enumerate(collector.targets.values()):
                text = templates[i].render(step).decode()
                collector._ingest(state, text, now, time.perf_counter())
            if step < args.rounds - 1:
                store.flush()
            now += 15
        cpu = time.process_time() - t0
        del text
        gc.collect()
        memory.release_free_memory()
        rep = memory.report()
        print(f"{args.targets} targets x {len(templates[0].render(0).splitlines())} lines, "
              f"{args.rounds} rounds ({cpu:.1f} s CPU): RSS {_rss():.0f} MiB ({rss0:.0f} at "
              f"start, templates included); malloc heap {rep.heap / _MIB:.0f} MiB "
              f"({rep.heap_used / _MIB:.0f} in use), {rep.mapped / _MIB:.0f} MiB mapped; "
              f"{rep.python_blocks - blocks0:,} more blocks in CPython's arenas")
        del templates
        states = list(collector.targets.values())
        writer = store._writer
        seen: set[int] = set()
        parts: list[tuple[str, Iterable[Any]]] = [
            ("parse: shared names/pairs/label sets", [parse._NAMES, parse._PAIRS,
                                                      parse._LABELSETS]),
            ("parse: head cache", [parse._HEAD_CACHE]),
            ("derive: shared plan keys", [accumulate._SHARED]),
            ("shapes (names, labels, spans, matcher)", [s.shape for s in states]),
            ("last scrape values + derived", [s.last_scrape for s in states]),
            ("stored series lists", [s._stored for s in states]),
            ("derivers (plans, baselines)", [s.deriver for s in states]),
            ("latest values (/metrics)", [collector.latest]),
            ("target states, rest", states),
            ("store: layouts", [writer._layouts]),
            ("store: buffered scrape", [store._samples]),
        ]
        print(f"{'structure':<42} {'MiB':>7} {'KiB/target':>10}")
        for name, roots in parts:
            size = deep_size(roots, seen)
            print(f"{name:<42} {size / _MIB:7.1f} {size / 1024 / args.targets:10.1f}")
        if args.tracemalloc:
            stats = tracemalloc.take_snapshot().statistics("lineno")
            for stat in stats[:30]:
                frame = stat.traceback[0]
                print(f"  {stat.size / _MIB:7.2f} MiB {stat.count:8d} blocks "
                      f"{frame.filename}:{frame.lineno}")
        if args.metrics:
            render_metrics(collector)
            serve_metrics(collector, store, args.busy)
        store.close()


def render_metrics(collector: Collector) -> None:
    """/metrics of the collector's latest values, streamed then whole (module docstring)."""
    registry = CollectorRegistry()
    exporter = install_exporter(registry, Live(latest=collector.latest), process=False)

    def streamed() -> int:  # what the server writes to the socket, piece by piece
        return sum(len(piece) for piece in exposition(registry, exporter))

    def whole() -> int:
        return len(generate_latest(exporter) + generate_latest(registry))

    for name, render in (("streamed", streamed), ("whole", whole)):
        cpu = []
        for _ in range(3):
            t0 = time.process_time()
            size = render()
            cpu.append(time.process_time() - t0)
        traced = tracemalloc.is_tracing()
        if not traced:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        render()
        peak = tracemalloc.get_traced_memory()[1] - base
        if not traced:
            tracemalloc.stop()
        print(f"/metrics {name:<8}: {size / _MIB:5.1f} MiB of text, "
              f"{sorted(cpu)[1] * 1000:6.0f} ms CPU (median of 3), peak "
              f"{peak / _MIB:5.1f} MiB allocated (tracemalloc), RSS now {_rss():.0f} MiB")


def serve_metrics(collector: Collector, store: Store, busy: int) -> None:
    """/metrics over HTTP, idle then beside ``busy`` threads (module docstring)."""
    app = create_app(store, live=Live(latest=collector.latest))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(base + "/healthz", timeout=5), 30, "the API to answer")
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(10_000):
                x += i

    try:
        for label, threads in (("idle", 0), (f"{busy} busy threads", busy)):
            spinners = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
            for t in spinners:
                t.start()
            latencies: list[float] = []
            done = threading.Event()

            def ping(done: threading.Event = done, latencies: list[float] = latencies) -> None:
                while not done.is_set():
                    t0 = time.perf_counter()
                    http_get(base + "/healthz", timeout=60)
                    latencies.append(time.perf_counter() - t0)
                    time.sleep(0.005)

            pinger = threading.Thread(target=ping)
            pinger.start()
            t0 = time.perf_counter()
            size = len(http_get(base + "/metrics", timeout=120))
            took = time.perf_counter() - t0
            done.set()
            pinger.join(60)
            stop.set()
            for t in spinners:
                t.join(10)
            stop.clear()
            print(f"/metrics over HTTP, {label}: {size / _MIB:.1f} MiB in {took:.2f} s; "
                  f"/healthz answered {len(latencies)} times meanwhile, the slowest in "
                  f"{max(latencies, default=0) * 1000:.0f} ms")
    finally:
        server.should_exit = True


if __name__ == "__main__":
    main()
