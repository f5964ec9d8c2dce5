"""Dashboard render time: the model page and the fleet page over 7 days of 15 s data for 20
models, on SQLite and PostgreSQL; p50 and p95 of cold renders (caches cleared each time).

    .venv/bin/python -m bench.dashboard [--backend sqlite|postgres|both] [--repeat 7]

Per model, the series the two pages read: the fleet SLIs, failures by reason, the counters of
the latency breakdown and of batch_stats, ``up``; and a probe run every 30 s for one model.
Everything goes through ``Store.write``/``flush`` and ``Store.maintenance.rollup``, as ``serve``
writes it.
Each render is one Streamlit ``AppTest`` run of ``dashboard/streamlit_app.py`` with the 7-day
range selected, after ``st.cache_data.clear()``: what a first viewer waits for.  Goal: p50
at most 1 s.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from bench.query import store_at
from tritonwatch.dashboard.loaders import CONFIG_ENV
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store, open_store

DAY = 86_400.0
STEP = 15.0
MODELS = 20
TARGET = "triton-a"
APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "streamlit_app.py")
GAUGES = ("sli:request_rate", "sli:success_ratio", "sli:batch_fill_rate",
          "sli:kv_cache_utilization", "sli:queue_time_seconds")
COUNTERS = ("nv_inference_request_success", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us")


def load(store: Store, now: float) -> int:
    rng = random.Random(1)
    start = now - 7 * DAY
    models = [make_labels({"model": f"model_{i:02d}", "version": "1"}) for i in range(MODELS)]
    counts = [0.0] * (len(COUNTERS) * MODELS + 3 * MODELS)
    written = 0
    probes: list[ProbeResult] = []
    for k in range(int(7 * DAY / STEP)):
        ts = start + k * STEP
        samples = [Sample("up", (), 1.0)]
        for m, labels in enumerate(models):
            samples += [Sample(name, labels, rng.uniform(0.2, 0.9)) for name in GAUGES]
            samples.append(Sample("sli:failure_rate", make_labels([*labels, ("reason", "OTHER")]),
                                  0.0))
            for c, name in enumerate(COUNTERS):
                counts[m * len(COUNTERS) + c] += rng.uniform(100, 200)
                samples.append(Sample(name, labels, counts[m * len(COUNTERS) + c]))
            for b, size in enumerate(("1", "4", "8")):
                i = len(COUNTERS) * MODELS + m * 3 + b
                counts[i] += rng.uniform(0, 20)
                samples.append(Sample("triton_stats_batch_executions",
                                      make_labels([*labels, ("batch_size", size)]), counts[i]))
        store.write(TARGET, ts, samples)
        written += len(samples)
        if k % 2 == 0:
            probes.append(ProbeResult(probe="llm", target=TARGET, model="model_00",
                                      protocol="grpc", ts=ts, ok=True, tokens=16,
                                      ttft_s=rng.uniform(0.05, 0.1), itl_s=0.01,
                                      e2e_s=0.3))
        if k % 500 == 499:
            store.write_probe_results(probes)
            probes = []
            store.flush()
    store.write_probe_results(probes)
    store.flush()
    store.maintenance.rollup(now)
    return written


def render(config: Path, page: str | None, repeat: int) -> list[float]:
    os.environ[CONFIG_ENV] = str(config)
    times = []
    for i in range(repeat + 1):
        st.cache_data.clear()
        at = AppTest.from_file(APP, default_timeout=300)
        at.run()
        if page is not None:
            at.switch_page(f"app_pages/{page}.py")
        at.sidebar.selectbox(key="sb_range").set_value("7 d")
        if page == "model":
            at.sidebar.selectbox(key="sb_model").set_value("model_00")
        st.cache_data.clear()
        t0 = time.perf_counter()
        at.run()
        elapsed = time.perf_counter() - t0
        if at.exception:
            raise RuntimeError(at.exception[0].value)
        if i:  # the first run warms imports and connections
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        with store_at(backend) as url, tempfile.TemporaryDirectory() as tmp:
            store = open_store(url)
            store.migrations.apply()
            t0 = time.perf_counter()
            rows = load(store, time.time())
            store.close()
            print(f"{backend}: {rows:,} samples of {MODELS} models written and rolled up "
                  f"in {time.perf_counter() - t0:.0f} s")
            config = Path(tmp) / "tw.yaml"
            config.write_text(f"version: 1\nstore: {{url: '{url}'}}\n", encoding="utf-8")
            for page in ("fleet", "model"):
                times = sorted(render(config, None if page == "fleet" else page,
                                      args.repeat))
                p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
                print(f"{backend} {page} page, 7 days: p50 {statistics.median(times):.2f} s, "
                      f"p95 {p95:.2f} s ({len(times)} cold renders)")


if __name__ == "__main__":
    main()
