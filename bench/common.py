"""Shared pieces of the side-by-side benchmarks: a simulated Triton fleet, process accounting.

The fleet runs in a **separate process** (its CPU is in no figure): one ``ThreadingHTTPServer``
on 127.0.0.1 serving ``/t/<i>/metrics`` for target ``i``.  Each target is its own server shape
(``tests.payloads.triton_payload(seed=i)``: its own GPU UUIDs, rates and series order), turned
into a template once: the series are listed in the same order on every scrape, as Triton's
prometheus-cpp does (``triton_payload`` itself reshuffles series inside a family per step), and
counter values advance linearly with the number of requests that target has answered (step
``n`` prints ``v0 + n * (v1 - v0)`` from the payloads of steps 0 and 1; gauges keep their step-0
value), so every scrape of every scraper sees counters grow.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

from tests.payloads import Template
from tritonwatch.collector.parse import parse
from tritonwatch.schemas.samples import label_value

__all__ = [
    "Fleet",
    "Template",
    "fleet_models",
    "http_get",
    "peak_rss_mib",
    "process_tree_cpu",
    "rss_mib",
    "simulated_fleet",
]


def _serve(conn: Connection, targets: int, models: int, gpus: int) -> None:
    templates = [Template(i, models, gpus) for i in range(targets)]
    steps = [0] * targets
    served = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as prometheus-cpp

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) == 3 and parts[0] == "t" and parts[2] == "metrics":
                i = int(parts[1])
                with lock:
                    step = steps[i]
                    steps[i] += 1
                    served[0] += 1
                self._send(templates[i].render(step))
            elif parts == ["served"]:
                self._send(str(served[0]).encode())
            elif parts == ["reset"]:  # every target back to step 0
                with lock:
                    steps[:] = [0] * targets
                self._send(b"ok\n")
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

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a scraper dropping a connection at shutdown is not news

    server = Server(("127.0.0.1", 0), Handler)
    size = len(templates[0].render(0)) if templates else 0
    conn.send((server.server_address[1], templates[0].series if templates else 0, size))
    server.serve_forever()


@dataclass
class Fleet:
    port: int
    pid: int
    series: int  # per target
    payload_bytes: int

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/t/{i}/metrics"

    def path(self, i: int) -> str:
        return f"/t/{i}/metrics"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def served(self) -> int:
        return int(http_get(f"http://127.0.0.1:{self.port}/served"))

    def reset(self) -> None:
        """Start every target's counters over (the same payload sequence again)."""
        http_get(f"http://127.0.0.1:{self.port}/reset")


@contextmanager
def simulated_fleet(targets: int, *, models: int = 20, gpus: int = 8) -> Iterator[Fleet]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, targets, models, gpus), daemon=True)
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("simulated Triton fleet did not start within 600 s")
        port, series, size = parent.recv()
        assert proc.pid is not None
        yield Fleet(port, proc.pid, series, size)
    finally:
        proc.terminate()
        proc.join(10)


# --- CPU accounting -----------------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[int, float, float] | None:
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
    own = proc_stat(root)
    if own is None:
        return 0.0
    total = own[1] + own[2]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != root:
            st = proc_stat(int(entry))
            if st is not None and st[0] == root:
                total += st[1] + st[2]
    return total


def fleet_models(fleet: Fleet) -> list[str]:
    """The model names the fleet's targets expose (for ``max_batch_size`` in configs)."""
    families = parse(http_get(fleet.url(0)))
    return sorted({label_value(s.labels, "model") for f in families for s in f.samples} - {""})


def http_get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body: bytes = r.read()
    return body.decode()


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size (VmHWM) of ``pid`` so far, MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def reset_peak_rss(pid: int) -> bool:
    """Set ``pid``'s VmHWM back to its RSS now (Linux: ``5`` into ``/proc/PID/clear_refs``), so
    that a later :func:`peak_rss_mib` is the peak since; False where that is not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_mib(pid: int) -> float:
    return _status_kib(pid, "VmRSS") / 1024


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def cpu_count() -> int:
    return os.cpu_count() or 1
