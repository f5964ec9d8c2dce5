"""``tritonwatch serve``: the collector jobs, the store and the API in one asyncio process.

Start-up takes the store's single-writer lock first (``store.writer_lock``: a second ``serve``
on the same database stops with one line naming the first; with ``cluster.enabled`` cluster
membership replaces it: tritonwatch/cluster.py), then writes any spill file the
last shutdown left (see below) before the first scrape.

Shutdown is bounded and loses no data.  On SIGTERM/SIGINT, with :data:`SHUTDOWN_TIMEOUT_S`
counted from the signal:

1. the API stops accepting and gets :data:`API_SHUTDOWN_TIMEOUT_S` for the requests in hand;
   maintenance is asked to stop at its next batch boundary; the scheduler starts nothing new;
2. running jobs (a scrape, a probe run, an evaluation) get :data:`JOB_DRAIN_TIMEOUT_S` to
   finish, and only the runs that actually started are waited for (a *missed* run never
   ends, so it must not be counted);
3. jobs still running then are stuck on a database that stopped answering: their connections
   are cut and new ones refused for :data:`INTERRUPT_GRACE_S` (``Store.interrupt``), so they
   return at once, a flush handing its samples back to the buffer;
4. the buffer is flushed, retrying, until the deadline less the store's own timeout; then the
   store's connections are cut for good (``Store.abort``) and whatever it did not take
   (samples, target health, probe results) is written to a spill file (``store.spill``) that
   the next start stores.  If even that fails, one error line gives the counts lost.

serve() returns normally in every case and always removes the signal handlers it installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

import uvicorn
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tritonwatch import memory
from tritonwatch.alerts.jobs import AlertJob
from tritonwatch.alerts.report.job import install_report_job
from tritonwatch.api.app import create_app
from tritonwatch.api.exporter import Live
from tritonwatch.cluster import Membership
from tritonwatch.collector.jobs import Collector
from tritonwatch.collector.remote_write.writer import RemoteWrite
from tritonwatch.collector.self_metrics import SelfMetrics
from tritonwatch.schemas.config import Config
from tritonwatch.store import Pending, Store, open_store, spill, writer_lock
from tritonwatch.store.store import SampleSink
from tritonwatch.store.tsdb import TsdbReader
from tritonwatch.store.writer_lock import WriterLock

log = logging.getLogger(__name__)

#: SIGTERM to exit, at most (plus the time to write a spill file: 0.15 s for 1.1 M buffered
#: samples of 1,000 targets, measured): under Docker's and Kubernetes' 30 s before SIGKILL.
SHUTDOWN_TIMEOUT_S = 25.0
#: How long the API's requests in hand get to finish (whole seconds: uvicorn's setting).
API_SHUTDOWN_TIMEOUT_S = 2
#: How long shutdown waits for running jobs before cutting their database connections.
JOB_DRAIN_TIMEOUT_S = 8.0
#: How long jobs get to return once their connections are cut.
INTERRUPT_GRACE_S = 2.0
#: Flush attempts at shutdown, and the pause between two, while the database is briefly away.
FINAL_FLUSH_ATTEMPTS = 5
FINAL_FLUSH_DELAY_S = 1.0
#: The store's timeout (``open_store(timeout_s=...)``): a SQLite busy wait or a PostgreSQL
#: connect in progress ends within it, which the final flush's deadline leaves room for.
STORE_TIMEOUT_S = 10.0

#: ``tritonwatch serve``'s exit status when another serve holds the store's writer lock.
EXIT_STORE_IN_USE = 3


class _Server(uvicorn.Server):
    # uvicorn re-raises a captured SIGTERM after serve() returns, which would kill the
    # process before the final flush; serve() installs its own handlers instead.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


#: Open files ``serve`` asks for beyond one per target (database, API, spill, probes).
OPEN_FILES_SPARE = 512


def raise_open_files_limit(targets: int) -> None:
    """Raise the soft limit on open files towards the hard one when the fleet needs it.

    Each target keeps its scrape connection open between scrapes (collector.scrape.PoolPerUrl),
    and a common soft limit is 1,024 (Go raises it to the hard limit at start for the same
    reason).  Never lowered; where the hard limit is too low, a warning says so.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    want = targets + OPEN_FILES_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if new > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    if soft < want:
        log.warning("open files limited to %d (ulimit -n) for %d targets: raise it to at least "
                    "%d, or scrapes may fail with 'too many open files'", soft, targets, want)


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def prepare_store(config: Config, sink: SampleSink | None = None) -> Store:
    """The store of ``config``, schema applied, last shutdown's spill taken back.  With
    ``store.timeseries``, samples go to ``sink`` (the TSDB's remote-write receiver, see
    :func:`timeseries_writer`) and time-series reads to the TSDB."""
    url = config.store.url
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    ts = config.store.timeseries
    store = open_store(url, batch_rows=config.store.batch_samples, timeout_s=STORE_TIMEOUT_S,
                       statement_timeout_s=config.store.statement_timeout,
                       timeseries=None if ts is None else TsdbReader.from_config(ts),
                       sink=sink, series_ttl_s=config.store.retention.series_cache_ttl)
    try:
        store.migrations.apply()
        # Before the first scrape: what the last shutdown could not write goes in first.
        spill.reingest(store, spill_dir(config))
    except BaseException:
        store.close(flush=False)
        raise
    return store


