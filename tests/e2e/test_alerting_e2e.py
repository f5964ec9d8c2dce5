"""End to end on the real rig (issue 5, "What it must show").

Every test runs the real pieces: the session's tritonserver rig (``tests/fixtures_rig.py``),
``tritonwatch serve`` as a subprocess with a YAML config and a rules file (scrapes every second,
a gRPC probe of ``fake_llm`` every second, rules evaluated every second), and a real Alertmanager
0.25 whose only receiver is a webhook to serve's own ``POST /api/v1/alertmanager/webhook``
(bearer token) plus a recorder (``forwarding_alertmanager`` in tests/fixtures_alertmanager.py).
So each alert makes the whole trip: rig -> scrape/probe -> store -> rule -> engine -> dispatcher
-> Alertmanager -> webhook -> serve's receiver -> store.

What is asserted is read from the outside: what Alertmanager holds (``GET /api/v2/alerts``), what
it posted (the recorder), and what serve stored (its SQLite file, read through
``store.alerts.AlertStore``: the engine's transitions, source ``engine``, and the webhooks its
receiver got back, source ``alertmanager:tritonwatch``).

The rules file uses the product's own rule kinds with windows of seconds instead of minutes so
that the module stays within a few minutes on two cores; the built-in defaults stay enabled (their
windows are minutes long, so they must stay quiet here, which the steady test checks too).

Scenarios 1-4 share one serve process and one Alertmanager (``TestOneServe``, in order: the
steady test's 20 s are the TTFT baseline); the restart and the Alertmanager outage each get their
own, with their own store.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.fixtures_alertmanager import AlertmanagerServer, forwarding_alertmanager, free_port
from tritonwatch.loadgen import LoadGenerator
from tritonwatch.rig import CONTROL_DEFAULTS, TritonRig
from tritonwatch.schemas.alerts import AlertEvent, AlertState
from tritonwatch.store import Query, open_store
from tritonwatch.store.alerts import AlertStore

pytestmark = pytest.mark.triton

log = logging.getLogger(__name__)

T = TypeVar("T")

EXE = Path(sys.executable).with_name("tritonwatch")
TOKEN = "e2e-receiver-token-0123456789abcdef"
RECEIVED = "alertmanager:tritonwatch"  # source of the events serve's receiver stored
ENGINE = "engine"

#: How long Alertmanager stays down in the outage test.  Issue 5 says two minutes; nothing in
#: the mechanism depends on the length (the dispatcher keeps what it could not deliver due and
#: retries it at every evaluation, resolved alerts for ``resolved_retention`` = 15 min), so the
#: default keeps the module short.  ``TW_E2E_AM_OUTAGE_S=120`` runs the full two minutes (the
#: test then takes about 2.5 min; pytest's 300 s per-test timeout still holds).
AM_OUTAGE_S = float(os.environ.get("TW_E2E_AM_OUTAGE_S", "25"))

EVAL_S = 1.0
RESEND_S = 3.0  # alerting.resend_delay: firing alerts re-sent every 3 s, endsAt = now + 12 s

KV = "E2EKVCacheSaturation"
TTFT_HIGH = "E2ETTFTHigh"
TTFT_REGRESSION = "E2ETTFTRegression"
FILL_REGRESSION = "E2EBatchFillRateRegression"

FILL_BASELINE_S = 20.0


def _threshold_alert(
    name: str, series: str, window: str, op: str, threshold: float, keep_firing_for: str,
    severity: str, summary: str, match: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One `alerts:` entry: the average over `window`, true for 2 s."""
    return {"name": name, "series": series, **({"match": match} if match else {}), "agg": "avg",
            "window": window, "op": op, "threshold": threshold, "for": "2s",
            "keep_firing_for": keep_firing_for, "labels": {"severity": severity},
            "annotations": {"summary": summary}}


