"""The whole ingest path against a real tritonserver under load: scrape → parse → derive → store.

Everything here is real: the tritonserver binary, its /metrics, statistics and model-config
APIs, and the SQLite store.  Only the models are stand-ins (Python backend).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tritonwatch.collector.jobs import Collector
from tritonwatch.collector.triton import TritonApi
from tritonwatch.schemas.config import validate_config
from tritonwatch.schemas.samples import label_value
from tritonwatch.store import Query

pytestmark = pytest.mark.triton


def rig_config(rig):
    return validate_config({"targets": [{
        "name": "rig", "metrics_url": rig.metrics_url, "http_url": rig.http_url,
    }], "scrape": {"interval": "1s", "timeout": "1s"}})


def stats_counts(rig, model):
    api = TritonApi("rig", http_url=rig.http_url, grpc_url=None)
    stats = api._call("get_inference_statistics", model)
    api.close()
    (entry,) = stats["model_stats"]
    return int(entry["inference_count"]), int(entry["execution_count"])


def kv_fraction(rig):
    """fake_llm's exported KV fraction gauge, read straight from Triton's /metrics."""
    text = httpx.get(rig.metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "nv_trt_llm_kv_cache_block_metrics"
                    and sample.labels.get("kv_cache_block_type") == "fraction"
                    and sample.labels.get("model") == "fake_llm"):
                return sample.value
    return float("nan")


def test_fill_rate_in_store_matches_statistics_api(triton_rig, rig_load, store):
    rig_load(concurrency=10)
    time.sleep(2)  # let the batcher reach a steady state
    collector = Collector(rig_config(triton_rig), store)

    async def window():
        await collector.read_api("rig")  # model configs: max_batch_size 16
        await collector.scrape("rig")
        first = stats_counts(triton_rig, "batcher")
        for _ in range(8):
            await asyncio.sleep(1.0)
            await collector.scrape("rig")
        last = stats_counts(triton_rig, "batcher")
        await collector.close()
        return first, last

    (count0, exec0), (count1, exec1) = asyncio.run(window())
    store.flush()
    expected = (count1 - count0) / (exec1 - exec0) / 16
    assert 0.1 < expected < 1.0, "the rig should form real batches under this load"

    # The stored per-interval fill rates, weighted by each interval's executions, give the
    # window's fill rate.
    match = {"model": "batcher"}
    (fill,) = store.read(Query("sli:batch_fill_rate", start=0, end=time.time() + 1,
                               match=match)).series()
    (execs,) = store.read(Query("sli:execution_rate", start=0, end=time.time() + 1,
                                match=match)).series()
    assert len(fill.values) == 8 and fill.ts == execs.ts
    ts = (fill.ts[0] - 1.0, *fill.ts)  # scrapes are ~1 s apart
    weights = [rate * (ts[i + 1] - ts[i]) for i, rate in enumerate(execs.values)]
    stored = sum(f * w for f, w in zip(fill.values, weights, strict=True)) / sum(weights)
    assert stored == pytest.approx(expected, rel=0.02)

    # The raw counters in the store agree as well (reset-aware increase over the window).
    (inc_count,) = store.increase(Query("nv_inference_count", start=0, end=time.time() + 1,
                                        match=match))
    (inc_exec,) = store.increase(Query("nv_inference_exec_count", start=0, end=time.time() + 1,
                                       match=match))
    assert inc_count[1] / inc_exec[1] / 16 == pytest.approx(expected, rel=0.02)


def test_kv_cache_utilization_follows_the_model(triton_rig, rig_control, rig_load, store):
    rig_load(concurrency=0, llm_concurrency=1)
    collector = Collector(rig_config(triton_rig), store)
    seen = []

    async def steps():
        for fraction in (0.2, 0.55, 0.9, 0.4):
            rig_control(kv_used_fraction=fraction)
            # The model refreshes its gauges every 100 ms, Triton its /metrics every 500 ms:
            # wait until they show the new fraction (a fixed 1.2 s was tight on a busy machine).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if abs(kv_fraction(triton_rig) - fraction) <= 0.05:  # False while NaN
                    break
                await asyncio.sleep(0.2)
            await collector.scrape("rig")
            slis = {s.name: s.value for s in collector.targets["rig"].latest
                    if label_value(s.labels, "model") == "fake_llm"}
            seen.append((fraction, slis["sli:kv_cache_utilization"]))
        await collector.close()

    asyncio.run(steps())
    store.flush()
    for fraction, utilization in seen:
        # In-flight requests add a few blocks of their own on top of the configured fraction.
        assert utilization == pytest.approx(fraction, abs=0.05)
    (series,) = store.read(Query("sli:kv_cache_utilization", start=0, end=time.time() + 1,
                                 match={"model": "fake_llm"})).series()
    assert list(series.values) == [u for _, u in seen]
    # ...and equals used/max of the raw gauges stored from the same scrapes.
    raw = {
        dict(s.labels)["kv_cache_block_type"]: s.values
        for s in store.read(Query("nv_trt_llm_kv_cache_block_metrics", start=0, end=time.time() + 1,
                                  match={"model": "fake_llm"})).series()
    }
    for i, utilization in enumerate(series.values):
        assert utilization == pytest.approx(raw["used"][i] / raw["max"][i])


def test_server_restart_gives_no_negative_or_spiking_rates(triton_rig, rig_load, store):
    load = rig_load(concurrency=6, llm_concurrency=1)
    time.sleep(1)
    collector = Collector(rig_config(triton_rig), store)
    restarted = threading.Event()

    def restart_later():
        time.sleep(4)
        triton_rig.restart()
        restarted.set()

    async def run():
        await collector.read_api("rig")
        thread = threading.Thread(target=restart_later)
        thread.start()
        deadline = time.monotonic() + 30
        after = 0
        while time.monotonic() < deadline and after < 5:
            await collector.scrape("rig")
            after += restarted.is_set()
            await asyncio.sleep(1.0)
        thread.join()
        await collector.close()

    asyncio.run(run())
    store.flush()
    assert restarted.is_set() and load.stats().batcher.ok > 0
    # The scrapes during the restart were recorded as down, like Prometheus's `up`.
    assert any(not h.up for h in store.health_log("rig"))
    end = time.time() + 1
    for name in ("sli:request_rate", "sli:inference_rate", "sli:execution_rate"):
        for series in store.read(Query(name, start=0, end=end)).series():
            values = series.values
            assert min(values) >= 0, f"{name} went negative: {values}"
            if label_value(series.labels, "model") == "batcher":
                # A restart must not be read as one enormous increase.
                assert max(values) <= 3 * statistics.median(values) + 1, (name, values)
    # The raw counters did reset (so this test really crossed a restart)...
    (count,) = store.read(Query("nv_inference_count", start=0, end=end,
                                match={"model": "batcher"})).series()
    assert any(b < a for a, b in zip(count.values, count.values[1:], strict=False))
    # ...and the reset-aware increase over the window is still positive and sane.
    (inc,) = store.increase(Query("nv_inference_count", start=0, end=end,
                                  match={"model": "batcher"}))
    assert inc[1] >= count.values[-1]
