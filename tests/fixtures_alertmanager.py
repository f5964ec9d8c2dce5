"""pytest plugin: a real Alertmanager (Debian's ``prometheus-alertmanager``) for the session.

Loaded from ``tests/conftest.py``.  The server listens on a free loopback port with clustering
off and a temporary config:

- route ``group_by: [alertname]``, ``group_wait 1s``, ``group_interval 2s``,
  ``repeat_interval 1h``;
- default receiver ``recorder``: a webhook to a small HTTP server in a thread
  (:class:`WebhookRecorder`) that keeps every payload;
- alerts labelled ``tw_route="receiver"`` go to receiver ``tritonwatch`` instead: our own
  FastAPI receiver (api/receiver.py) served by uvicorn in a thread, with a bearer token, whose
  stored events land in ``alertmanager.received_events``.

Tests isolate themselves by a unique ``alertname`` (one group each) and wait with
``recorder.wait_for(...)``.  ``stop()``, ``start()`` and ``restart()`` play an Alertmanager
outage.  A missing binary fails the tests with the apt-get line to fix it; it never skips.

End-to-end tests (tests/e2e) need an Alertmanager whose webhook points at a receiver that runs
elsewhere (``tritonwatch serve``'s own ``/api/v1/alertmanager/webhook``):
:func:`forwarding_alertmanager` starts one with a single receiver ``tritonwatch`` that posts every
notification both to that URL (bearer token) and to a :class:`WebhookRecorder`, so a test sees
exactly what the product's receiver was sent, even while that receiver is down.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.serving import QuietHandler
from tritonwatch.api.receiver import receiver_router
from tritonwatch.schemas.alerting import ReceiverConfig
from tritonwatch.schemas.alerts import AlertEvent

INSTALL_HINT = (
    "Alertmanager was not found. Install it with `apt-get install prometheus-alertmanager` "
    "(Debian/Ubuntu), or point $ALERTMANAGER_BIN at an alertmanager binary."
)
RECEIVER_TOKEN = "am-fixture-token-0123456789abcdef"


class AlertmanagerUnavailable(RuntimeError):
    """The Alertmanager binary is missing or did not become ready."""


def find_binary() -> str:
    for candidate in (os.environ.get("ALERTMANAGER_BIN"), shutil.which("prometheus-alertmanager"),
                      shutil.which("alertmanager"), "/usr/bin/prometheus-alertmanager"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AlertmanagerUnavailable(INSTALL_HINT)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- the webhook recorder ---------------------------------------------------------------------

class _RecorderHandler(QuietHandler):
    server: _RecorderServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        with self.server.cond:
            self.server.payloads.append(json.loads(body))
            self.server.cond.notify_all()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        # No keep-alive: an idle connection left open at shutdown is an unclosed socket
        # (ResourceWarning, an error under filterwarnings=error).
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()


class _RecorderServer(ThreadingHTTPServer):
    daemon_threads = True
    payloads: list[dict[str, Any]]
    cond: threading.Condition


class WebhookRecorder:
    """Keeps every webhook payload POSTed to it; ``wait_for`` polls them with a deadline."""

    def __init__(self) -> None:
        self._server = _RecorderServer(("127.0.0.1", 0), _RecorderHandler)
        self._server.payloads = []
        self._server.cond = threading.Condition()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def payloads(self) -> list[dict[str, Any]]:
        with self._server.cond:
            return list(self._server.payloads)

    def for_alertname(self, alertname: str) -> list[dict[str, Any]]:
        return [p for p in self.payloads if p.get("groupLabels", {}).get("alertname") == alertname]

    def wait_for(
        self, alertname: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15.0
    ) -> dict[str, Any]:
        """The first payload of ``alertname``'s group that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._server.cond:
            while True:
                for payload in self._server.payloads:
                    if (payload.get("groupLabels", {}).get("alertname") == alertname
                            and predicate(payload)):
                        return payload
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [p for p in self._server.payloads
                            if p.get("groupLabels", {}).get("alertname") == alertname]
                    raise AssertionError(
                        f"no matching webhook for {alertname!r} within {timeout}s; got {seen}")
                self._server.cond.wait(left)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- our own receiver, served for Alertmanager --------------------------------------------------

class MemorySink:
    """An AlertEventSink that keeps events in memory (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[AlertEvent] = []

    def append_events(self, events: Sequence[AlertEvent]) -> int:
        with self._lock:
            self.events.extend(events)
        return len(events)

    def snapshot(self) -> list[AlertEvent]:
        with self._lock:
            return list(self.events)


class ReceiverServer:
    """api/receiver.py's router behind uvicorn in a thread."""

    def __init__(self) -> None:
        self.sink = MemorySink()
        app = FastAPI()
        app.include_router(receiver_router(ReceiverConfig(token=RECEIVER_TOKEN), self.sink))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1/alertmanager/webhook"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", ws="none", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn receiver did not start")
            time.sleep(0.02)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


