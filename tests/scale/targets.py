"""Simulated Triton targets for the scale tests and bench/remote_write.py: a real HTTP server
in a thread whose ``/metrics/<name>`` answers a Triton-shaped payload with counters that grow
on every scrape, so each scrape's samples differ from the last, and which counts the scrapes of
each target (``hits``) with their arrival time and the cluster member that sent it (``scrapers``,
from tritonwatch's ``X-Tritonwatch-Member`` header), so a test can tell who scraped what when.

``models`` and ``gpus`` size each payload: 6 counter families per model and 4 gauges per GPU.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

from tests.serving import QuietHandler, serving
from tritonwatch.collector.scrape import MEMBER_HEADER

_COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure",
             "nv_inference_count", "nv_inference_exec_count",
             "nv_inference_request_duration_us", "nv_inference_queue_duration_us")
_GAUGES = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
           "nv_inference_pending_request_count")


def payload(scrape: int, models: int, gpus: int) -> str:
    lines = []
    for family in _COUNTERS:
        lines.append(f"# HELP {family} simulated\n# TYPE {family} counter")
        for m in range(models):
            lines.append(f'{family}{{model="model_{m}",version="1"}} {scrape * (m + 1) * 10}')
    for family in _GAUGES:
        lines.append(f"# HELP {family} simulated\n# TYPE {family} gauge")
        for g in range(gpus):
            lines.append(f'{family}{{gpu_uuid="GPU-{g:04d}"}} {(scrape * 7 + g) % 100}')
    return "\n".join(lines) + "\n"


class _Handler(QuietHandler):
    server: _Server

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        with self.server.lock:
            now = time.time()
            self.server.hits[name].append((now, self.headers.get("User-Agent", "")))
            self.server.members[name].append((now, self.headers.get(MEMBER_HEADER, "")))
            scrape = self.server.scrapes[name] = self.server.scrapes[name] + 1
            broken = name in self.server.broken
        body = b"broken on purpose" if broken else payload(
            scrape, self.server.models, self.server.gpus).encode()
        self.send_response(500 if broken else 200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    lock: threading.Lock
    hits: defaultdict[str, list[tuple[float, str]]]
    members: defaultdict[str, list[tuple[float, str]]]
    scrapes: defaultdict[str, int]
    models: int
    gpus: int
    broken: set[str]


class SimulatedTargets:
    def __init__(self, server: _Server) -> None:
        self.server = server
        host, port = server.server_address[:2]
        self.base = f"http://{host!s}:{port}"

    def url(self, name: str) -> str:
        return f"{self.base}/metrics/{name}"

    def set_broken(self, name: str, broken: bool) -> None:
        """``name`` answers 500 (a target that is down) until set back."""
        with self.server.lock:
            (self.server.broken.add if broken else self.server.broken.discard)(name)

    def hits(self, name: str) -> list[tuple[float, str]]:
        with self.server.lock:
            return list(self.server.hits[name])

    def scrapers(self, name: str) -> list[tuple[float, str]]:
        """(arrival time, member name or "") of each scrape of ``name``."""
        with self.server.lock:
            return list(self.server.members[name])


@contextmanager
def simulated_targets(models: int = 3, gpus: int = 2) -> Iterator[SimulatedTargets]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.lock = threading.Lock()
    server.hits = defaultdict(list)
    server.members = defaultdict(list)
    server.scrapes = defaultdict(int)
    server.models, server.gpus = models, gpus
    server.broken = set()
    with serving(server):
        yield SimulatedTargets(server)
