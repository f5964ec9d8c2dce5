"""The collector's jobs against real HTTP targets (good and broken) and a real SQLite store."""

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tests.clock import Clock
from tests.fixtures_http import FakeTargets, serve_fake_targets
from tests.payloads import triton_payload
from tritonwatch.collector.jobs import API_MAX_CONCURRENCY, Collector, stagger_offset
from tritonwatch.collector.parse import parse_fast
from tritonwatch.collector.self_metrics import SelfMetrics
from tritonwatch.collector.triton import ApiReading, parse_model_config, stats_families
from tritonwatch.schemas.config import validate_config
from tritonwatch.schemas.samples import Sample, Snapshot, TargetHealth
from tritonwatch.store import Query, StoreError


def run_scheduled(collector, *, until, limit=60.0):
    """Run a Collector's jobs on a real scheduler until ``until()`` holds, or ``limit`` seconds
    (a bound for a busy machine, not a duration to wait).

    Returns whether the scheduler was still running at the end (a failing job must never stop
    it) and the event loop's heartbeat: its monotonic time every 20 ms, whose gaps are the
    loop's stalls.
    """
    beats: list[float] = []

    async def run():
        scheduler = AsyncIOScheduler(timezone="UTC")
        collector.install(scheduler)
        scheduler.start()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not until():
            beats.append(time.monotonic())
            await asyncio.sleep(0.02)
        beats.append(time.monotonic())
        running = scheduler.running
        scheduler.shutdown(wait=False)
        await collector.close()
        return running

    return asyncio.run(run()), beats


def longest_stall(beats, start=None, end=None):
    """The longest gap between heartbeats (within ``start``..``end``)."""
    start = beats[0] if start is None else start
    end = beats[-1] if end is None else end
    inside = [b for b in beats if start <= b <= end]
    return max(b - a for a, b in itertools.pairwise([start, *inside, end]))


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
    names = {k.name for k in store.series(Query(target="a"))}
    # Triton's counter names as exposed (no _total added), like Prometheus stores them.
    assert "nv_inference_count" in names and "nv_inference_count_total" not in names
    assert {"up", "scrape_duration_seconds", "sli:request_rate", "sli:batch_fill_rate"} <= names
    (fill,) = store.read(Query("sli:batch_fill_rate", start=0, end=2000, target="a",
                               match={"model": "preprocessing"})).series()
    assert fill.ts == (1015.0,)
    assert 0 < fill.values[0] <= 1
    assert dict(fill.labels)["cluster"] == "west"
    (health,) = store.health()
    assert health.up and health.target == "a" and health.source == "metrics"


def test_broken_targets_are_marked_down_and_never_delay_the_good_one(
    fake_targets, down_url, store
):
    # The broken ones get 3 s deadlines: one that held the event loop would stall it, and the
    # good target's 1 s schedule, for seconds, far beyond what a busy machine's scheduling does.
    broken = {"scrape_interval": "4s", "scrape_timeout": "3s"}
    targets = [
        {"name": "good", "metrics_url": fake_targets.url("/ok")},
        {"name": "slow", "metrics_url": fake_targets.url("/slow"), **broken},
        {"name": "garbage", "metrics_url": fake_targets.url("/garbage"), **broken},
        {"name": "endless", "metrics_url": fake_targets.url("/endless"), **broken},
        {"name": "down", "metrics_url": down_url, **broken},
        {"name": "error", "metrics_url": fake_targets.url("/status/503"), **broken},
    ]
    config = make_config(targets, interval="1s", timeout="1s", max_body_bytes="256KiB")
    metrics = SelfMetrics()
    collector = Collector(config, store, metrics=metrics)

    def good_hits():
        return [t for path, t in fake_targets.hits if path == "/ok"]

    def done():
        reported = {target for target, _ in collector._last_health}
        return {t["name"] for t in targets} <= reported and len(good_hits()) >= 5

    _, beats = run_scheduled(collector, until=done)
    store.flush()
    health = {h.target: h for h in store.health()}
    reasons = {name: health[name].error or "" for name in health if name != "good"}
    assert "timed out after 3s" in reasons["slow"]
    assert "unparsable body" in reasons["garbage"] and "line 1" in reasons["garbage"]
    assert "max_body_bytes" in reasons["endless"] or "timed out" in reasons["endless"]
    assert "ConnectError" in reasons["down"]
    assert "HTTP 503" in reasons["error"]
    assert not any(health[name].up for name in reasons)
    # The event loop never stood still for the broken scrapes (the slow one alone would hold
    # it 3 s), so the good target was scraped on its schedule throughout, and mostly fine (a
    # busy machine may time one out).
    assert longest_stall(beats) < 1.5, longest_stall(beats)
    good = good_hits()
    assert len(good) >= 5
    assert max(b - a for a, b in itertools.pairwise(good)) < 2.5, good
    (up,) = store.read(Query("up", start=0, end=time.time() + 10, target="good")).series()
    assert sum(up.values) > len(up.values) / 2, up.values
    # Down targets get `up` 0 in the store, like Prometheus.
    (up,) = store.read(Query("up", start=0, end=time.time() + 10, target="down")).series()
    assert set(up.values) == {0.0}
    # Scrape failures are health, not job failures: the scheduler saw no exceptions.
    assert metrics.job_failures.labels("scrape")._value.get() == 0