# --- Alertmanager ---------------------------------------------------------------------------

CONFIG_TEMPLATE = """\
route:
  receiver: recorder
  group_by: [alertname]
  group_wait: 1s
  group_interval: 2s
  repeat_interval: 1h
  routes:
    - receiver: tritonwatch
      matchers: ['tw_route="receiver"']
receivers:
  - name: recorder
    webhook_configs:
      - url: {recorder_url}
        send_resolved: true
  - name: tritonwatch
    webhook_configs:
      - url: {receiver_url}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: {token}
"""


#: Every alert to receiver ``tritonwatch``: a webhook to ``forward_url`` (bearer ``token``) and
#: one to the recorder, with the same grouping and timings as above.
FORWARD_CONFIG_TEMPLATE = """\
route:
  receiver: tritonwatch
  group_by: [alertname]
  group_wait: 1s
  group_interval: 2s
  repeat_interval: 1h
receivers:
  - name: tritonwatch
    webhook_configs:
      - url: {forward_url}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: {token}
      - url: {recorder_url}
        send_resolved: true
"""


class AlertmanagerServer:
    """One Alertmanager process; ``url`` is its base URL (``http://127.0.0.1:PORT``).

    With ``forward_to`` (a webhook URL) every alert goes to receiver ``tritonwatch``, which
    posts it to ``forward_to`` with the bearer ``token`` and to ``recorder``; ``receiver`` may
    then be None (``received_events`` is empty).
    """

    def __init__(self, binary: str, workdir: Path, recorder: WebhookRecorder,
                 receiver: ReceiverServer | None, *, forward_to: str | None = None,
                 token: str = RECEIVER_TOKEN) -> None:
        self.binary = binary
        self.workdir = workdir
        self.recorder = recorder
        self.receiver = receiver
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "alertmanager.yml"
        if forward_to is not None:
            text = FORWARD_CONFIG_TEMPLATE.format(
                forward_url=forward_to, recorder_url=recorder.url, token=token)
        elif receiver is not None:
            text = CONFIG_TEMPLATE.format(
                recorder_url=recorder.url, receiver_url=receiver.url, token=token)
        else:
            raise ValueError("give a ReceiverServer or forward_to")
        self.config_path.write_text(text)
        self.log_path = workdir / "alertmanager.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def received_events(self) -> list[AlertEvent]:
        """What our receiver stored from Alertmanager's ``tritonwatch`` receiver."""
        return [] if self.receiver is None else self.receiver.sink.snapshot()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 20.0) -> None:
        if self.running:
            return
        cmd = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.external-url={self.url}",
            "--cluster.listen-address=",  # no gossip port: one instance, nothing to collide
            "--log.level=warn",
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise AlertmanagerUnavailable(
                    f"alertmanager exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AlertmanagerUnavailable(f"alertmanager not ready in {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: what Alertmanager holds now."""
        response = httpx.get(f"{self.url}/api/v2/alerts", timeout=5.0)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextmanager
def forwarding_alertmanager(forward_to: str, token: str) -> Iterator[AlertmanagerServer]:
    """A fresh Alertmanager (own process, port and data) whose every notification goes to the
    webhook ``forward_to`` with ``Authorization: Bearer <token>`` and to ``.recorder``.

    The caller's receiver may start later or be down for a while: Alertmanager retries.
    """
    try:
        binary = find_binary()
    except AlertmanagerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    recorder = WebhookRecorder()
    try:
        with tempfile.TemporaryDirectory(prefix="tw-alertmanager-") as tmp:
            server = AlertmanagerServer(binary, Path(tmp), recorder, None,
                                        forward_to=forward_to, token=token)
            try:
                server.start()
            except AlertmanagerUnavailable as exc:
                pytest.fail(str(exc), pytrace=False)
            try:
                yield server
            finally:
                server.stop()
    finally:
        recorder.close()


@pytest.fixture(scope="session")
def alertmanager() -> Iterator[AlertmanagerServer]:
    """A running Alertmanager; tests that stop it must start it again (``restart``)."""
    try:
        binary = find_binary()
    except AlertmanagerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    recorder = WebhookRecorder()
    receiver = ReceiverServer()
    with tempfile.TemporaryDirectory(prefix="tw-alertmanager-") as tmp:
        server = AlertmanagerServer(binary, Path(tmp), recorder, receiver)
        try:
            server.start()
        except AlertmanagerUnavailable as exc:
            recorder.close()
            receiver.close()
            pytest.fail(str(exc), pytrace=False)
        try:
            yield server
        finally:
            server.stop()
            recorder.close()
            receiver.close()


@pytest.fixture
def running_alertmanager(alertmanager: AlertmanagerServer) -> AlertmanagerServer:
    """The session Alertmanager, started again if an earlier test left it stopped."""
    alertmanager.start()
    return alertmanager