# Windows of seconds: a 1 s step and a 6 s recent window give 6-7 points, a median that moves
# after 3-4 s of a fault; `for` 2 s; keep_firing_for covers a restart's gap in the scrapes.
# The TTFT regression keeps its load guard (fake_llm's request rate): the class's LLM traffic is
# paced, so a slower first token does not change the load.  E2ETTFTHigh, a plain threshold on
# the same probe series, fires with it in the TTFT test and is the alert of the outage test.
ALERTS = [
    _threshold_alert(KV, "sli:kv_cache_utilization", "4s", ">=", 0.9, "4s", "warning",
                     "KV cache {value:.0%} full on {labels[model]}"),
    _threshold_alert(TTFT_HIGH, "probe:ttft_seconds", "3s", ">", 0.25, "3s", "page",
                     "probe TTFT {value:.3f}s > {threshold}s", match={"probe": "llm"}),
]
RULES = "version: 1\n" + yaml.safe_dump({"alerts": ALERTS}, sort_keys=False) + f"""\
regressions:
  - name: {TTFT_REGRESSION}
    series: probe:ttft_seconds
    by: [probe, model]
    direction: up
    # Probe runs (1 s apart) can be delayed on a loaded 2-core machine: a 10 s recent window
    # still holds enough of them for a verdict (min_points).
    recent_window: 10s
    min_points: 4
    baseline_window: 60s
    step: 1s
    # A slower first token also slows the paced LLM clients down (their requests take
    # longer), so load may fall by up to ~40 % here: the effect asked for is wide.
    min_effect: 1.0
    alpha: 0.01
    # As the built-in rule: TTFT does not fall when load rises.  Unbounded, a warm-up on a
    # loaded machine (first tokens slow while the clients ramp up) fits a falling slope, and
    # the steady TTFT then looked 3.9x what that slope predicted at the later load.
    elasticity: [0, .inf]
    for: 2s
    keep_firing_for: 3s
    labels: {{severity: warning}}
  - name: {FILL_REGRESSION}
    series: sli:batch_fill_rate
    match: {{model: batcher}}
    direction: down
    recent_window: 6s
    baseline_window: {FILL_BASELINE_S:g}s
    step: 1s
    min_effect: 0.3
    alpha: 0.01
    load_series: sli:request_rate
    # As the built-in rule: a batch fills at most in proportion to what arrives.  Unbounded,
    # the slope fitted on a 20 s baseline at one steady rate is anything, and the detector
    # rightly gives no verdict once a loaded machine lets the open loop's rate drift by 2 %.
    elasticity: [0, 1]
    for: 2s
    keep_firing_for: 3s
    labels: {{severity: warning}}
defaults: {{enabled: true}}
"""

# The rig's fault levels.
SLOW_TTFT_MS = 500.0  # vs 40 ms: TTFT x12, still inside the probe's 1 s timeout
FULL_KV = 0.97  # vs 0.3
BATCHER_RATE = 40.0  # open loop, req/s
BATCHER_WORKERS = 24  # each sends every 0.6 s: far more than the latency, so the rate holds
BIG_BATCH_EXEC_MS = 150.0  # ~6 requests queue per execution: fill ~0.4
SMALL_BATCH_EXEC_MS = 2.0  # a request rarely finds another one waiting: fill ~0.1

FIRE_TIMEOUT = 40.0
RESOLVE_TIMEOUT = 40.0


# --- helpers ------------------------------------------------------------------------------------


def wait_until(what: str, check: Callable[[], T | None], timeout: float,
               diag: Callable[[], str] | None = None) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s\n{diag() if diag else ''}")
        time.sleep(0.25)


def instant(text: str) -> float:
    """Unix seconds of an RFC 3339 time as Alertmanager writes it (Go trims zeros)."""
    return datetime.fromisoformat(text).timestamp()


def serve_config(rig: TritonRig, db: Path, port: int, rules: Path, am_url: str) -> str:
    return f"""\
version: 1
targets:
  - name: rig
    metrics_url: {rig.metrics_url}
    http_url: {rig.http_url}
    grpc_url: {rig.grpc_url}
scrape: {{interval: 1s, timeout: 1s, api_interval: 2s}}
store: {{url: 'sqlite:///{db}', flush_interval: 1s}}
api: {{listen: '127.0.0.1:{port}'}}
probes:
  - {{name: llm, target: rig, model: fake_llm, protocol: grpc, interval: 1s, timeout: 1s,
      max_tokens: 4}}
alerting:
  rules_file: {rules}
  eval_interval: {EVAL_S:g}s
  alertmanagers: ['{am_url}']
  resend_delay: {RESEND_S:g}s
  timeout: 2s
  retry_budget: 1s
  external_url: http://127.0.0.1:{port}
  receiver: {{token: {TOKEN}}}
"""


