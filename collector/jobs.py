"""The collector's scheduled work: scrape, read the Triton APIs, flush, roll up, expire.

APScheduler (3.x, asyncio scheduler) runs one scrape job and one API job per target, plus the
store's flush, rollup and retention jobs.  Every job is added with ``coalesce=True``,
``max_instances=1`` and a misfire grace time, so a slow target can neither pile up overlapping
scrapes nor make the scheduler replay a backlog after a stall.  A failing job is logged and
counted (``tritonwatch_job_failures_total``) by an event listener — never fatal.

Scrape and API jobs for different targets are spread over their interval by a stable hash of
the job id (as Prometheus does), so a fleet does not hit the event loop all at one instant.
Parsing and deriving run in a worker thread, so one huge or odd exposition cannot hold the
event loop (and every other target's scrape) while it is parsed.  API reads, which block a
worker thread each for up to their timeout, are bounded by their own small semaphore so they
cannot take every worker thread from the scrapes.

Every series stored for a target (raw, derived, statistics API, ``up`` and its siblings) carries
the target's configured ``labels``.

All time comes from an injected ``clock`` so tests and replays control it.  What a target
keeps between runs is in :mod:`collector.target_state`; the self-metrics in
:mod:`collector.self_metrics`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tritonwatch.collector.gpu import GpuSliDeriver
from tritonwatch.collector.limits import LimitExceeded, check_sample_count
from tritonwatch.collector.nvml import NvmlCollector
from tritonwatch.collector.parse import ParseError
from tritonwatch.collector.probes.runner import ProbeRunner, resolve_url
from tritonwatch.collector.probes.sink import run_samples
from tritonwatch.collector.remote_write.writer import RemoteWrite
from tritonwatch.collector.scrape import ScrapeError, fetch_metrics, make_client
from tritonwatch.collector.self_metrics import SelfMetrics
from tritonwatch.collector.shape import match, parse_columns
from tritonwatch.collector.target_state import TargetState, with_target_labels
from tritonwatch.collector.triton import TritonApiError
from tritonwatch.schemas.config import Config
from tritonwatch.schemas.latest import LatestValues, SampleWindow
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import Sample, Snapshot, TargetHealth
from tritonwatch.schemas.untrusted import RepeatLimiter, log_safe
from tritonwatch.store import Store

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: Most Triton API reads in flight at once (each holds a worker thread until it answers).
API_MAX_CONCURRENCY = 8
#: A health error (a target's text, escaped) is cut to this many characters, in the log and
#: in the store: a 60 KB unparsable line quoted whole on every scrape filled the log.
HEALTH_ERROR_MAX = 500
#: The same kind of log line about one target (down, back up, series refused) or one failing
#: job is written at most once per this many seconds; the next says how many were held back.
LOG_REPEAT_S = 300.0
#: Retention runs at most this often (maintenance itself runs every 5 minutes).  It walks every
#: series of every table even when nothing has aged out: at 1,000 targets that was 11.5 s of
#: CPU each run, 4 % of a core for deletes that, against retentions of days, can wait an hour.
RETENTION_EVERY_S = 3600.0


def stagger_offset(name: str, interval: float) -> float:
    """A stable offset in [0, interval) for ``name``, so targets don't scrape in lockstep."""
    digest = hashlib.sha256(name.encode()).digest()
    return (int.from_bytes(digest[:8], "big") / 2**64) * interval


