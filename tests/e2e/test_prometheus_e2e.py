"""The user's own Prometheus scrapes ``tritonwatch serve`` (itself scraping the rig): through
Prometheus's query API it reads a batch fill rate, a KV-cache utilization, an SLO budget and a
firing alert equal to what tritonwatch holds, and every ``expr`` of the shipped Grafana
dashboard (deploy/grafana/tritonwatch.json) returns data."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures_rig import serve_config
from tests.prometheus_server import Prometheus, free_port, run_prometheus, scrape_config
from tritonwatch.rig import TritonRig
from tritonwatch.store import Query, open_store

pytestmark = pytest.mark.triton

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tritonwatch.json"

#: Panels that read GPU series: the rig has no GPU, so Prometheus has none of them here.
NEEDS_A_GPU = {"GPU utilization", "GPU memory used", "GPU idle while requests queue"}

RULES = """
version: 1
slos:
  - name: batcher-availability
    objective: 99.9
    sli: {kind: availability, model: batcher}
alerts:
  - name: KVCacheAbove10
    series: sli:kv_cache_utilization
    agg: last
    window: 1m
    op: ">"
    threshold: 0.1
    labels: {severity: ticket}
"""


def dashboard_exprs() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] if p["type"] != "row"
            for t in p.get("targets", [])]


def instant(prom: Prometheus, expr: str) -> list[dict[str, Any]]:
    data = prom.api("query", query=expr)
    assert data["resultType"] == "vector"
    return list(data["result"])


def wait(check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_prometheus_reads_tritonwatch_and_the_dashboard_has_data(
    triton_rig: TritonRig, rig_load: Callable[..., Any], tmp_path: Path
):
    rig_load(concurrency=4, llm_concurrency=2)
    port = free_port()
    db = tmp_path / "tw.db"
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "tw.yaml"
    config.write_text(serve_config(
        triton_rig, db, "1s",
        f"alerting: {{rules_file: '{tmp_path / 'rules.yaml'}', eval_interval: 2s}}",
        "nvml: {enabled: true, interval: 2s}",
    ))
    proc = subprocess.Popen([sys.executable, "-m", "tritonwatch.cli", "serve", "--config",
                             str(config), "--listen", f"127.0.0.1:{port}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        with run_prometheus(scrape_config([{"job_name": "tritonwatch",
                                            "targets": [f"127.0.0.1:{port}"]}]),
                            tmp_path / "prom") as prom:
            def has(expr: str) -> bool:
                return bool(instant(prom, expr))

            for expr in ('tritonwatch_sli_batch_fill_rate{model="batcher"}',
                         "tritonwatch_sli_kv_cache_utilization",
                         'tritonwatch_slo_error_budget_remaining_ratio'
                         '{slo="batcher-availability"}',
                         'ALERTS{alertname="KVCacheAbove10",alertstate="firing"}'):
                wait(lambda expr=expr: has(expr), expr)  # type: ignore[misc]
            time.sleep(3)  # a few more scrapes of every series the dashboard reads

            store = open_store(f"sqlite:///{db}")  # a reader beside serve's writer
            try:
                for name, model in (("sli:batch_fill_rate", "batcher"),
                                    ("sli:kv_cache_utilization", None)):
                    exported = "tritonwatch_" + name.replace(":", "_")
                    [sample] = instant(prom, f'{exported}{{model="{model}"}}' if model
                                       else exported)
                    value = float(sample["value"][1])
                    stored = {v for s in store.read(Query(name, start=time.time() - 600,
                                                     end=time.time() + 60, target="rig")).series()
                              for v in s.values}
                    assert value in stored, (name, value, sorted(stored)[-5:])
                    assert sample["metric"]["target"] == "rig"
                    assert sample["metric"]["job"] == "tritonwatch"
            finally:
                store.close()

            [budget] = instant(prom, 'tritonwatch_slo_error_budget_remaining_ratio'
                                     '{slo="batcher-availability"}')
            slos = httpx.get(f"{base}/api/v1/slos", timeout=30).json()["data"]
            [slo] = [s for s in slos if s["name"] == "batcher-availability"]
            remaining = {st["errorBudgetRemaining"] for st in slo["statuses"]}
            # Prometheus holds what /metrics said at its last scrape; the board refreshes at
            # most once a minute, so both are the board's value.
            assert float(budget["value"][1]) in remaining

            [alert] = instant(prom, 'ALERTS{alertname="KVCacheAbove10",alertstate="firing"}')
            ours = httpx.get(f"{base}/api/v1/alerts", timeout=30).json()["data"]["alerts"]
            mine = [a for a in ours if a["labels"]["alertname"] == "KVCacheAbove10"]
            assert mine and all(a["state"] == "firing" for a in mine)
            assert {a["labels"]["model"] for a in mine} == {alert["metric"]["model"]}

            exprs = dashboard_exprs()
            assert len(exprs) >= 20
            empty = [title for title, expr in exprs if not has(expr)]
            assert set(empty) <= NEEDS_A_GPU, empty
            assert "NVML reading up (0: no NVML on the host)" not in empty
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
