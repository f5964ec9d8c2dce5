"""Real remote-write receivers for tests and bench/remote_write.py: Debian's
``victoria-metrics`` (single node; the same write and query APIs as the cluster's vminsert and
vmselect) and ``prometheus`` 2.42 with ``--web.enable-remote-write-receiver``.

Both are queried with PromQL through their HTTP API.  ``raw_samples`` asks for a range vector
at an instant (``name{...}[window]``), which both answer with the raw samples as stored.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.prometheus_server import free_port
from tests.serving import terminate

VM_INSTALL_HINT = "install Debian's victoria-metrics package (apt-get install victoria-metrics)"
PROM_INSTALL_HINT = "install Debian's prometheus package (apt-get install prometheus)"


def find_binary(name: str, hint: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK)
                                   else None)
    if found is None:
        raise RuntimeError(f"no {name} binary: {hint}")
    return found


class Receiver:
    """A receiver process; ``stop()`` and ``start()`` again keep its data (same directory)."""

    kind = ""
    write_path = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"{self.kind}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=30)

    @property
    def write_url(self) -> str:
        return self.url + self.write_path

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: " + self.log_tail())
            try:
                if self.http.get(self.ready_path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind} did not become ready: " + self.log_tail())
            time.sleep(0.2)

    ready_path = "/-/ready"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        terminate(proc, 30)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def flush(self) -> None:
        """Make what was written visible to queries (VictoriaMetrics buffers it briefly)."""

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = self.http.get("/api/v1/query", params=params)
        body = r.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def raw_samples(self, selector: str, start: float, end: float
                    ) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
        """Every stored sample of the series matching ``selector`` in (start, end]:
        {sorted labels: [(ms, value), ...]}."""
        self.flush()
        window = max(1, int(end - start) + 1)
        out: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
        for series in self.query(f"{selector}[{window}s]", at=end):
            key = tuple(sorted(series["metric"].items()))
            out[key] = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
        return out

    def close(self) -> None:
        self.stop()
        self.http.close()


class VictoriaMetrics(Receiver):
    kind = "victoria-metrics"
    write_path = "/api/v1/write"
    ready_path = "/health"

    def command(self) -> list[str]:
        return [find_binary("victoria-metrics", VM_INSTALL_HINT),
                f"-storageDataPath={self.workdir / 'data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                # Queries see a sample at once (default: only after 30 s), uncached.
                "-search.latencyOffset=0s", "-search.disableCache",
                "-retentionPeriod=100y", "-loggerLevel=ERROR"]

    def flush(self) -> None:
        self.http.get("/internal/force_flush")


class PrometheusReceiver(Receiver):
    kind = "prometheus"
    write_path = "/api/v1/write"

    def command(self) -> list[str]:
        config = self.workdir / "prometheus.yml"
        if not config.exists():
            config.write_text("global: {scrape_interval: 15s}\n")
        return [find_binary("prometheus", PROM_INSTALL_HINT), f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                "--web.enable-remote-write-receiver"]


@contextmanager
def running(receiver: Receiver) -> Iterator[Receiver]:
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()