def spill_dir(config: Config) -> Path:
    """Where shutdown writes what the store would not take (``store.spill_dir``)."""
    if config.store.spill_dir:
        return Path(config.store.spill_dir)
    return spill.default_dir(config.store.url)


def take_writer_lock(config: Config) -> WriterLock | None:
    """The store's single-writer lock (see ``store.writer_lock``); raises WriterLockHeld."""
    url = config.store.url
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return writer_lock.acquire(url, postgres=config.store.writer_lock, timeout_s=STORE_TIMEOUT_S)


async def serve(
    config: Config,
    *,
    listen: str | None = None,
    sidecar: Callable[[Collector], Coroutine[Any, Any, None]] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set).  ``sidecar`` runs alongside (the demo's
    live view) and is cancelled at shutdown.

    Raises WriterLockHeld (before touching the store) when another serve writes to it.
    With ``cluster.enabled`` membership (tritonwatch/cluster.py) replaces that lock.
    """
    lock = None if config.cluster.enabled else take_writer_lock(config)
    try:
        await _serve(config, listen=listen, sidecar=sidecar, stop=stop)
    finally:
        if lock is not None:
            lock.release()


async def _serve(
    config: Config,
    *,
    listen: str | None,
    sidecar: Callable[[Collector], Coroutine[Any, Any, None]] | None,
    stop: asyncio.Event | None,
) -> None:
    raise_open_files_limit(len(config.targets))
    metrics = SelfMetrics()
    # store.timeseries: the store's samples leave through a remote-write receiver of their
    # own (queue, on-disk buffer, retries), apart from the collector's `remote_write:` list.
    ts = config.store.timeseries
    tsdb = RemoteWrite.from_config([] if ts is None else [ts.as_remote_write()],
                                   config.store.url, registry=metrics.registry)
    tsdb.start()
    try:
        store = prepare_store(config, sink=tsdb if ts is not None else None)
    except BaseException:
        tsdb.close()
        raise
    remote = RemoteWrite.from_config(config.remote_write, config.store.url,
                                     registry=metrics.registry)
    remote.start()
    collector = Collector(config, store, metrics=metrics, remote=remote)
    scheduler = AsyncIOScheduler(timezone="UTC")
    collector.install(scheduler)
    # After the collector: its job listener also logs and counts a failing alerts:evaluate.
    alert_job = AlertJob.from_config(config, store, registry=metrics.registry)
    alert_job.install(scheduler)
    install_report_job(scheduler, config, store)  # weekly SLO report (alerts/report/job.py)
    memory.install_trim(scheduler)
    membership: Membership | None = None
    if config.cluster.enabled:
        membership = Membership(config.cluster, config.store.url, collector.targets,
                                on_gain=alert_job.engine.restore,
                                on_gained=collector.read_now)
        collector.owns = membership.owns
        collector.member = membership.member
        _check_heartbeat(config)
        _evaluator_only(scheduler, membership)
    host, port = split_listen(listen or config.api.listen)
    # /api/v1/targets lists what this process collects from, not every name the store kept.
    collected = {*collector.targets, *(p.target for p in collector.probes.values())}
    if collector.nvml is not None:
        collected.add(collector.nvml.host)
    server = _Server(uvicorn.Config(
        create_app(store, registry=metrics.registry, alerting=config.alerting,
                   api=config.api, targets=collected,
                   live=Live(latest=collector.latest, engine=alert_job.engine,
                             slos=alert_job.slos)),
        host=host, port=port,
        log_level="warning", lifespan="off", access_log=False,
        # Requests blocked on a database that stopped answering must not hold shutdown.
        timeout_graceful_shutdown=API_SHUTDOWN_TIMEOUT_S,
    ))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    stopped_at: list[float] = []
    deadline: float | None = None
    peaks_done = threading.Event()
    watcher: threading.Thread | None = None

    async def _stop_server() -> None:
        await stop.wait()
        stopped_at.append(time.monotonic())
        server.should_exit = True

    try:
        try:
            log.info("serving %d target(s); store %s; API on %s:%d",
                     len(config.targets), store.url_redacted, host, port)
            drain = _RunningJobs(scheduler)
            scheduler.start()
            # -vv: what each new RSS high-water mark was, shutdown's included.
            watcher = memory.watch_peaks(peaks_done)
            tasks = [asyncio.create_task(_stop_server())]
            if membership is not None:
                # Not in `tasks` (cancelled at shutdown): it ends by itself once `stop` is
                # set, giving its leases and the evaluator lock back.
                member_task = asyncio.create_task(membership.run(stop))
            side: asyncio.Task[None] | None = (
                asyncio.create_task(sidecar(collector)) if sidecar else None
            )
            try:
                await server.serve()
            finally:
                stop.set()
                signalled = stopped_at[0] if stopped_at else time.monotonic()
                deadline = signalled + SHUTDOWN_TIMEOUT_S
                # Start nothing new, let running jobs (a scrape, a probe run, an evaluation in
                # its worker thread) finish, then stop: cancelling them mid-way would lose their
                # results and could close the store under an evaluation still writing to it.
                store.maintenance.request_stop()  # a maintenance run ends at its next batch
                scheduler.pause()
                if not await drain.wait(JOB_DRAIN_TIMEOUT_S):
                    # Stuck on a database that stopped answering: cut their connections, so
                    # that they return (a flush hands its samples back to the buffer), then
                    # let the final flush try again.
                    store.interrupt()
                    if not await drain.wait(INTERRUPT_GRACE_S):
                        log.warning("shutdown: cancelling jobs still running: %s",
                                    ", ".join(drain.names()))
                    store.resume()
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
                if membership is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(member_task, STORE_TIMEOUT_S)
                await asyncio.to_thread(alert_job.close)
                # Unsent remote-write samples stay in its on-disk buffer for the next start.
                await asyncio.to_thread(remote.close)
        finally:
            # Flushes (retrying) until the deadline, then spills what is left; never raises.
            await asyncio.to_thread(
                close_store, store, deadline=deadline, spill_to=spill_dir(config),
            )
            # After the store's last writes; unsent samples stay in its on-disk buffer.
            await asyncio.to_thread(tsdb.close)
    finally:
        peaks_done.set()
        if watcher is not None:
            watcher.join(memory.PEAK_POLL_S * 10)
        # In all cases, so that a later Ctrl-C is not swallowed by a dead event loop's handler.
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


#: The jobs exactly one cluster member runs: the one holding the evaluator lock.
EVALUATOR_JOBS = ("alerts:evaluate", "store:maintain", "reports:weekly", "reports:catch-up")


def _check_heartbeat(config: Config) -> None:
    """Warn when a takeover could cost a target more than one scrape (README "Cluster")."""
    shortest = min((config.interval_for(t) for t in config.targets), default=None)
    if shortest is not None and config.cluster.heartbeat > shortest / 2:
        log.warning("cluster.heartbeat (%gs) is over half the shortest scrape interval "
                    "(%gs): a target taken over from a dead member may miss more than one "
                    "scrape", config.cluster.heartbeat, shortest)


def _evaluator_only(scheduler: AsyncIOScheduler, membership: Membership) -> None:
    """Make :data:`EVALUATOR_JOBS` no-ops on every member but the evaluator."""
    for job_id in EVALUATOR_JOBS:
        job = scheduler.get_job(job_id)
        if job is None:
            continue

        async def gated(func: Callable[[], Coroutine[Any, Any, Any]] = job.func) -> None:
            if membership.leader:
                await func()

        scheduler.modify_job(job_id, func=gated)


class _RunningJobs:
    """Counts the job runs in flight through the scheduler's events, so shutdown can wait.

    A submission carries the run times it covers (one with ``coalesce``); each ends in exactly
    one event: executed, error, or *missed* (too late to start: the run never happens, and no
    other event follows).  Counting only submissions against executed/error left every missed
    run counted as running for ever, so the first SIGTERM after one waited the whole drain
    timeout.
    """

    def __init__(self, scheduler: AsyncIOScheduler) -> None:
        self.running: dict[str, int] = {}
        scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)
        scheduler.add_listener(self._done, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)

    def _submitted(self, event: JobSubmissionEvent) -> None:
        runs = max(1, len(event.scheduled_run_times))
        self.running[event.job_id] = self.running.get(event.job_id, 0) + runs

    def _done(self, event: JobExecutionEvent) -> None:
        left = self.running.get(event.job_id, 0) - 1
        if left > 0:
            self.running[event.job_id] = left
        else:
            self.running.pop(event.job_id, None)

    def names(self) -> list[str]:
        return sorted(self.running)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the runs in flight; True once none is left."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.running:
            log.warning("shutdown: jobs still running after %.0f s: %s",
                        timeout, ", ".join(self.names()))
        return not self.running


def close_store(
    store: Store,
    *,
    deadline: float | None = None,
    spill_to: Path | None = None,
    attempts: int | None = None,
    delay: float | None = None,
) -> None:
    """Flush what is buffered, retrying until ``deadline`` (monotonic), then close the store;
    never raises StoreError.

    Each attempt runs in a daemon thread of its own, so a database that stopped answering can
    hold neither this call past the deadline nor the process's exit.  What the store has not
    taken by then goes to a new spill file in ``spill_to`` (``store.spill``) with one warning
    line naming the file; without ``spill_to``, or if the file cannot be written, one error
    line gives the counts lost.
    """
    attempts = FINAL_FLUSH_ATTEMPTS if attempts is None else max(1, attempts)
    delay = FINAL_FLUSH_DELAY_S if delay is None else delay
    if deadline is None:
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
    # A call already in progress at the deadline (a SQLite busy wait, a PostgreSQL connect)
    # may take the store's own timeout to return: flushing stops that much earlier.
    flush_until = deadline - STORE_TIMEOUT_S
    give_up = threading.Event()
    errors: list[BaseException] = []

    def flush() -> None:
        for attempt in range(1, attempts + 1):
            try:
                written = store.flush()
            except ConnectionError as exc:
                errors.append(exc)
                log.warning("final flush failed (attempt %d/%d): %s", attempt, attempts, exc)
                pause = min(delay, flush_until - time.monotonic())
                if attempt == attempts or pause < 0 or give_up.wait(pause):
                    return
            else:
                errors.clear()
                log.info("final flush wrote %d samples", written)
                return

    worker = threading.Thread(target=flush, name="tritonwatch-final-flush", daemon=True)
    worker.start()
    worker.join(max(0.0, flush_until - time.monotonic()))
    if worker.is_alive():
        give_up.set()
        log.warning("final flush: %s has not answered by the shutdown deadline; its "
                    "connections are cut", store.url_redacted)
    if worker.is_alive() or errors:
        # Nothing may wait on this database any more: a request or job still running fails
        # at once instead of opening a connection, and the flush returns what it holds.
        store.abort()
        worker.join(max(0.0, deadline - time.monotonic()))
    pending = store.drain()
    if pending:
        _keep(store, pending, spill_to, errors[-1] if errors else None)
    lost = pending.in_flight
    if any(lost):
        log.error("shutdown: %d samples, %d health rows and %d probe results a flush was "
                  "still writing to %s when it stopped answering are lost",
                  *lost, store.url_redacted)
    store.close(flush=False)


def _keep(
    store: Store, pending: Pending, spill_to: Path | None, error: BaseException | None
) -> None:
    # The flush's own error names the store; without one, the deadline came first.
    why = (f"final flush failed: {error}" if error is not None else
           f"final flush to {store.url_redacted} did not finish by the shutdown deadline")
    if spill_to is not None:
        try:
            path = spill.write(spill_to, store.url_redacted, pending)
        except OSError as exc:
            log.error("%s; %s could not be written to a spill file in %s either (%s) and are "
                      "lost", why, pending.describe(), spill_to, exc)
            return
        log.warning("%s; %s saved to %s, to be stored at the next start", why,
                    pending.describe(), path)
        return
    log.error("%s; %s are lost", why, pending.describe())
