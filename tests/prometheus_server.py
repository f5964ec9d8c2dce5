"""A real Prometheus (Debian package ``prometheus``) for tests: started on a free port with a
scrape configuration, stopped afterwards, queried through its own HTTP API."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.serving import terminate

INSTALL_HINT = "install Debian's prometheus package (apt-get install prometheus)"


def find_prometheus() -> str:
    for candidate in (os.environ.get("PROMETHEUS_BIN"), shutil.which("prometheus"),
                      "/usr/bin/prometheus"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(f"no prometheus binary: {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape_config(jobs: list[dict[str, Any]], interval: str = "1s") -> str:
    """A prometheus.yml scraping ``jobs`` (``{"job_name", "targets", ...extra keys}``)."""
    import yaml

    return yaml.safe_dump({
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": j["job_name"], "scrape_interval": interval,
             **{k: v for k, v in j.items() if k not in ("job_name", "targets")},
             "static_configs": [{"targets": j["targets"]}]}
            for j in jobs],
    })


class Prometheus:
    def __init__(self, url: str, log_path: Path) -> None:
        self.url = url
        self.log_path = log_path
        self.http = httpx.Client(base_url=url, timeout=30)

    def api(self, path: str, **params: Any) -> Any:
        r = self.http.get(f"/api/v1/{path}", params=params)
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def wait_for(self, check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.5)
        raise AssertionError(f"prometheus: timed out waiting for {what}; log:\n"
                             + self.log_path.read_text(errors="replace")[-3000:])


@contextmanager
def run_prometheus(config: str, workdir: Path, timeout: float = 60.0) -> Iterator[Prometheus]:
    binary = find_prometheus()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(config)
    port = free_port()
    log_path = workdir / "prometheus.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([
            binary, f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ], stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError("prometheus exited: "
                                   + log_path.read_text(errors="replace")[-2000:])
            try:
                if prom.http.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready")
            time.sleep(0.2)
        yield prom
    finally:
        prom.http.close()
        terminate(proc, 20)