class Serve:
    """``tritonwatch -v serve --config ...`` as a subprocess; its log goes to a file."""

    def __init__(self, workdir: Path, config: Path, port: int, db: Path) -> None:
        self.workdir = workdir
        self.config = config
        self.port = port
        self.db = db
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.starts = 0

    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"==== serve start {self.starts} at {time.time():.3f} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(EXE), "-v", "serve", "--config", str(self.config)],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise AssertionError(f"serve exited with {code} at start:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"serve not healthy in {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)
        self.started_at = time.monotonic()

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"serve ignored SIGTERM for 30 s:\n{self.log_tail()}") from None

    def wait_uptime(self, seconds: float) -> None:
        left = self.started_at + seconds - time.monotonic()
        if left > 0:
            time.sleep(left)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the log without the scheduler's and the scrapes' routine lines."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no serve log)"
        kept = [line for line in text.splitlines()
                if "apscheduler.executors" not in line and "HTTP Request: GET" not in line]
        return "\n".join(kept[-lines:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    # The store is SQLite in WAL mode: the test reads it while serve writes.
    def events(self, source: str | None = None) -> list[AlertEvent]:
        with open_store(f"sqlite:///{self.db}") as store:
            return AlertStore(store).events(source=source)

    def states(self) -> list[AlertState]:
        with open_store(f"sqlite:///{self.db}") as store:
            return AlertStore(store).states()


@dataclass
class Stack:
    rig: TritonRig
    serve: Serve
    am: AlertmanagerServer

    # --- what each place holds ---------------------------------------------------------------

    def engine_events(self, alertname: str, status: str | None = None) -> list[AlertEvent]:
        return [e for e in self.serve.events(ENGINE)
                if dict(e.labels).get("alertname") == alertname
                and (status is None or e.status == status)]

    def received(self, fingerprint: str, status: str | None = None) -> list[AlertEvent]:
        """What serve's receiver stored from Alertmanager's webhooks for ``fingerprint``."""
        return [e for e in self.serve.events(RECEIVED)
                if e.fingerprint == fingerprint and (status is None or e.status == status)]

    def am_active(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds as active with exactly these labels."""
        return [a for a in self.am.alerts()
                if a["labels"] == labels and a["status"]["state"] == "active"]

    def notifications(self, labels: dict[str, str], status: str) -> list[dict[str, Any]]:
        """Webhook payloads Alertmanager posted (recorder) carrying this alert as ``status``."""
        return [p for p in self.am.recorder.payloads
                if any(a["labels"] == labels and a["status"] == status for a in p["alerts"])]

    def diag(self) -> str:
        lines = ["--- engine events:"]
        try:
            lines += [f"  {e.status} {dict(e.labels).get('alertname')} starts={e.starts_at:.3f}"
                      f" ends={e.ends_at} src={e.source}" for e in self.serve.events()]
            lines.append("--- states:")
            lines += [f"  {s.status} {dict(s.labels).get('alertname')} fired={s.fired_at} "
                      f"resolved={s.resolved_at} sent={s.last_sent_at}"
                      for s in self.serve.states()]
        except Exception as exc:  # diagnostics must not hide the assertion
            lines.append(f"  (store unreadable: {exc!r})")
        lines.append("--- Alertmanager alerts:")
        try:
            lines += [f"  {a['labels'].get('alertname')} {a['status']['state']} "
                      f"starts={a['startsAt']} ends={a['endsAt']}" for a in self.am.alerts()]
        except Exception as exc:
            lines.append(f"  (unreachable: {exc!r})")
        lines.append("--- notifications (recorder):")
        for p in self.am.recorder.payloads:
            alerts = [(a["labels"].get("alertname"), a["status"]) for a in p["alerts"]]
            lines.append(f"  {p['status']} {alerts}")
        lines.append("--- series (last 70 s, 1 s buckets, oldest first):")
        try:
            lines += self.series_diag()
        except Exception as exc:
            lines.append(f"  (store unreadable: {exc!r})")
        lines.append(f"--- serve log:\n{self.serve.log_tail()}")
        lines.append(f"--- alertmanager log:\n{self.am.log_tail(10)}")
        return "\n".join(lines)

    def series_diag(self) -> list[str]:
        """What the regression rules read: the batcher's fill rate and request rate and the
        LLM probe's TTFT, so that a verdict that did not come can be judged from the data."""
        now = time.time()
        out = []
        with open_store(f"sqlite:///{self.serve.db}") as store:
            for series, match in (("sli:batch_fill_rate", {"model": "batcher"}),
                                  ("sli:request_rate", {"model": "batcher"}),
                                  ("probe:ttft_seconds", {"probe": "llm"})):
                for d in store.read(Query(series, start=now - 70, end=now, step=1.0, agg="avg",
                                          match=match)).series():
                    vals = " ".join(f"{v:.3g}" for v in d.values)
                    out.append(f"  {series} {dict(d.labels)}: {vals}")
        return out

    # --- the trip of one alert ---------------------------------------------------------------

    def expect_firing(self, alertname: str, timeout: float = FIRE_TIMEOUT) -> AlertEvent:
        """The engine fires ``alertname``, Alertmanager holds it with our labels and startsAt,
        and serve's receiver stores it back as firing.  Returns the engine's firing event."""
        (fired,) = wait_until(f"engine firing {alertname}",
                              lambda: self.engine_events(alertname, "firing"), timeout, self.diag)
        labels = dict(fired.labels)
        (held,) = wait_until(f"{alertname} active at Alertmanager",
                             lambda: self.am_active(labels), 15.0, self.diag)
        assert instant(held["startsAt"]) == pytest.approx(fired.starts_at, abs=1e-6)
        assert held["annotations"]["summary"]
        back = wait_until(f"{alertname} firing stored by the receiver",
                          lambda: self.received(fired.fingerprint, "firing"), 15.0, self.diag)
        assert back[0].labels == fired.labels
        assert back[0].starts_at == pytest.approx(fired.starts_at, abs=1e-6)
        assert back[0].ends_at is None  # Alertmanager's zero time for a firing alert
        return fired

    def expect_resolved(self, fired: AlertEvent, timeout: float = RESOLVE_TIMEOUT) -> AlertEvent:
        """The engine resolves ``fired``, Alertmanager no longer holds it as active, it
        notified the resolve, and serve's receiver stored it.  Returns the engine's event."""
        name = dict(fired.labels)["alertname"]
        (resolved,) = wait_until(
            f"engine resolved {name}",
            lambda: [e for e in self.engine_events(name, "resolved")
                     if e.fingerprint == fired.fingerprint], timeout, self.diag)
        assert resolved.starts_at == fired.starts_at and resolved.ends_at is not None
        back = wait_until(f"{name} resolve stored by the receiver",
                          lambda: self.received(fired.fingerprint, "resolved"), 15.0, self.diag)
        assert back[0].ends_at == pytest.approx(resolved.ends_at, abs=1e-6)
        assert back[0].starts_at == pytest.approx(fired.starts_at, abs=1e-6)
        labels = dict(fired.labels)
        wait_until(f"{name} gone from Alertmanager's active alerts",
                   lambda: not self.am_active(labels), 10.0, self.diag)
        assert self.notifications(labels, "resolved")
        return resolved

    def assert_one_page(self, fired: AlertEvent) -> None:
        """Exactly one firing notification and one firing engine transition for ``fired``."""
        labels = dict(fired.labels)
        engine = [e for e in self.serve.events(ENGINE)
                  if e.fingerprint == fired.fingerprint and e.status == "firing"]
        assert [e.starts_at for e in engine] == [fired.starts_at], self.diag()
        back = self.received(fired.fingerprint, "firing")
        assert len(back) == 1, self.diag()
        assert len(self.notifications(labels, "firing")) == 1, self.diag()


@contextmanager
def running_stack(rig: TritonRig, workdir: Path, rules: str = RULES) -> Iterator[Stack]:
    """Alertmanager (webhook -> serve's receiver) and serve (-> Alertmanager), both started."""
    port = free_port()
    with forwarding_alertmanager(f"http://127.0.0.1:{port}/api/v1/alertmanager/webhook",
                                 TOKEN) as am:
        rules_path = workdir / "rules.yaml"
        rules_path.write_text(rules)
        check = subprocess.run([str(EXE), "check-rules", str(rules_path)],
                               capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        db = workdir / "tw.db"
        config = workdir / "tw.yaml"
        config.write_text(serve_config(rig, db, port, rules_path, am.url))
        serve = Serve(workdir, config, port, db)
        serve.start()
        stack = Stack(rig, serve, am)
        try:
            yield stack
        finally:
            code = serve.stop()
        assert code == 0, serve.log_tail()
        # Nothing on the alert path failed: no rule, store write, delivery or webhook error.
        # (A job in flight at SIGTERM is cancelled by the scheduler with an ERROR traceback of
        # its own, from apscheduler.executors; that is not an alert-path failure.)
        errors = [line for line in serve.log_text().splitlines()
                  if re.search(r" ERROR (alerts|tritonwatch\.alerts|tritonwatch\.api)", line)]
        assert errors == [], serve.log_tail(200)


def no_alert_anywhere(stack: Stack) -> None:
    assert stack.am.alerts() == [], stack.diag()
    assert stack.am.recorder.payloads == [], stack.diag()
    assert stack.serve.events() == [], stack.diag()
    assert [s for s in stack.serve.states() if s.status != "pending"] == [], stack.diag()


# --- scenarios 1-4: one serve process ------------------------------------------------------------


def open_loop(rig: TritonRig) -> LoadGenerator:
    """Steady traffic: the batcher open loop at BATCHER_RATE, its workers started 1/rate apart
    so that requests arrive evenly (started together, they would arrive in bursts of 24, which
    Triton batches whatever the execution time), and fake_llm paced at 4 req/s."""
    load = LoadGenerator(rig.grpc_url, concurrency=1, rate=BATCHER_RATE, llm_concurrency=4,
                         llm_rate=4.0, max_duration=900.0)
    load.start()
    for workers in range(2, BATCHER_WORKERS + 1):
        time.sleep(1.0 / BATCHER_RATE)
        load.set(concurrency=workers)
    return load


@pytest.fixture(scope="class")
def shared(triton_rig: TritonRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack under steady load for the whole class (``open_loop``), plus serve's own probe
    at 1 req/s."""
    triton_rig.reset_control()
    load = open_loop(triton_rig)
    try:
        with running_stack(triton_rig, tmp_path_factory.mktemp("e2e-shared")) as stack:
            yield stack
    finally:
        load.stop()
        triton_rig.reset_control()


class TestOneServe:
    def test_a_steady_rig_produces_no_alert(self, shared: Stack) -> None:
        shared.serve.wait_uptime(20.0)
        # It was watching: every rule ran on data that exists.
        assert "alerts: " in shared.serve.log_text()
        with open_store(f"sqlite:///{shared.serve.db}") as store:
            now = time.time()
            for series, match in (("probe:ttft_seconds", {"probe": "llm"}),
                                  ("sli:batch_fill_rate", {"model": "batcher"}),
                                  ("sli:kv_cache_utilization", {"model": "fake_llm"}),
                                  ("sli:request_rate", {"model": "batcher"})):
                data = store.read(Query(series, start=now - 15, end=now, match=match)).series()
                assert data and len(data[0].values) >= 8, (series, data)
        no_alert_anywhere(shared)

    def test_a_slower_first_token_pages_and_resolves(
        self, shared: Stack, rig_control: Callable[..., dict[str, Any]]
    ) -> None:
        shared.serve.wait_uptime(20.0)  # the regression needs a baseline
        rig_control(ttft_ms=SLOW_TTFT_MS)
        fired = shared.expect_firing(TTFT_REGRESSION)
        labels = dict(fired.labels)
        assert {k: labels[k] for k in ("rule", "target", "probe", "model", "severity")} == {
            "rule": TTFT_REGRESSION, "target": "rig", "probe": "llm", "model": "fake_llm",
            "severity": "warning"}
        ann = dict(fired.annotations)
        assert ann["summary"].startswith("TTFT +") or ann["summary"].startswith("TTFT \u00d7")
        assert ann["baseline"] == "trailing"
        assert float(ann["current_value"]) > 0.4 and float(ann["baseline_value"]) < 0.2
        # the load guard was applied (and passed): paced traffic kept the request rate
        assert "load_current" in ann and "load_baseline" in ann
        # The threshold rule on the same series fires too; both are the expected TTFT alerts.
        high = shared.expect_firing(TTFT_HIGH)
        rig_control(ttft_ms=CONTROL_DEFAULTS["ttft_ms"])
        shared.expect_resolved(fired)
        shared.expect_resolved(high)
        shared.assert_one_page(fired)
        shared.assert_one_page(high)

    def test_a_filling_kv_cache_fires_and_resolves(
        self, shared: Stack, rig_control: Callable[..., dict[str, Any]]
    ) -> None:
        rig_control(kv_used_fraction=FULL_KV)
        fired = shared.expect_firing(KV)
        labels = dict(fired.labels)
        assert labels["model"] == "fake_llm" and labels["target"] == "rig"
        assert float(dict(fired.annotations)["value"]) >= 0.9
        assert re.fullmatch(r"KV cache 9\d% full on fake_llm", dict(fired.annotations)["summary"])
        rig_control(kv_used_fraction=CONTROL_DEFAULTS["kv_used_fraction"])
        shared.expect_resolved(fired)
        shared.assert_one_page(fired)

    def test_smaller_batches_at_the_same_load_fire_a_fill_rate_regression(
        self, shared: Stack, rig_control: Callable[..., dict[str, Any]]
    ) -> None:
        # Bigger batches first (a fill rate that rises is no regression), as the baseline.
        rig_control(batch_exec_ms=BIG_BATCH_EXEC_MS)
        time.sleep(FILL_BASELINE_S + 3.0)
        assert not shared.engine_events(FILL_REGRESSION), shared.diag()
        # Smaller batches, same open-loop request rate.
        rig_control(batch_exec_ms=SMALL_BATCH_EXEC_MS)
        fired = shared.expect_firing(FILL_REGRESSION)
        labels = dict(fired.labels)
        assert labels["model"] == "batcher" and labels["rule"] == FILL_REGRESSION
        ann = dict(fired.annotations)
        assert ann["summary"].startswith("Batch fill rate -"), ann
        assert float(ann["change_percent"]) <= -20
        load_now, load_base = float(ann["load_current"]), float(ann["load_baseline"])
        assert abs(load_now - load_base) / load_base <= 0.25  # comparable load, as required
        assert 0.75 * BATCHER_RATE <= load_now <= 1.25 * BATCHER_RATE
        rig_control(batch_exec_ms=BIG_BATCH_EXEC_MS)
        shared.expect_resolved(fired)
        shared.assert_one_page(fired)


# --- scenario 5: restart of serve mid-incident ---------------------------------------------------


def test_a_restart_mid_incident_neither_repages_nor_loses_the_resolve(
    triton_rig: TritonRig, rig_control: Callable[..., dict[str, Any]],
    rig_load: Callable[..., LoadGenerator], tmp_path: Path,
) -> None:
    rig_load(concurrency=2, llm_concurrency=1, max_duration=600.0)
    with running_stack(triton_rig, tmp_path) as st:
        rig_control(kv_used_fraction=FULL_KV)
        fired = st.expect_firing(KV)
        labels = dict(fired.labels)

        # SIGTERM while it fires, start again on the same store (and port).
        assert st.serve.stop() == 0, st.serve.log_tail()
        st.serve.start()
        restored = re.findall(r"alerts: restored (\d+) alert state", st.serve.log_text())
        assert len(restored) == 2 and int(restored[1]) >= 1, st.serve.log_tail()
        # Several evaluations and resend cycles of the new process while the fault lasts.
        time.sleep(3 * RESEND_S)
        (state,) = [s for s in st.serve.states() if s.fingerprint == fired.fingerprint]
        assert state.status == "firing" and state.fired_at == fired.starts_at, st.diag()
        assert state.last_sent_at is not None and state.last_sent_at > fired.starts_at + RESEND_S
        (held,) = st.am_active(labels)
        assert instant(held["startsAt"]) == pytest.approx(fired.starts_at, abs=1e-6)
        st.assert_one_page(fired)

        rig_control(kv_used_fraction=CONTROL_DEFAULTS["kv_used_fraction"])
        resolved = st.expect_resolved(fired)
    # After the final stop: the whole history, from the store.
    engine = [e for e in st.serve.events(ENGINE) if e.fingerprint == fired.fingerprint]
    assert [(e.status, e.starts_at) for e in engine] == [
        ("firing", fired.starts_at), ("resolved", fired.starts_at)]
    back = st.received(fired.fingerprint)
    assert [e.status for e in back] == ["firing", "resolved"], st.diag()
    assert back[1].ends_at == pytest.approx(resolved.ends_at, abs=1e-6)
    assert len(st.notifications(labels, "firing")) == 1


# --- scenario 6: Alertmanager down ---------------------------------------------------------------


def test_alertmanager_down_loses_no_notification(
    triton_rig: TritonRig, rig_control: Callable[..., dict[str, Any]],
    rig_load: Callable[..., LoadGenerator], tmp_path: Path,
) -> None:
    rig_load(concurrency=2, llm_concurrency=1, max_duration=AM_OUTAGE_S + 600.0)
    with running_stack(triton_rig, tmp_path) as st:
        st.serve.wait_uptime(5.0)
        # An alert that fired (and was notified) before the outage ...
        rig_control(kv_used_fraction=FULL_KV)
        kv = st.expect_firing(KV)
        st.am.stop()
        down_at = time.monotonic()
        posted = len(st.am.recorder.payloads)
        stored = len(st.serve.events(RECEIVED))
        # ... resolves during it, while another one fires.
        rig_control(kv_used_fraction=CONTROL_DEFAULTS["kv_used_fraction"], ttft_ms=SLOW_TTFT_MS)
        (kv_resolved,) = wait_until(
            "KV resolved while Alertmanager is down",
            lambda: [e for e in st.engine_events(KV, "resolved")
                     if e.fingerprint == kv.fingerprint], 30.0, st.diag)
        (ttft,) = wait_until("TTFT firing while Alertmanager is down",
                             lambda: st.engine_events(TTFT_HIGH, "firing"), 30.0, st.diag)
        assert time.monotonic() - down_at < AM_OUTAGE_S, "the outage is too short for the test"
        time.sleep(max(0.0, AM_OUTAGE_S - (time.monotonic() - down_at)))
        # Nothing could be delivered: both are still due in the engine's persisted state.
        states = {s.fingerprint: s for s in st.serve.states()}
        assert states[kv.fingerprint].status == "resolved"
        kv_sent = states[kv.fingerprint].last_sent_at
        assert kv_sent is not None and kv_sent < kv_resolved.ts, st.diag()
        assert states[ttft.fingerprint].last_sent_at is None, st.diag()
        assert len(st.am.recorder.payloads) == posted
        assert len(st.serve.events(RECEIVED)) == stored

        st.am.start()  # same data directory: its notification log survives, as in production
        back_at = time.monotonic()
        kv_back = wait_until("KV resolve delivered after the outage",
                             lambda: st.received(kv.fingerprint, "resolved"), 30.0, st.diag)
        assert kv_back[0].ends_at == pytest.approx(kv_resolved.ends_at, abs=1e-6)
        ttft_back = wait_until("TTFT firing delivered after the outage",
                               lambda: st.received(ttft.fingerprint, "firing"), 30.0, st.diag)
        assert ttft_back[0].starts_at == pytest.approx(ttft.starts_at, abs=1e-6)
        log.info("e2e: delivered %.1fs after Alertmanager was back", time.monotonic() - back_at)
        (held,) = st.am_active(dict(ttft.labels))
        assert instant(held["startsAt"]) == pytest.approx(ttft.starts_at, abs=1e-6)

        rig_control(ttft_ms=CONTROL_DEFAULTS["ttft_ms"])
        st.expect_resolved(ttft)
        st.assert_one_page(kv)
        st.assert_one_page(ttft)
    assert [e.status for e in st.received(kv.fingerprint)] == ["firing", "resolved"]
    assert [e.status for e in st.received(ttft.fingerprint)] == ["firing", "resolved"]
