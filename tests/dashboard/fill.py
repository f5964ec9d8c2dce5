"""Stores for the dashboard tests, filled by the real pieces.

``fill_from_rig``: the real collector scrapes the session's tritonserver rig under load (with
a reload in the middle: a real counter reset), runs a real gRPC probe of ``fake_llm``, and the
real alert engine evaluates a rules file over what was stored.  Beside the rig, a fake target at
the edge (a real HTTP server in a thread, ``tests/fixtures_http.py``) exposes a model whose name
is HTML, and a URL where nothing listens plays a target that is down.  One Alertmanager webhook
is appended as the receiver would (``AlertStore.append_events``).

``synthetic_week``: 7 days of 15 s availability counters written straight to the store, then
rolled up, for the SLO page (the rig cannot make a week of history in a test).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.rules import load_rules
from tritonwatch.collector.jobs import Collector
from tritonwatch.loadgen import LoadGenerator
from tritonwatch.rig import TritonRig
from tritonwatch.schemas.alerts import AlertEvent, fingerprint
from tritonwatch.schemas.config import load_config
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store, open_store
from tritonwatch.store.alerts import AlertStore

XSS_MODEL = "<img src=x onerror=alert(1)>"
XSS_ANNOTATION = "<script>window.__xss=1</script>**not bold**"

XSS_PAYLOAD = (
    "# HELP nv_inference_request_success Number of successful inference requests\n"
    "# TYPE nv_inference_request_success counter\n"
    f'nv_inference_request_success{{model="{XSS_MODEL}",version="1"}} {{n}}\n'
    "# HELP nv_inference_count Number of inferences performed\n"
    "# TYPE nv_inference_count counter\n"
    f'nv_inference_count{{model="{XSS_MODEL}",version="1"}} {{n}}\n'
    # A GPU as Triton exports it without NVML (nv_gpu_* only).
    "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)\n"
    "# TYPE nv_gpu_utilization gauge\n"
    'nv_gpu_utilization{gpu_uuid="GPU-edge-0"} 0.625\n'
    "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes\n"
    "# TYPE nv_gpu_memory_used_bytes gauge\n"
    'nv_gpu_memory_used_bytes{gpu_uuid="GPU-edge-0"} 4294967296\n'
    "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes\n"
    "# TYPE nv_gpu_memory_total_bytes gauge\n"
    'nv_gpu_memory_total_bytes{gpu_uuid="GPU-edge-0"} 17179869184\n'
    "# HELP nv_gpu_power_usage GPU power usage in watts\n"
    "# TYPE nv_gpu_power_usage gauge\n"
    'nv_gpu_power_usage{gpu_uuid="GPU-edge-0"} 180.5\n'
)

RULES = """\
version: 1
slos:
  - name: llm-ttft
    objective: 99
    window: 28d
    sli: {kind: ttft, probe: llm, threshold: 100ms}
    min_traffic: 1
alerts:
  - name: KVCacheHigh
    series: sli:kv_cache_utilization
    agg: max
    window: 3s
    op: ">="
    threshold: 0.8
    labels: {severity: warning}
    annotations: {summary: "KV cache {value:.0%} full on {labels[model]}"}
