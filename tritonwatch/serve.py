"""``tritonwatch serve``: the collector jobs, the store and the API in one asyncio process.

Shutdown order matters for "loses no data": on SIGTERM/SIGINT the API stops accepting
requests, the scheduler stops starting jobs, running scrapes finish, and only then is the
store's buffer flushed (retried a few times if the database is briefly away).  If the database
stays away, one error says how many samples were lost and where; serve() still returns normally
and always removes the signal handlers it installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

import uvicorn
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_SUBMITTED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tritonwatch import memory
from tritonwatch.alerts.jobs import AlertJob
from tritonwatch.alerts.report.job import install_report_job
from tritonwatch.api.app import create_app
from tritonwatch.collector.jobs import Collector, SelfMetrics
from tritonwatch.schemas.config import Config
from tritonwatch.store import Store, open_store

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    # uvicorn re-raises a captured SIGTERM after serve() returns, which would kill the
    # process before the final flush; serve() installs its own handlers instead.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def prepare_store(config: Config) -> Store:
    url = config.store.url
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    store = open_store(url, batch_rows=config.store.batch_samples)
    store.create_schema()
    return store


async def serve(
    config: Config,
    *,
    listen: str | None = None,
    sidecar: Callable[[Collector], Coroutine[Any, Any, None]] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set).  ``sidecar`` runs alongside (the demo's
    live view) and is cancelled at shutdown."""
    store = prepare_store(config)
    metrics = SelfMetrics()
    collector = Collector(config, store, metrics=metrics)
    scheduler = AsyncIOScheduler(timezone="UTC")
    collector.install(scheduler)
    # After the collector: its job listener also logs and counts a failing alerts:evaluate.
    alert_job = AlertJob.from_config(config, store, registry=metrics.registry)
    alert_job.install(scheduler)
    install_report_job(scheduler, config, store)  # weekly SLO report (alerts/report/job.py)
    if memory.can_trim():
        scheduler.add_job(
            asyncio.to_thread, "interval", args=[memory.release_free_memory],
            seconds=memory.TRIM_INTERVAL_S, id="memory:trim", name="memory:trim",
            coalesce=True, max_instances=1, replace_existing=True,
        )
    host, port = split_listen(listen or config.api.listen)
    # /api/v1/targets lists what this process collects from, not every name the store kept.
    collected = {*collector.targets, *(p.target for p in collector.probes.values())}
    if collector.nvml is not None:
        collected.add(collector.nvml.host)
    server = _Server(uvicorn.Config(
        create_app(store, registry=metrics.registry, alerting=config.alerting,
                   api=config.api, targets=collected),
        host=host, port=port,
        log_level="warning", lifespan="off", access_log=False,
    ))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    async def _stop_server() -> None:
        await stop.wait()
        server.should_exit = True

    try:
        try:
            log.info("serving %d target(s); store %s; API on %s:%d",
                     len(config.targets), store.url_redacted, host, port)
            drain = _RunningJobs(scheduler)
            scheduler.start()
            tasks = [asyncio.create_task(_stop_server())]
            side: asyncio.Task[None] | None = (
                asyncio.create_task(sidecar(collector)) if sidecar else None
            )
            try:
                await server.serve()
            finally:
                stop.set()
                # Start nothing new, let running jobs (a scrape, a probe run, an evaluation in
                # its worker thread) finish, then stop: cancelling them mid-way would lose their
                # results and could close the store under an evaluation still writing to it.
                scheduler.pause()
                await drain.wait(JOB_DRAIN_TIMEOUT_S)
                scheduler.shutdown(wait=False)
                if side is not None:
                    side.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await side
                for task in tasks:
                    task.cancel()
                # Let in-flight scrapes (already awaiting I/O) land in the buffer first.
                await asyncio.sleep(0)
                await collector.close()
                await asyncio.to_thread(alert_job.close)
        finally:
            # Flushes (retrying), then closes; logs lost samples instead of raising.
            close_store(store)
    finally:
        # In all cases, so that a later Ctrl-C is not swallowed by a dead event loop's handler.
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


#: How long shutdown waits for running jobs before cancelling them.
JOB_DRAIN_TIMEOUT_S = 20.0


class _RunningJobs:
    """Counts jobs in flight through the scheduler's events, so shutdown can wait for them."""

    def __init__(self, scheduler: AsyncIOScheduler) -> None:
        self.running: dict[str, int] = {}
        scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)
        scheduler.add_listener(self._done, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)

    def _submitted(self, event: JobSubmissionEvent) -> None:
        self.running[event.job_id] = self.running.get(event.job_id, 0) + 1

    def _done(self, event: JobExecutionEvent) -> None:
        left = self.running.get(event.job_id, 0) - 1
        if left > 0:
            self.running[event.job_id] = left
        else:
            self.running.pop(event.job_id, None)

    async def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.running:
            log.warning("shutdown: cancelling jobs still running after %.0f s: %s",
                        timeout, ", ".join(sorted(self.running)))


#: Flush attempts at shutdown, and the pause between two, while the database is briefly away.
FINAL_FLUSH_ATTEMPTS = 5
FINAL_FLUSH_DELAY_S = 1.0


def close_store(store: Store, attempts: int | None = None, delay: float | None = None) -> None:
    """Flush what is buffered, retrying, then close the store; never raises StoreError.

    The last attempt is ``store.close()`` itself (which flushes, then releases the connections
    whether that worked or not), so a database that stays away costs ``attempts`` flushes, not
    one more.  If it fails, one error names the store and the samples lost.
    """
    attempts = FINAL_FLUSH_ATTEMPTS if attempts is None else max(1, attempts)
    delay = FINAL_FLUSH_DELAY_S if delay is None else delay
    for attempt in range(1, attempts):
        try:
            written = store.flush()
        except ConnectionError as exc:
            log.warning("final flush failed (attempt %d/%d): %s", attempt, attempts, exc)
            time.sleep(delay)
        else:
            log.info("final flush wrote %d samples", written)
            break
    try:
        store.close()
    except ConnectionError as exc:
        log.error(
            "final flush failed (attempt %d/%d), giving up: %d buffered samples could not be "
            "written to %s and are lost: %s",
            attempts, attempts, store.buffered, store.url_redacted, exc,
        )


def final_flush(store: Store, attempts: int = 5, delay: float = 1.0) -> bool:
    """Flush the buffer, retrying; True once written.  Logs failures, raises nothing.

    Shutdown uses :func:`close_store`, which also closes the store.
    """
    for attempt in range(1, attempts + 1):
        try:
            written = store.flush()
            log.info("final flush wrote %d samples", written)
            return True
        except ConnectionError as exc:
            log.error("final flush failed (attempt %d/%d): %s", attempt, attempts, exc)
            if attempt < attempts:
                time.sleep(delay)
    log.error("giving up: %d buffered samples could not be written to %s",
              store.buffered, store.url_redacted)
    return False