def test_stagger_is_stable_and_within_interval():
    offsets = {stagger_offset(f"t{i}", 15.0) for i in range(50)}
    assert all(0 <= o < 15 for o in offsets) and len(offsets) == 50
    assert stagger_offset("x", 15.0) == stagger_offset("x", 15.0)


def test_a_failing_job_is_counted_and_never_stops_the_others(fake_targets, store, monkeypatch):
    from tritonwatch.store import StoreError

    def broken_flush():
        raise StoreError("database is down (test)", url="sqlite:///x")

    monkeypatch.setattr(store, "flush", broken_flush)
    config = validate_config({
        "targets": [{"name": "good", "metrics_url": fake_targets.url("/ok")}],
        "scrape": {"interval": "1s", "timeout": "500ms"},
        "store": {"flush_interval": "1s"},
    })
    metrics = SelfMetrics()

    def done():
        hits = [p for p, _ in fake_targets.hits if p == "/ok"]
        return metrics.job_failures.labels("store")._value.get() >= 3 and len(hits) >= 3

    running, _ = run_scheduled(Collector(config, store, metrics=metrics), until=done)
    assert running
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
    util = store.read(Query("sli:gpu_utilization_ratio", start=0, end=2000)).series()
    assert len(util) == 2 and all(0 <= s.values[0] <= 1 for s in util)


# --- regression tests ------------------------------------------------------------------------

BODY_M = """# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="m",version="1"}} {n}
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{{model="m",version="1"}} {n}
# TYPE nv_inference_count counter
nv_inference_count{{model="m",version="1"}} {n}
"""

QUEUED_ON_GPU = """# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} 7
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1",gpu_uuid="GPU-1"} 5
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 1e9
# TYPE nv_gpu_power_usage gauge
nv_gpu_power_usage{gpu_uuid="GPU-1"} 100
"""

STATS = {"model_stats": [{"name": "m", "version": "1", "inference_count": 10,
                          "execution_count": 5,
                          "inference_stats": {"success": {"count": 10, "ns": 1000}}}]}


