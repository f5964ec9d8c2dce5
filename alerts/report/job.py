"""The weekly report job inside ``serve`` (APScheduler cron, ``reports.day``/``hour`` in
``reports.timezone``), and the catch-up of a week missed while the service was down.

``ReportJob.run_once(now)`` produces the *latest due* week: the last complete week once its
scheduled time has passed, else the week before.  It does nothing when that week is kept for
this configuration already (the store's unique key, see ``produce``), so a restart, a second
``serve`` or a fire after a catch-up never produce a week twice.  At start-up ``install``
runs it once (the catch-up), then at every scheduled time.  Time comes from the injected
``clock``.  Jobs run in a worker thread (the store and the delivery block); a failure reaches
the scheduler's job listener, which logs and counts it, and never stops the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from tritonwatch.alerts.report.deliver import (
    report_link,
    send_email,
    send_webhook,
    webhook_payload,
)
from tritonwatch.alerts.report.produce import Produced, produce, slo_specs
from tritonwatch.alerts.report.weeks import Week
from tritonwatch.schemas.config import Config
from tritonwatch.store import Store

log = logging.getLogger(__name__)

JOB_ID = "reports:weekly"
CATCH_UP_ID = "reports:catch-up"
#: A fire that comes this late (the loop was blocked, the machine slept) still runs.
MISFIRE_GRACE_S = 6 * 3600


class ReportJob:
    def __init__(self, store: Store, config: Config, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.config, self.clock = store, config, clock
        self.specs = slo_specs(config)  # read once: a bad rules file fails serve's start-up
        self.delivered: list[tuple[str, str, bool]] = []  # (week, channel, ok), for tests

    def latest_due(self, now: float) -> Week:
        rep = self.config.reports
        week = Week.last_complete(now, rep.timezone)
        return week if now >= week.scheduled_at(rep.day, rep.hour) else week.shift(-1)

    def run_once(self, now: float | None = None) -> Produced | None:
        """Produce and deliver the latest due week unless it is kept already."""
        now = self.clock() if now is None else now
        week = self.latest_due(now)
        try:
            self.store.flush()  # the report reads flushed samples only
        except ConnectionError as exc:
            log.warning("report %s: flush before the report failed, going on: %s",
                        week.name, exc)
        produced = produce(self.store, self.config, week, specs=self.specs, now=now)
        if produced is not None:
            self.deliver(produced)
        return produced

    def deliver(self, produced: Produced) -> None:
        rep = self.config.reports
        week = produced.report.week
        if rep.webhook is not None:
            base = rep.external_url or self.config.alerting.external_url
            payload = webhook_payload(produced.report, produced.id,
                                      report_link(base, produced.id))
            self.delivered.append((week, "webhook", send_webhook(rep.webhook, payload)))
        if rep.smtp is not None:
            ok = send_email(rep.smtp, produced.report, produced.documents["html"],
                            produced.documents["md"])
            self.delivered.append((week, "smtp", ok))

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
    job = ReportJob(store, config)
    job.install(scheduler)
    rep = config.reports
    log.info("reports: weekly on %s at %02d:00 %s", rep.day, rep.hour, rep.timezone)
    return job