class Collector:
    """Owns every target's state and the jobs that feed the store."""

    def __init__(
        self,
        config: Config,
        store: Store,
        *,
        clock: Clock = time.time,
        metrics: SelfMetrics | None = None,
        client: httpx.AsyncClient | None = None,
        remote: RemoteWrite | None = None,
    ) -> None:
        self.config = config
        self.store = store
        #: Remote-write receivers: every sample written to the store also goes to each.
        self.remote = remote or RemoteWrite([])
        #: Which targets this process collects now (``cluster``: its leased share); None: all.
        self.owns: Callable[[str], bool] | None = None
        #: This process's cluster member name, sent with each scrape (``MEMBER_HEADER``).
        self.member: str | None = None
        self._scheduler: AsyncIOScheduler | None = None
        #: Targets read at once on takeover: monotonic start, so the next staggered run
        #: does not read them again a moment later.
        self._read_now: dict[str, float] = {}
        self._retention_at: float | None = None  # clock() of the last retention run
        self.clock = clock
        self.metrics = metrics or SelfMetrics()
        self.targets = {t.name: TargetState(t, config) for t in config.targets}
        self._client = client
        self._semaphore = asyncio.Semaphore(config.scrape.max_concurrency)
        self._api_semaphore = asyncio.Semaphore(
            min(config.scrape.max_concurrency, API_MAX_CONCURRENCY)
        )
        self._last_health: dict[tuple[str, str], TargetHealth] = {}
        self._log_limiter = RepeatLimiter(LOG_REPEAT_S)
        # The series limit is the store's to enforce: only it knows which series are new.
        self._series_limits = {
            name: st.limits.series_limit for name, st in self.targets.items()
            if st.limits.series_limit
        }
        store.limit_series(self._series_limits, on_refused=self._series_refused)
        self.nvml: NvmlCollector | None = None
        self.gpu_deriver: GpuSliDeriver | None = None
        if config.nvml.enabled:
            self.nvml = NvmlCollector.from_config(config.nvml, clock=clock)
            self.gpu_deriver = GpuSliDeriver(
                idle_utilization_below=config.nvml.idle_utilization_below,
                queue_time_rise_min_s=config.nvml.queue_time_rise_min,
            )
        self.probes: dict[str, ProbeRunner] = {}
        self.latest_probes: dict[str, list[ProbeResult]] = {}  # last run of each, for display
        #: Latest derived values of every source, for /metrics (api/exporter.py).
        self.latest = LatestValues()
        for probe in config.probes:
            target, url = resolve_url(probe, config)
            self.probes[probe.name] = ProbeRunner(probe, url, target)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = make_client(max_connections=self.config.scrape.max_concurrency,
                                       member=self.member)
        return self._client

    async def close(self) -> None:
        if self.nvml is not None:
            await asyncio.to_thread(self.nvml.close)
        for runner in self.probes.values():
            await asyncio.to_thread(runner.close)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _series_refused(self, target: str, series: int, samples: int) -> None:
        # Called by the store's flush, in its thread.
        self.metrics.series_refused.labels(target).inc(samples)
        suppressed = self._log_limiter.check(("series_limit", target))
        if suppressed is not None:
            log.warning(
                "target %s: %d new series refused, the target has reached its series_limit "
                "(%d series in the store); %d samples dropped, its other series kept%s",
                target, series, self._series_limits.get(target, 0), samples,
                self._log_limiter.note(suppressed),
            )

    async def _record(self, health: TargetHealth) -> TargetHealth:
        """Log, count and buffer ``health``; returns it as recorded (its error made safe)."""
        # Error texts quote what a target or model server sent: escaped and cut once, here,
        # for the log, the store and the API alike.
        if health.error is not None:
            health = health._replace(error=log_safe(health.error, HEALTH_ERROR_MAX))
        # Log transitions only: a target that stays down must not write a line per scrape; and
        # at most one line per target and kind every LOG_REPEAT_S, so a target whose error
        # changes every scrape (or that flaps) cannot either.
        key = (health.target, health.source)
        before = self._last_health.get(key)
        if not health.up and (before is None or before.up or before.error != health.error):
            suppressed = self._log_limiter.check(("down", *key))
            if suppressed is not None:
                log.warning("%s of target %s down: %s%s", health.source, health.target,
                            health.error, self._log_limiter.note(suppressed))
        elif health.up and before is not None and not before.up:
            suppressed = self._log_limiter.check(("up", *key))
            if suppressed is not None:
                log.warning("%s of target %s is back up%s", health.source, health.target,
                            self._log_limiter.note(suppressed))
        self._last_health[key] = health
        self.metrics.record(health)
        self.store.write_health(health)  # buffered: never waits for the database
        return health

    async def scrape(self, name: str) -> TargetHealth:
        """Scrape one target, derive its SLIs, buffer everything for the store."""
        state = self.targets[name]
        target = state.config
        now = self.clock()
        start = time.perf_counter()
        try:
            async with self._semaphore:
                body = await fetch_metrics(
                    self.client, name, target.metrics_url,
                    timeout=self.config.timeout_for(target),
                    max_bytes=self.config.scrape.max_body_bytes, headers=target.headers,
                )
            # Off the event loop: a body that takes the reference parser can take seconds.
            # One hop for parse, derive and buffering: each thread hop costs a wake-up.
            health = await asyncio.to_thread(self._ingest, state, body.text, now, start)
        except (ScrapeError, ParseError) as exc:
            reason = exc.reason if isinstance(exc, ScrapeError) else f"unparsable body: {exc}"
            return await self._scrape_failed(state, now, start, reason)
        except LimitExceeded as exc:
            return await self._scrape_failed(state, now, start, exc.reason, exc.samples)
        except Exception as exc:
            # A bug, not a broken target: health goes down (never stale "up"), the job
            # listener counts and logs the exception.
            await self._scrape_failed(
                state, now, start, f"scrape of target {name!r} failed: {exc!r}"
            )
            raise
        health = await self._record(health)
        return health

    def _ingest(self, state: TargetState, text: str, now: float, start: float) -> TargetHealth:
        """Parse, derive and buffer one scrape; runs in a worker thread.

        Column-wise end to end: the payload is read as one value array against the target's
        shape (collector.shape), the deriver reads it through a plan built once per shape
        (``Deriver.derive_columns``), and the store gets the shape's own name and label lists,
        so the steady state builds no per-sample objects for the raw series.
        """
        target = state.config
        values = match(text, state.shape)
        if values is not None:
            # The steady state: the same lines as the last scrape, whose sample count the
            # limits below check again (len(shape)), so counting lines first would only cost
            # two passes over the body (about 0.5 ms for a 380 KiB payload).
            shape = state.shape
            assert shape is not None
        else:
            check_sample_count(target.name, text, state.limits)
            shape, values = parse_columns(text, state.shape, try_match=False)
        reason = state.limit_violation(shape)
        if reason is not None:
            # Nothing of it is stored or derived (as Prometheus); the shape is kept, so the
            # same payload next time is recognised without a full parse or another check.
            state.shape = shape
            raise LimitExceeded(target.name, reason, len(values))
        with state.derive_lock:
            derived = state.deriver.derive_columns(shape, values, now, state.configs)
        health = TargetHealth(
            target.name, "metrics", now, True, time.perf_counter() - start, len(values)
        )
        extra = derived + self._up_samples(health)
        if target.labels:
            extra = with_target_labels(extra, target.labels)
        names, labels = state.stored_series(
            shape, [s.name for s in extra], [s.labels for s in extra]
        )
        stored = np.concatenate(
            [values, np.fromiter((s.value for s in extra), np.float64, len(extra))])
        # What is kept until the next scrape is windows over the lists and array handed to
        # the store, not the samples themselves (SampleWindow).
        n, n_derived = len(values), len(derived)
        if target.labels:  # the derived SLIs' own labels are not the stored ones
            own_names, own_labels = state.derived_series(
                [s.name for s in derived], [s.labels for s in derived])
            kept: Sequence[Sample] = SampleWindow(own_names, own_labels,
                                                  stored[n:n + n_derived])
        else:
            kept = SampleWindow(names, labels, stored, n, n + n_derived)
        state.shape, state.last_scrape = shape, (shape, stored[:n], kept)
        self.latest.put_window(target.name, "metrics", now,
                               SampleWindow(names, labels, stored, n, len(stored)))
        self.store.write_columns(target.name, now, names, labels, stored)
        if self.remote:
            self.remote.append_columns(target.name, now, names, labels, stored)
        return health

    def _write(self, target: str, now: float, samples: list[Sample]) -> None:
        """Samples one by one to the store and every remote-write receiver (worker thread)."""
        self.store.write(target, now, samples)
        if self.remote:
            self.remote.append(target, now, samples)

    async def _scrape_failed(
        self, state: TargetState, now: float, start: float, reason: str, scraped: int = 0
    ) -> TargetHealth:
        """``scraped``: how many samples a refused scrape held (a limit), reported like
        Prometheus's ``scrape_samples_scraped``."""
        # The last good snapshot is no longer the target's state: the GPU join must not keep
        # joining a dead server's frozen queue with live NVML readings.
        state.forget_scrape()
        name = state.config.name
        self.latest.drop(name, "metrics")
        health = TargetHealth(
            name, "metrics", now, False, time.perf_counter() - start, scraped, reason
        )
        health = await self._record(health)
        samples = self._up_samples(health)
        if state.config.labels:
            samples = with_target_labels(samples, state.config.labels)
        await asyncio.to_thread(self._write, name, now, samples)
        return health

    @staticmethod
    def _up_samples(health: TargetHealth) -> list[Sample]:
        # Stored like Prometheus's synthetic series, so "target stopped answering" is a plain
        # query over history rather than a special case.
        return [
            Sample("up", (), 1.0 if health.up else 0.0),
            Sample("scrape_duration_seconds", (), health.duration_s),
            Sample("scrape_samples_scraped", (), float(health.samples)),
        ]

    async def read_api(self, name: str) -> TargetHealth:
        """Refresh model configs and statistics of one target.

        Health is recorded before anything that needs the database, so a down store never
        leaves the API's health stale; any failure of the reading itself marks it down.
        """
        state = self.targets[name]
        now = self.clock()
        if state.api is None:
            raise ValueError(f"target {name!r} has no API endpoint")
        try:
            async with self._api_semaphore:
                reading = await state.api.read(now)
            state.set_configs(reading.configs)
            samples, raw_count = await asyncio.to_thread(self._derive_api, state, reading.stats,
                                                         reading.readiness)
        except TritonApiError as exc:
            self.latest.drop(name, "api")
            health = TargetHealth(name, "api", now, False, 0.0, 0, exc.reason)
            health = await self._record(health)
            # The health APIs did not answer: neither live nor ready, as a probe would see it.
            down = [Sample("triton_server_live", (), 0.0), Sample("triton_server_ready", (), 0.0)]
            if state.config.labels:
                down = with_target_labels(down, state.config.labels)
            self.latest.put(name, "api", now, down)
            await asyncio.to_thread(self._write, name, now, down)
            return health
        except Exception as exc:
            self.latest.drop(name, "api")
            # Bad values in the JSON, a missing key...: down, naming the target, and re-raised
            # so the job listener counts it.
            health = TargetHealth(name, "api", now, False, 0.0, 0,
                                  f"API reading of target {name!r} failed: {exc!r}")
            health = await self._record(health)
            raise
        self.latest.put(name, "api", now, samples)
        health = TargetHealth(name, "api", now, True, reading.duration_s, raw_count)
        health = await self._record(health)
        await asyncio.to_thread(self._write, name, now, samples)
        await self._write_configs(state, reading.raw_configs, now)
        return health

    @staticmethod
    def _derive_api(state: TargetState, stats: Snapshot, readiness: Iterable[Sample] = ()
                    ) -> tuple[list[Sample], int]:
        # Runs in a worker thread: every stored sample of the reading, and how many were raw.
        raw = list(stats.samples())
        with state.derive_lock:
            derived = state.deriver.derive(stats, state.configs)
        samples = raw + derived + list(readiness)
        if state.config.labels:
            samples = with_target_labels(samples, state.config.labels)
        return samples, len(raw)

    async def _write_configs(
        self, state: TargetState, raw_configs: Mapping[str, dict[str, Any]], now: float
    ) -> None:
        """Write the model configs that changed since the last successful write.

        A failed write (database down) raises for the job listener; what was not written is
        retried on the next reading.
        """
        written = state.written_configs
        for model in [m for m in written if m not in raw_configs]:
            del written[model]  # unloaded: write it again when it comes back
        for model, config in raw_configs.items():
            if written.get(model) == config:
                continue
            await asyncio.to_thread(
                self.store.put_model_config, state.config.name, model, config, now
            )
            written[model] = config

    async def read_nvml(self) -> TargetHealth:
        """Local GPUs through NVML, joined with every target's view of the same GPUs.

        The join runs even while NVML is unavailable: it then works from Triton's nv_gpu_*
        series alone, so "idle while requests queue" still flows on hosts without NVML.
        """
        if self.nvml is None or self.gpu_deriver is None:
            raise ValueError("NVML is disabled in the configuration")
        # Off the event loop, in one hop: the join reads every target's last scrape and
        # would otherwise hold every scrape while it runs.
        health = await asyncio.to_thread(self._read_nvml, self.nvml, self.gpu_deriver)
        health = await self._record(health)
        return health

    def _read_nvml(self, nvml: NvmlCollector, deriver: GpuSliDeriver) -> TargetHealth:
        """NVML, the join and the store write; runs in a worker thread."""
        samples, health = nvml.collect()
        readings = {name: st.gpu_reading() for name, st in self.targets.items()}
        samples = samples + deriver.derive_columns(samples, readings)
        self.latest.put(health.target, "nvml", health.ts, samples)
        self._write(health.target, health.ts, samples)
        return health

    async def run_probe(self, name: str) -> list[ProbeResult]:
        """One run of a synthetic probe (in a worker thread); results, series and histograms.

        Request errors are results, not exceptions; whatever else goes wrong is recorded as the
        probe's health and re-raised for the job listener, which counts it and carries on.
        """
        runner = self.probes[name]
        source = f"probe:{name}"
        now = self.clock()
        start = time.perf_counter()
        try:
            results = await asyncio.to_thread(runner.run)
        except Exception as exc:
            health = TargetHealth(runner.target, source, now, False, time.perf_counter() - start,
                                  0, f"probe run failed: {exc!r}")
            health = await self._record(health)
            raise
        self.latest_probes[name] = results
        for result in results:
            self.metrics.probes.observe(result)
        failed = [r for r in results if not r.ok]
        await asyncio.to_thread(self.store.write_probe_results, results)
        series = run_samples(runner.config, results)
        self.latest.put(runner.target, source, now, series)
        await asyncio.to_thread(self._write, runner.target, now, series)
        error = None
        if failed:
            last = failed[-1]
            error = f"{len(failed)}/{len(results)} failed; last {last.error_kind}: " \
                    f"{last.error_message}"
        health = TargetHealth(runner.target, source, now, len(failed) < len(results),
                              time.perf_counter() - start, len(results), error)
        health = await self._record(health)
        return results

    async def flush(self) -> int:
        try:
            return await asyncio.to_thread(self.store.flush)
        except ConnectionError:
            self.metrics.store_errors.inc()
            raise

    async def maintain(self) -> None:
        """Rollups, then retention (at most every :data:`RETENTION_EVERY_S`); both run in a
        worker thread and in bounded batches, and stop at a batch boundary once shutdown has
        begun (``Store.maintenance.request_stop``)."""
        now = self.clock()
        retention = self.config.store.retention
        await asyncio.to_thread(self.store.maintenance.rollup, now)
        if self.store.maintenance.stopping:
            return  # shutting down: retention waits for the next start
        if self._retention_at is not None and now - self._retention_at < RETENTION_EVERY_S:
            return
        self._retention_at = now
        await asyncio.to_thread(
            self.store.maintenance.apply_retention, now, raw_s=retention.raw,
            rollup_5m_s=retention.rollup_5m, rollup_1h_s=retention.rollup_1h,
        )

    def collects(self, target: str) -> bool:
        """Whether this process reads ``target`` now (always, outside a cluster)."""
        return self.owns is None or self.owns(target)

    def _just_read(self, job_id: str, interval: float) -> bool:
        """Whether a takeover read of ``job_id`` started less than half an interval ago (the
        staggered run then waits for its next turn); clears the mark either way."""
        started = self._read_now.pop(job_id, None)
        return started is not None and time.monotonic() - started < interval / 2

    async def _scrape_if_owned(self, name: str) -> None:
        interval = self.config.interval_for(self.targets[name].config)
        if self.collects(name) and not self._just_read(f"scrape:{name}", interval):
            await self.scrape(name)

    async def _api_if_owned(self, name: str) -> None:
        if self.collects(name) and not self._just_read(f"api:{name}",
                                                        self.config.scrape.api_interval):
            await self.read_api(name)

    async def _read_now_if_owned(self, job_id: str, name: str) -> None:
        if not self.collects(name):
            return
        self._read_now[job_id] = time.monotonic()
        if job_id.startswith("scrape:"):
            await self.scrape(name)
        else:
            await self.read_api(name)

    def read_now(self, names: Iterable[str]) -> None:
        """Scrape (and read the API of) ``names`` once now, beside their staggered jobs: a
        cluster member taking them over closes the gap at once instead of up to an interval
        later.  The staggered schedule is kept (the fleet stays spread out); its next run is
        skipped if it comes within half an interval of this one.  Call from the event loop
        after :meth:`install`."""
        if self._scheduler is None:
            return
        now = datetime.now(UTC)
        for name in names:
            state = self.targets.get(name)
            if state is None:
                continue
            jobs = [(f"scrape:{name}", self.config.interval_for(state.config))]
            if state.api is not None:
                jobs.append((f"api:{name}", self.config.scrape.api_interval))
            for job_id, interval in jobs:
                self._scheduler.add_job(
                    self._read_now_if_owned, "date", run_date=now, args=[job_id, name],
                    id=f"{job_id}:now", name=f"{job_id}:now", replace_existing=True,
                    misfire_grace_time=max(1, int(interval)),
                )

    async def _probe_if_owned(self, name: str) -> None:
        if self.collects(self.probes[name].target):
            await self.run_probe(name)

    def install(self, scheduler: AsyncIOScheduler) -> None:
        """Add every job to ``scheduler`` (which the caller starts and stops).

        Scrape, API and probe jobs exist for every configured target; in a cluster each run
        first asks :meth:`collects`, so a target moving between members needs no job change.
        """
        scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED)
        self._scheduler = scheduler
        now = datetime.now(UTC)
        for name, state in self.targets.items():
            interval = self.config.interval_for(state.config)
            self._add(scheduler, self._scrape_if_owned, f"scrape:{name}", interval, now,
                      args=[name])
            if state.api is not None:
                self._add(scheduler, self._api_if_owned, f"api:{name}",
                          self.config.scrape.api_interval, now, args=[name])
        if self.nvml is not None:
            self._add(scheduler, self.read_nvml, "nvml", self.config.nvml.interval, now)
        for name, runner in self.probes.items():
            self._add(scheduler, self._probe_if_owned, f"probe:{name}", runner.config.interval,
                      now, args=[name])
        self._add(scheduler, self.flush, "store:flush", self.config.store.flush_interval, now)
        self._add(scheduler, self.maintain, "store:maintain", 300.0, now)

    @staticmethod
    def _add(
        scheduler: AsyncIOScheduler, func: Callable[..., Any], job_id: str, interval: float,
        now: datetime, args: list[Any] | None = None,
    ) -> None:
        offset = stagger_offset(job_id, interval)
        scheduler.add_job(
            func, "interval", seconds=interval, id=job_id, name=job_id, args=args or [],
            next_run_time=now + timedelta(
                seconds=offset if job_id.startswith(("scrape:", "api:", "probe:")) else 0
            ),
            coalesce=True, max_instances=1, misfire_grace_time=max(1, int(interval)),
            replace_existing=True,
        )

    def _on_job_event(self, event: JobExecutionEvent) -> None:
        job = str(event.job_id).split(":", 1)[0]
        if isinstance(event.exception, asyncio.CancelledError):
            return  # the scheduler is shutting down mid-scrape: not a failure
        if event.code == EVENT_JOB_MISSED:
            self.metrics.job_missed.labels(job).inc()
            log.warning("job %s missed its run time", event.job_id)
        else:
            self.metrics.job_failures.labels(job).inc()
            # The exception may quote a target's text; a job failing every interval writes
            # one line per LOG_REPEAT_S.
            suppressed = self._log_limiter.check(("job", event.job_id))
            if suppressed is not None:
                log.error("job %s failed: %s%s", event.job_id,
                          log_safe(repr(event.exception), HEALTH_ERROR_MAX),
                          self._log_limiter.note(suppressed))
