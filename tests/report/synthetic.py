"""A known synthetic fortnight for the report tests: ISO weeks 2026-W42 and 2026-W43 in
Europe/Berlin, W43 being 169 hours long (summer time ends on Sunday 2026-10-25).

Every number is chosen so that the report's figures can be derived by hand (the golden test
writes each derivation next to its value).  Scrapes every 5 minutes (``INTERVAL``):

target ``a`` (every scrape stored):
  - model ``llm`` (version 1): 1 request/s, ``nv_inference_request_success`` +300 per scrape,
    ``nv_inference_request_failure{reason=REJECTED}`` +0, except during the **incident**
    (W43, Wednesday 10:00-12:00 UTC, 24 scrapes) where each scrape adds 150 successes and
    150 failures; batch fill rate 0.8 in W42 and **0.5 in W43** (the regression), queue time
    1 ms; model config ``max_batch_size: 8``, ``max_queue_delay_microseconds: 100``.
  - model ``gen``: 2 req/s, KV cache 95 % used, 2 requests waiting, 1 paused, 400 tokens/s
    in W42 and 500 tokens/s in W43.
  - one GPU at 60 % utilization; energy per inference 2.5 J in W42, 2.0 J in W43.
target ``b``: only ``up``; in W43 every fifth scrape failed (``up`` = 0): 80 % completeness.

Alert history (engine events): the availability SLO's page from Wednesday 10:00 to 12:00 UTC
and a TargetDown of ``b`` on Monday 2026-10-19 01:00-02:00 UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tritonwatch.alerts.report.weeks import Week
from tritonwatch.schemas.alerts import AlertEvent, fingerprint
from tritonwatch.schemas.config import Config, validate_config
from tritonwatch.schemas.rules import SloSpec
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store
from tritonwatch.store.alerts import AlertStore

TZ = "Europe/Berlin"
WEEK = Week.parse("2026-W43", TZ)
PREV = WEEK.shift(-1)
INTERVAL = 300.0
N_PREV = round((PREV.end - PREV.start) / INTERVAL)  # 2016
N_WEEK = round((WEEK.end - WEEK.start) / INTERVAL)  # 2028 (169 h)


def utc(year: int, month: int, day: int, hour: int = 0) -> float:
    return datetime(year, month, day, hour, tzinfo=UTC).timestamp()


INCIDENT = (utc(2026, 10, 21, 10), utc(2026, 10, 21, 12))
TARGET_DOWN = (utc(2026, 10, 19, 1), utc(2026, 10, 19, 2))

LLM = make_labels({"model": "llm", "version": "1"})
GEN = make_labels({"model": "gen", "version": "1"})
GPU = make_labels({"gpu_uuid": "GPU-0"})

SLOS = (
    SloSpec.model_validate({
        "name": "availability", "objective": 99.0, "window": "28d",
        "description": "llm answers without errors",
        "sli": {"kind": "availability", "model": "llm"},
    }),
    SloSpec.model_validate({
        "name": "queue-time", "objective": 99.0, "window": "28d",
        "sli": {"kind": "queue_time", "model": "llm", "threshold": "50ms"},
    }),
)


def config(**reports: Any) -> Config:
    return validate_config({
        "scrape": {"interval": "5m", "timeout": "10s"},
        "targets": [
            {"name": "a", "metrics_url": "http://127.0.0.1:1/metrics"},
            {"name": "b", "metrics_url": "http://127.0.0.1:2/metrics"},
        ],
        "reports": {"timezone": TZ, **reports},
    })


def fill(store: Store) -> None:
    """Write the fortnight (and one last scrape at W43's end, closing its counters)."""
    success = failure = 0.0
    for i in range(N_PREV + N_WEEK + 1):
        ts = PREV.start + i * INTERVAL
        this_week = i >= N_PREV
        in_incident = this_week and INCIDENT[0] < ts <= INCIDENT[1]
        success += 150.0 if in_incident else 300.0
        failure += 150.0 if in_incident else 0.0
        store.write("a", ts, [
            Sample("up", (), 1.0),
            Sample("nv_inference_request_success", LLM, success),
            Sample("nv_inference_request_failure", make_labels({**dict(LLM),
                                                                 "reason": "REJECTED"}), failure),
            Sample("sli:request_rate", LLM, 1.0),
            Sample("sli:batch_fill_rate", LLM, 0.5 if this_week else 0.8),
            Sample("sli:queue_time_seconds", LLM, 0.001),
            Sample("sli:request_rate", GEN, 2.0),
            Sample("sli:kv_cache_utilization", GEN, 0.95),
            Sample("sli:llm_waiting_requests", GEN, 2.0),
            Sample("sli:llm_paused_requests", GEN, 1.0),
            Sample("sli:generation_tokens_rate", GEN, 500.0 if this_week else 400.0),
            Sample("sli:gpu_utilization", GPU, 0.6),
            Sample("sli:energy_per_inference_joules", (), 2.0 if this_week else 2.5),
        ])
        up_b = 0.0 if this_week and (i - N_PREV) % 5 == 4 else 1.0
        store.write("b", ts, [Sample("up", (), up_b)])
    store.flush()
    store.put_model_config("a", "llm", {
        "name": "llm", "max_batch_size": 8,
        "dynamic_batching": {"max_queue_delay_microseconds": "100"},
        "instance_group": [{"count": 1, "kind": "KIND_GPU"}],
    }, WEEK.start)
    alerts = AlertStore(store)
    for labels, (start, end) in (
        ({"alertname": "SLOBurnRate", "slo": "availability", "severity": "page"}, INCIDENT),
        ({"alertname": "TargetDown", "rule": "target_down", "target": "b",
          "severity": "critical"}, TARGET_DOWN),
    ):
        lbl = make_labels(labels)
        fp = fingerprint(lbl)
        ann = make_labels({"summary": f"{labels['alertname']} fired"})
        alerts.append_events([
            AlertEvent(start, fp, lbl, ann, "firing", start, None, "engine"),
            AlertEvent(end, fp, lbl, ann, "resolved", start, end, "engine"),
        ])
