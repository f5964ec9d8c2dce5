"""The collector's jobs against real HTTP targets (good and broken) and a real SQLite store."""

import asyncio
import itertools
import time

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from bench.payloads import triton_payload
from collector.jobs import Collector, SelfMetrics, stagger_offset
from schemas.config import validate_config


def make_config(targets, **scrape):
    return validate_config({"targets": targets, "scrape": scrape or {}})


def test_scrape_stores_raw_and_derived_series_with_exposed_names(fake_targets, store):
    fake_targets.server.ok_body = triton_payload(models=3, gpus=2, step=0)
    config = make_config([{"name": "a", "metrics_url": fake_targets.url("/ok"),
                           "labels": {"cluster": "west"}, "max_batch_size": {"preprocessing": 64}}])
    times = iter([1000.0, 1015.0])
    collector = Collector(config, store, clock=lambda: next(times))

    async def go():
        first = await collector.scrape("a")
        fake_targets.server.ok_body = triton_payload(models=3, gpus=2, step=1)
        second = await collector.scrape("a")
        await collector.close()
        return first, second

    first, second = asyncio.run(go())
    store.flush()
    assert first.up and second.up and second.samples > 100
    names = {k.name for k in store.series(target="a")}
    # Triton's counter names as exposed (no _total added), like Prometheus stores them.
    assert "nv_inference_count" in names and "nv_inference_count_total" not in names
    assert {"up", "scrape_duration_seconds", "sli:request_rate", "sli:batch_fill_rate"} <= names
    (fill,) = store.range("sli:batch_fill_rate", start=0, end=2000, target="a",
                          match={"model": "preprocessing"})
    assert fill.ts == (1015.0,)
    assert 0 < fill.values[0] <= 1
    assert dict(fill.labels)["cluster"] == "west"
    (health,) = store.health()
    assert health.up and health.target == "a" and health.source == "metrics"


def test_broken_targets_are_marked_down_and_never_delay_the_good_one(
    fake_targets, down_url, store
):
    targets = [
        {"name": "good", "metrics_url": fake_targets.url("/ok")},
        {"name": "slow", "metrics_url": fake_targets.url("/slow")},
        {"name": "garbage", "metrics_url": fake_targets.url("/garbage")},
        {"name": "endless", "metrics_url": fake_targets.url("/endless")},
        {"name": "down", "metrics_url": down_url},
        {"name": "error", "metrics_url": fake_targets.url("/status/503")},
    ]
    config = make_config(targets, interval="1s", timeout="800ms", max_body_bytes="256KiB")
    metrics = SelfMetrics()

    async def run():
        collector = Collector(config, store, metrics=metrics)
        scheduler = AsyncIOScheduler(timezone="UTC")
        collector.install(scheduler)
        scheduler.start()
        await asyncio.sleep(5.5)
        scheduler.shutdown(wait=False)
        await collector.close()

    asyncio.run(run())
    store.flush()
    health = {h.target: h for h in store.health()}
    assert health["good"].up
    reasons = {name: health[name].error or "" for name in health if name != "good"}
    assert "timed out after 0.8s" in reasons["slow"]
    assert "unparsable body" in reasons["garbage"] and "line 1" in reasons["garbage"]
    assert "max_body_bytes" in reasons["endless"] or "timed out" in reasons["endless"]
    assert "ConnectError" in reasons["down"]
    assert "HTTP 503" in reasons["error"]
    assert not any(health[name].up for name in reasons)
    # The good target was scraped on its 1 s schedule throughout: 5 or 6 scrapes, evenly spaced.
    good = [t for path, t in fake_targets.hits if path == "/ok"]
    assert len(good) >= 5
    gaps = [b - a for a, b in itertools.pairwise(good)]
    assert max(gaps) < 1.3 and min(gaps) > 0.7
    # Down targets get `up` 0 in the store, like Prometheus.
    (up,) = store.range("up", start=0, end=time.time() + 10, target="down")
    assert set(up.values) == {0.0}
    # Scrape failures are health, not job failures: the scheduler saw no exceptions.
    assert metrics.job_failures.labels("scrape")._value.get() == 0


def test_stagger_is_stable_and_within_interval():
    offsets = {stagger_offset(f"t{i}", 15.0) for i in range(50)}
    assert all(0 <= o < 15 for o in offsets) and len(offsets) == 50
    assert stagger_offset("x", 15.0) == stagger_offset("x", 15.0)


def test_a_failing_job_is_counted_and_never_stops_the_others(fake_targets, store, monkeypatch):
    from store import StoreError

    def broken_flush():
        raise StoreError("database is down (test)", url="sqlite:///x")

    monkeypatch.setattr(store, "flush", broken_flush)
    config = validate_config({
        "targets": [{"name": "good", "metrics_url": fake_targets.url("/ok")}],
        "scrape": {"interval": "1s", "timeout": "500ms"},
        "store": {"flush_interval": "1s"},
    })
    metrics = SelfMetrics()

    async def run():
        collector = Collector(config, store, metrics=metrics)
        scheduler = AsyncIOScheduler(timezone="UTC")
        collector.install(scheduler)
        scheduler.start()
        await asyncio.sleep(3.5)
        running = scheduler.running
        scheduler.shutdown(wait=False)
        await collector.close()
        return running

    assert asyncio.run(run())
    assert metrics.job_failures.labels("store")._value.get() >= 3
    assert metrics.store_errors._value.get() >= 3
    assert len([p for p, _ in fake_targets.hits if p == "/ok"]) >= 3
    assert store.buffered > 0  # nothing was lost: the samples wait for the next flush


def test_nvml_job_on_a_host_without_nvml_still_joins_tritons_gpu_view(fake_targets, store):
    # This machine has no GPU: pynvml raises NVMLError_LibraryNotFound (the real library).
    fake_targets.server.ok_body = triton_payload(models=3, gpus=2, step=0)
    config = validate_config({
        "targets": [{"name": "a", "metrics_url": fake_targets.url("/ok")}],
        "nvml": {"host": "node-1"},
    })
    collector = Collector(config, store, clock=lambda: 1000.0)

    async def go():
        await collector.scrape("a")
        first = await collector.read_nvml()
        second = await collector.read_nvml()
        await collector.close()
        return first, second

    first, second = asyncio.run(go())
    store.flush()
    for health in (first, second):
        assert not health.up and health.error.startswith("NVML unavailable")
    nvml_health = [h for h in store.health() if h.source == "nvml"]
    assert [h.target for h in nvml_health] == ["node-1"]
    util = store.range("sli:gpu_utilization_ratio", start=0, end=2000)
    assert len(util) == 2 and all(0 <= s.values[0] <= 1 for s in util)
