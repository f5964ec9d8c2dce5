"""The weekly report job inside ``serve`` (APScheduler cron, ``reports.day``/``hour`` in
``reports.timezone``), and the catch-up of a week missed while the service was down.

``ReportJob.run_once(now)`` produces every *due* week not kept yet, oldest first: the latest
due week (the last complete week once its scheduled time has passed, else the week before) and
the weeks before it missed while the service was down, back ``reports.catch_up_weeks`` weeks
and never before the first week kept for this configuration.  A week kept already is skipped
(the store's unique key, see ``produce``), so a restart, a second ``serve`` or a fire after a
catch-up never produce a week twice.  Each delivery's outcome is kept in the store
(``report_deliveries``); a failed one is tried again at the start of the next run, until
``reports.delivery_attempts`` attempts.  At start-up ``install``
runs it once (the catch-up), then at every scheduled time.  Time comes from the injected
``clock``.  Jobs run in a worker thread (the store and the delivery block); a failure reaches
the scheduler's job listener, which logs and counts it, and never stops the scheduler.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from tritonwatch.alerts.report.deliver import (
    report_link,
    send_email,
    send_webhook,
    webhook_payload,
)
from tritonwatch.alerts.report.model import Report
from tritonwatch.alerts.report.produce import Produced, config_key, produce, slo_specs
from tritonwatch.alerts.report.weeks import Week
from tritonwatch.schemas.config import Config
from tritonwatch.store import Store
from tritonwatch.store.reports import ReportStore

log = logging.getLogger(__name__)

JOB_ID = "reports:weekly"
CATCH_UP_ID = "reports:catch-up"
#: A fire that comes this late (the loop was blocked, the machine slept) still runs.
MISFIRE_GRACE_S = 6 * 3600


class ReportJob:
    def __init__(self, store: Store, config: Config, *,
                 clock: Callable[[], float] = time.time, isolate_charts: bool = False) -> None:
        self.store, self.config, self.clock = store, config, clock
        #: Draw the charts in a child process (render.render_html): serve's job does.
        self.isolate_charts = isolate_charts
        self.specs = slo_specs(config)  # read once: a bad rules file fails serve's start-up
        self.delivered: list[tuple[str, str, bool]] = []  # (week, channel, ok), for tests

    def latest_due(self, now: float) -> Week:
        rep = self.config.reports
        week = Week.last_complete(now, rep.timezone)
        return week if now >= week.scheduled_at(rep.day, rep.hour) else week.shift(-1)

    def due_weeks(self, now: float) -> list[Week]:
        """The weeks to produce now, oldest first: the latest due week and those before it,
        back ``reports.catch_up_weeks`` weeks, that are not kept for this configuration —
        none older than the first week kept for it (with none kept: the latest only)."""
        rep = self.config.reports
        latest = self.latest_due(now)
        kept = ReportStore(self.store).kept_weeks(config_key(self.config, self.specs))
        if not kept:
            return [latest]
        # ISO week names ("2026-W43") sort as the weeks do.
        first = min(kept)
        weeks = [latest.shift(-i) for i in range(rep.catch_up_weeks - 1, -1, -1)]
        return [w for w in weeks if w.name not in kept and w.name > first]

    def run_once(self, now: float | None = None) -> Produced | None:
        """Retry the deliveries that failed before, then produce and deliver every due week
        not kept yet (``due_weeks``); the newest week produced, or None."""
        now = self.clock() if now is None else now
        self.retry_deliveries(now)
        weeks = self.due_weeks(now)
        if not weeks:
            return None
        try:
            self.store.flush()  # the report reads flushed samples only
        except ConnectionError as exc:
            log.warning("report %s: flush before the report failed, going on: %s",
                        weeks[-1].name, exc)
        made = None
        for week in weeks:
            produced = produce(self.store, self.config, week, specs=self.specs, now=now,
                               isolate_charts=self.isolate_charts)
            if produced is not None:
                self.deliver(produced, now)
                made = produced
        return made

    def _channels(self) -> list[str]:
        rep = self.config.reports
        return [c for c, cfg in (("webhook", rep.webhook), ("smtp", rep.smtp))
                if cfg is not None]

    def _send(self, channel: str, report_id: int, data: Mapping[str, Any] | Report,
              html: str, markdown: str) -> bool:
        rep = self.config.reports
        if channel == "webhook":
            assert rep.webhook is not None
            base = rep.external_url or self.config.alerting.external_url
            payload = webhook_payload(data, report_id, report_link(base, report_id))
            return send_webhook(rep.webhook, payload)
        assert rep.smtp is not None
        return send_email(rep.smtp, data, html, markdown)

    def deliver(self, produced: Produced, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        reports = ReportStore(self.store)
        for channel in self._channels():
            ok = self._send(channel, produced.id, produced.report, produced.documents["html"],
                            produced.documents["md"])
            self.delivered.append((produced.report.week, channel, ok))
            attempts = reports.record_delivery(produced.id, channel, ok, now)
            if not ok:
                log.warning("report %s: %s delivery failed (attempt %d of %d), tried again "
                            "on the next run", produced.report.week, channel, attempts,
                            self.config.reports.delivery_attempts)

    def retry_deliveries(self, now: float) -> None:
        """Deliver again each kept report whose delivery failed, on the channels still
        configured, until ``reports.delivery_attempts`` attempts were made."""
        reports = ReportStore(self.store)
        limit = self.config.reports.delivery_attempts
        channels = self._channels()
        for pending in reports.pending_deliveries(limit):
            if pending.channel not in channels:
                continue
            docs = {fmt: reports.document(pending.report_id, fmt)
                    for fmt in ("json", "html", "md")}
            if any(d is None for d in docs.values()):
                continue  # the report is gone
            data = json.loads(docs["json"] or "{}")
            ok = self._send(pending.channel, pending.report_id, data, docs["html"] or "",
                            docs["md"] or "")
            self.delivered.append((pending.week, pending.channel, ok))
            attempts = reports.record_delivery(pending.report_id, pending.channel, ok, now)
            if ok:
                log.info("report %s: %s delivered on attempt %d", pending.week,
                         pending.channel, attempts)
            elif attempts >= limit:
                log.error("report %s: %s delivery failed %d times, given up", pending.week,
                          pending.channel, attempts)

    async def run(self) -> None:
        await asyncio.to_thread(self.run_once)

    def trigger(self) -> CronTrigger:
        rep = self.config.reports
        return CronTrigger(day_of_week=rep.day, hour=rep.hour, minute=0,
                           timezone=ZoneInfo(rep.timezone))

    def install(self, scheduler: AsyncIOScheduler) -> None:
        common = {"coalesce": True, "max_instances": 1, "misfire_grace_time": MISFIRE_GRACE_S,
                  "replace_existing": True}
        scheduler.add_job(self.run, self.trigger(), id=JOB_ID, name=JOB_ID, **common)
        # The catch-up: a week whose time passed while no serve ran is produced now, once.
        scheduler.add_job(self.run, "date", run_date=datetime.fromtimestamp(self.clock(), UTC),
                          id=CATCH_UP_ID, name=CATCH_UP_ID, **common)


def install_report_job(scheduler: AsyncIOScheduler, config: Config,
                       store: Store) -> ReportJob | None:
    """Add the weekly report job to ``serve``'s scheduler (None when ``reports.enabled`` is
    false)."""
    if not config.reports.enabled:
        return None
    # Its charts are drawn in a child process: matplotlib would stay resident in serve.
    job = ReportJob(store, config, isolate_charts=True)
    job.install(scheduler)
    rep = config.reports
    log.info("reports: weekly on %s at %02d:00 %s", rep.day, rep.hour, rep.timezone)
    return job