class MockTarget:
    """An httpx mock transport playing one /metrics endpoint that can go down."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.up = True

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=self.body)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


def fake_reading(stats=STATS, raw_configs=None):
    raw_configs = raw_configs if raw_configs is not None else {}

    async def read(now):
        configs = {m: parse_model_config(c) for m, c in raw_configs.items()}
        return ApiReading(configs, dict(raw_configs), Snapshot("a", now, stats_families(stats)),
                          0.01)

    return read


def set_api_read(collector, name, read):
    api = collector.targets[name].api
    assert api is not None
    setattr(api, "read", read)  # noqa: B010 (mypy: cannot assign to a method)


@pytest.mark.parametrize(
    ("scrape", "target", "expected"),
    [
        ({}, {}, 300.0),  # 15 s scrapes, 60 s API reads: the 300 s floor
        ({"interval": "5m", "timeout": "10s"}, {}, 1200.0),
        ({"interval": "15s"}, {"scrape_interval": "2m"}, 480.0),
        ({"api_interval": "10m"}, {"http_url": "http://a:8000"}, 2400.0),
        ({"api_interval": "10m"}, {}, 300.0),  # no API: its interval does not matter
    ],
)
def test_deriver_max_gap_follows_the_target_intervals(scrape, target, expected, store):
    config = validate_config({"scrape": scrape, "targets": [
        {"name": "a", "metrics_url": "http://a:8002/metrics", **target}]})
    collector = Collector(config, store)
    assert collector.targets["a"].deriver.max_gap_s == expected


def test_a_five_minute_interval_still_gives_rates(store):
    # Before the fix the deriver's max_gap was a fixed 300 s: a scrape 300.004 s after the
    # previous one (5 minutes plus jitter) was "too old" and no rate was ever derived.
    config = validate_config({"scrape": {"interval": "5m", "timeout": "10s"},
                              "targets": [{"name": "a", "metrics_url": "http://a:8002/metrics"}]})
    target = MockTarget(BODY_M.format(n=0))
    clock = Clock()
    collector = Collector(config, store, clock=clock, client=target.client())

    async def go():
        await collector.scrape("a")
        clock.now += 300.004
        target.body = BODY_M.format(n=300)
        await collector.scrape("a")
        await collector.close()

    asyncio.run(go())
    store.flush()
    (rate,) = store.read(Query("sli:request_rate", start=0, end=2000, target="a")).series()
    assert rate.values == (pytest.approx(300 / 300.004),)


def test_a_failed_scrape_drops_the_snapshot_the_gpu_join_uses(store):
    config = validate_config({"nvml": {"enabled": True, "host": "h"},
                              "targets": [{"name": "a", "metrics_url": "http://a:8002/metrics"}]})
    target = MockTarget(QUEUED_ON_GPU)
    clock = Clock()
    collector = Collector(config, store, clock=clock, client=target.client())

    class IdleGpu:  # NVML on this host: GPU-1 idle
        def collect(self):
            return ([Sample("nvml_gpu_utilization_ratio", (("gpu_uuid", "GPU-1"), ("index", "0")),
                            0.0)], TargetHealth("h", "nvml", clock.now, True, 0.0, 1))

        def close(self):
            pass

    collector.nvml = IdleGpu()  # type: ignore[assignment]

    async def go():
        await collector.scrape("a")
        await collector.read_nvml()  # live: requests queue on an idle GPU
        target.up = False
        for _ in range(3):
            clock.now += 60
            health = await collector.scrape("a")
            assert not health.up
            await collector.read_nvml()
        await collector.close()

    asyncio.run(go())
    store.flush()
    assert collector.targets["a"].latest == [] and collector.targets["a"].latest_raw == []
    # Only the reading taken while the target answered; a dead server's frozen queue is not
    # joined with live NVML readings.
    (idle,) = store.read(Query("sli:gpu_idle_while_queued", start=0, end=1e10)).series()
    assert idle.ts == (1000.0,)


def test_configured_target_labels_are_on_every_series_of_the_target(store):
    config = validate_config({"targets": [
        {"name": "a", "metrics_url": "http://a:8002/metrics", "http_url": "http://a:8000",
         "labels": {"cluster": "eu1"}}]})
    target = MockTarget(QUEUED_ON_GPU)
    clock = Clock()
    collector = Collector(config, store, clock=clock, client=target.client())
    stats = [json.loads(json.dumps(STATS)) for _ in range(2)]
    for body in stats:  # a model /metrics does not show: its request SLIs come from the API
        body["model_stats"][0]["name"] = "s"
    stats[1]["model_stats"][0]["inference_count"] = 20
    stats[1]["model_stats"][0]["execution_count"] = 10
    stats[1]["model_stats"][0]["inference_stats"]["success"] = {"count": 20, "ns": 3000}

    async def go():
        await collector.scrape("a")
        for body in stats:
            set_api_read(collector, "a", fake_reading(body))
            await collector.read_api("a")
            clock.now += 60
        target.up = False
        await collector.scrape("a")  # the failure path's up/duration/samples too
        await collector.close()

    asyncio.run(go())
    store.flush()
    keys = store.series(Query(target="a"))
    names = {k.name for k in keys}
    assert {"triton_stats_success_count", "sli:execution_rate", "up",
            "scrape_duration_seconds", "scrape_samples_scraped",
            "nv_inference_pending_request_count"} <= names
    unlabelled = [(k.name, dict(k.labels)) for k in keys if ("cluster", "eu1") not in k.labels]
    assert unlabelled == []
    (up,) = store.read(Query("up", start=0, end=1e10, target="a")).series()
    assert up.values == (1.0, 0.0)


def test_api_jobs_are_staggered_and_api_reads_are_bounded(store):
    targets = [{"name": f"t{i}", "metrics_url": f"http://t{i}:8002/metrics",
                "http_url": f"http://t{i}:8000"} for i in range(20)]
    config = validate_config({"targets": targets, "scrape": {"api_interval": "60s"}})
    collector = Collector(config, store)
    in_flight = [0, 0]  # now, most

    def slow_read():
        async def read(now):
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            await asyncio.sleep(0.02)
            in_flight[0] -= 1
            return await fake_reading()(now)
        return read

    for name in collector.targets:
        set_api_read(collector, name, slow_read())

    async def go():
        scheduler = AsyncIOScheduler(timezone="UTC")
        before = datetime.now(UTC)
        collector.install(scheduler)
        scheduler.start(paused=True)
        starts = {job.id: (job.next_run_time - before).total_seconds()
                  for job in scheduler.get_jobs() if job.id.startswith("api:")}
        scheduler.shutdown(wait=False)
        healths = await asyncio.gather(*(collector.read_api(n) for n in collector.targets))
        await collector.close()
        return starts, healths

    starts, healths = asyncio.run(go())
    assert len(starts) == 20
    # Spread over the interval by the stable hash, like the scrape jobs (not all at once).
    for job_id, start in starts.items():
        assert start == pytest.approx(stagger_offset(job_id, 60.0), abs=1.0)
    assert max(starts.values()) - min(starts.values()) > 10
    assert all(h.up for h in healths)
    assert in_flight[1] == API_MAX_CONCURRENCY  # concurrent, but never more


@pytest.mark.parametrize("broken", [
    {"model_stats": [{"name": "m", "version": "1", "inference_count": "not-a-number"}]},
    {"model_stats": [{"name": "m", "version": "1", "batch_stats": [{"batch_size": [1]}]}]},
])
def test_any_api_reading_failure_marks_api_health_down_naming_the_target(broken, store):
    config = validate_config({"targets": [
        {"name": "a", "metrics_url": "http://a:8002/metrics", "http_url": "http://a:8000"}]})
    clock = Clock()
    collector = Collector(config, store, clock=clock)

    async def go():
        set_api_read(collector, "a", fake_reading())
        first = await collector.read_api("a")
        clock.now += 60
        set_api_read(collector, "a", fake_reading(broken))
        with pytest.raises((ValueError, TypeError)):
            await collector.read_api("a")
        await collector.close()
        return first

    assert asyncio.run(go()).up
    store.flush()
    (health,) = [h for h in store.health() if h.source == "api"]
    assert not health.up and health.ts == 1060.0
    assert "'a'" in health.error and "API reading" in health.error


def test_model_configs_are_written_only_when_changed_and_health_survives_a_down_db(
    store, monkeypatch
):
    config = validate_config({"targets": [
        {"name": "a", "metrics_url": "http://a:8002/metrics", "http_url": "http://a:8000"}]})
    clock = Clock()
    collector = Collector(config, store, clock=clock)
    configs = {"m": {"name": "m", "max_batch_size": 8}, "n": {"name": "n", "max_batch_size": 4}}
    writes: list[tuple[str, int]] = []
    real_put = store.put_model_config
    db_down = [False]

    def put(target, model, cfg, fetched_at):
        if db_down[0]:
            raise StoreError("database is down (test)", url="sqlite:///x")
        writes.append((model, cfg["max_batch_size"]))
        real_put(target, model, cfg, fetched_at)

    monkeypatch.setattr(store, "put_model_config", put)

    async def read(raw_configs, *, fails=False):
        clock.now += 60
        set_api_read(collector, "a", fake_reading(raw_configs=raw_configs))
        if fails:
            with pytest.raises(StoreError):
                await collector.read_api("a")
            return None
        return await collector.read_api("a")

    async def go():
        await read(configs)
        await read(configs)  # unchanged: nothing written
        db_down[0] = True
        changed = {**configs, "m": {"name": "m", "max_batch_size": 16}}
        await read(changed, fails=True)
        (health,) = [h for h in store.health() if h.source == "api"]
        assert health.up and health.ts == clock.now  # recorded before the database write
        db_down[0] = False
        await read(changed)  # the write that failed is retried
        await read(changed)
        await collector.close()

    asyncio.run(go())
    assert writes == [("m", 8), ("n", 4), ("m", 16)]
    assert store.model_configs("a")[("a", "m")]["max_batch_size"] == 16
    assert collector.targets["a"].configs["m"].max_batch_size == 16


# A body that Triton never writes: every line carries a timestamp, so the fast parser declines
# and the whole payload goes through prometheus_client's (slow) reference parser.
SLOW_PATH_LINES = 60_000


@pytest.fixture
def huge_target() -> Iterator[FakeTargets]:
    lines = ["# TYPE app_requests counter"]
    lines += [f'app_requests_total{{path="/p{i}"}} {i} 1700000000000'
              for i in range(SLOW_PATH_LINES)]
    with serve_fake_targets("\n".join(lines) + "\n") as targets:
        yield targets


def test_a_huge_slow_path_body_does_not_delay_other_targets(
    fake_targets, huge_target, store, monkeypatch
):
    """The huge body is parsed in a worker thread: the event loop, and with it every other
    target's scrape, keeps running while it is.

    Judged against the parse's own duration, not a fixed time: it takes 0.3 s on an idle
    machine and 3-22 s with both cores busy.  The scheduler runs until the huge target's first
    scrape is done (a fixed window was too short on a busy machine: no health row yet).
    """
    assert parse_fast(huge_target.server.ok_body) is None  # really the slow path
    targets = [
        {"name": "good", "metrics_url": fake_targets.url("/ok")},
        # Its own, longer deadline: fetching 3 MB must not time out on a busy machine.  (The
        # name's stagger offset is 0.8 s of the 10 s, so the test need not wait for it.)
        # 60,000 samples: past the default sample_limit (50,000), which would refuse it.
        {"name": "slowpath", "metrics_url": huge_target.url("/ok"), "scrape_interval": "10s",
         "scrape_timeout": "10s", "sample_limit": 100_000},
    ]
    config = make_config(targets, interval="1s", timeout="1s")
    collector = Collector(config, store, metrics=SelfMetrics())
    ingests: list[tuple[float, float]] = []  # (start, end) of each slow-path ingest
    real_ingest = collector._ingest

    def timed_ingest(state, text, now, start):
        began = time.monotonic()
        try:
            return real_ingest(state, text, now, start)
        finally:
            if state.config.name == "slowpath":
                ingests.append((began, time.monotonic()))

    monkeypatch.setattr(collector, "_ingest", timed_ingest)
    _, beats = run_scheduled(
        collector, until=lambda: ("slowpath", "metrics") in collector._last_health, limit=120
    )
    health = {h.target: h for h in store.health()}
    assert health["slowpath"].up and health["slowpath"].samples == SLOW_PATH_LINES
    [(began, ended)] = ingests[:1]
    assert ended - began > 0.1  # long enough to see on a 20 ms heartbeat
    # The loop's longest pause during the parse: on the loop it would be the whole parse.
    stall = longest_stall(beats, began, ended)
    assert stall < (ended - began) / 2, (stall, ended - began)
    # And the good target kept being scraped on its 1 s schedule while the parse ran: at least
    # every other time (a busy machine stalls the loop now and then, up to ~2 s seen), and
    # mostly successfully.  A blocked loop scrapes it not once during the parse.
    good = [t for path, t in fake_targets.hits if path == "/ok"]
    scrapes_during = sum(began <= t <= ended for t in good)
    assert scrapes_during >= int((ended - began) / 2), (scrapes_during, ended - began, stall)
    (up,) = store.read(Query("up", start=0, end=time.time() + 10, target="good")).series()
    assert sum(up.values) > len(up.values) / 2, up.values


def test_maintenance_runs_retention_at_most_once_an_hour(store, monkeypatch):
    # Retention walks every series of every table even when nothing is old: it runs at the
    # first maintenance, then once RETENTION_EVERY_S has passed (rollups every time).
    from tritonwatch.collector.jobs import RETENTION_EVERY_S

    config = validate_config({"targets": [{"name": "a", "metrics_url": "http://127.0.0.1:9/m"}]})
    now = [1_000_000.0]
    collector = Collector(config, store, clock=lambda: now[0])
    calls: dict[str, list[float]] = {"rollup": [], "retention": []}
    real_rollup = store.maintenance.rollup
    real_retention = store.maintenance.apply_retention

    def rollup(at, *args, **kwargs):
        calls["rollup"].append(at)
        return real_rollup(at, *args, **kwargs)

    def retention(at, **kwargs):
        calls["retention"].append(at)
        return real_retention(at, **kwargs)

    monkeypatch.setattr(store.maintenance, "rollup", rollup)
    monkeypatch.setattr(store.maintenance, "apply_retention", retention)

    async def go():
        hour = RETENTION_EVERY_S
        for offset in (0.0, 300.0, hour - 1, hour, hour + 300):
            now[0] = 1_000_000.0 + offset
            await collector.maintain()
        await collector.close()

    asyncio.run(go())
    assert len(calls["rollup"]) == 5
    assert calls["retention"] == [1_000_000.0, 1_000_000.0 + RETENTION_EVERY_S]