"""


def write_config(directory: Path, *, rig: TritonRig | None, db_url: str,
                 edge_url: str | None = None, down_url: str | None = None,
                 rules: str = RULES) -> Path:
    """A tritonwatch.yaml naming the store, the targets and the rules; returns its path."""
    rules_path = directory / "rules.yaml"
    rules_path.write_text(rules, encoding="utf-8")
    lines = ["version: 1", "targets:"]
    if rig is not None:
        lines += [
            "  - name: rig",
            f"    metrics_url: {rig.metrics_url}",
            f"    http_url: {rig.http_url}",
            f"    grpc_url: {rig.grpc_url}",
        ]
    if edge_url is not None:
        lines += ["  - name: edge", f"    metrics_url: {edge_url}"]
    if down_url is not None:
        lines += ["  - name: gone", f"    metrics_url: {down_url}"]
    if len(lines) == 2:
        lines[-1] = "targets: []"
    lines += [
        "scrape: {interval: 1s, timeout: 1s, api_interval: 2s}",
        f"store: {{url: '{db_url}', flush_interval: 1s}}",
        "nvml: {enabled: false}",
        f"alerting: {{rules_file: '{rules_path}', eval_interval: 1s}}",
    ]
    if rig is not None:
        lines += [
            "probes:",
            "  - {name: llm, target: rig, model: fake_llm, protocol: grpc, interval: 1s,",
            "     timeout: 1s, requests: 3, max_tokens: 4, ttft_slo: 100ms}",
        ]
    path = directory / "tritonwatch.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def fill_from_rig(config_path: Path, rig: TritonRig, edge: Any | None = None,
                  *, steps: int = 14) -> dict[str, Any]:
    """Scrape, probe and evaluate ``steps`` times a second; returns what was done."""
    config = load_config(config_path)
    store = open_store(config.store.url)
    store.migrations.apply()
    engine = Engine(load_rules(config.alerting.rules_file), store, eval_interval=1.0)
    load = LoadGenerator(rig.grpc_url, concurrency=8, llm_concurrency=2, max_duration=120.0)
    collector = Collector(config, store)
    info: dict[str, Any] = {"restart_at": None}

    async def run() -> None:
        for step in range(steps):
            if edge is not None:
                edge.server.ok_body = XSS_PAYLOAD.replace("{n}", str(10 * step))
            if step == 5:
                rig.control(kv_used_fraction=0.9, ttft_ms=150)
            if step == 9:
                await asyncio.to_thread(rig.restart)
                info["restart_at"] = time.time()
                rig.control(kv_used_fraction=0.3, ttft_ms=20)
            if step % 3 == 0:
                await collector.read_api("rig")
            for name in collector.targets:
                await collector.scrape(name)
            await collector.run_probe("llm")
            await collector.flush()
            await asyncio.to_thread(engine.evaluate)
            await asyncio.sleep(1.0)
        await collector.close()

    load.start()
    try:
        asyncio.run(run())
    finally:
        load.stop()
        rig.reset_control()
    store.maintenance.rollup(time.time())
    now = time.time()
    labels = make_labels({"alertname": "UpstreamDown", "severity": "critical",
                          "model": XSS_MODEL})
    AlertStore(store).append_events([AlertEvent(
        ts=now, fingerprint=fingerprint(labels), labels=labels,
        annotations=make_labels({"summary": XSS_ANNOTATION}), status="firing",
        starts_at=now, ends_at=None, source="alertmanager:tritonwatch",
    )])
    store.close()
    return info


def synthetic_week(store: Store, *, now: float, target: str = "week",
                   model: str = "resnet") -> None:
    """7 days of 15 s success/failure counters of ``model``: 10 req/s, 0.05 % failing, and
    one bad hour (5 % failing) two days ago; rolled up so long windows read rollups."""
    start = now - 7 * 86400
    success = failure = 0.0
    bad_from, bad_to = now - 2 * 86400, now - 2 * 86400 + 3600
    labels = make_labels({"model": model, "version": "1"})
    failed = make_labels({"model": model, "version": "1", "reason": "OTHER"})
    ts = start
    while ts <= now:
        bad = bad_from <= ts < bad_to
        failure += 7.5 if bad else 0.075
        success += 142.5 if bad else 149.925
        store.write(target, ts, [
            Sample("nv_inference_request_success", labels, success),
            Sample("nv_inference_request_failure", failed, failure),
            Sample("sli:request_rate", labels, (142.5 if bad else 149.925) / 15),
        ])
        ts += 15.0
    store.flush()
    store.maintenance.rollup(now)
