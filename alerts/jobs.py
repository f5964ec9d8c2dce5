"""The scheduled alert job (``alerts:evaluate``) and how ``serve`` builds the engine.

``AlertJob.install`` adds one APScheduler job with the collector's settings (``coalesce=True``,
``max_instances=1``, a misfire grace time): a slow evaluation can neither overlap the next one
nor make the scheduler replay a backlog.  The evaluation runs in a worker thread (the store and
the notifiers block); an exception reaches the scheduler's job listener (the collector's, which
logs and counts it in ``tritonwatch_job_failures_total{job="alerts"}``) and never stops it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client import CollectorRegistry

from tritonwatch.alerts.defaults import watch_targets
from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.model import Rule
from tritonwatch.alerts.status import SloBoard
from tritonwatch.store.errors import StoreError

if TYPE_CHECKING:
    from tritonwatch.alerts.notify import Dispatcher
    from tritonwatch.schemas.config import Config
    from tritonwatch.store import Store

log = logging.getLogger(__name__)

JOB_ID = "alerts:evaluate"


class AlertJob:
    """Runs ``engine.evaluate`` every ``engine.eval_interval`` seconds."""

    def __init__(
        self,
        engine: Engine,
        *,
        dispatcher: Dispatcher | None = None,
        clock: Callable[[], float] = time.time,
        slos: SloBoard | None = None,
    ) -> None:
        self.engine = engine
        self.dispatcher = dispatcher  # closed with the job
        self.clock = clock
        #: SLO statuses for /metrics and /api/v1/slos, refreshed after evaluations.
        self.slos = slos or SloBoard(())

    @classmethod
    def from_config(
        cls,
        config: Config,
        store: Store,
        *,
        rules: list[Rule] | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> AlertJob:
        """The engine of ``config.alerting`` over ``store``, its state restored.

        ``rules`` defaults to ``alerts.rules.load_rules(config.alerting.rules_file)`` (the
        built-in defaults when no file is set).  TargetDown watches ``config.targets`` only.
        Delivery is set up only when at least one Alertmanager or webhook is configured.
        """
        alerting = config.alerting
        if rules is None:
            from tritonwatch.alerts.rules import load_rules

            rules = list(load_rules(alerting.rules_file))
        watch_targets(rules, (t.name for t in config.targets))
        dispatcher = None
        if alerting.alertmanagers or alerting.webhooks:
            from tritonwatch.alerts.notify import build_dispatcher

            dispatcher = build_dispatcher(alerting)
        engine = Engine(
            rules, store, eval_interval=alerting.eval_interval, dispatcher=dispatcher,
            clock=clock, resolved_retention=alerting.resolved_retention, registry=registry,
        )
        engine.restore()
        from tritonwatch.alerts.rules import SloBurnRule

        board = SloBoard([r.slo for r in rules if isinstance(r, SloBurnRule)])
        log.info("alerts: %d rule(s), every %gs, %s", len(rules), alerting.eval_interval,
                 f"{len(dispatcher.notifiers)} notifier(s)" if dispatcher else "no delivery")
        return cls(engine, dispatcher=dispatcher, clock=clock, slos=board)

    def evaluate(self) -> None:
        """One evaluation (blocking): flush what the scrapes buffered, then evaluate."""
        try:
            # Rules read flushed samples only; without this they would lag by up to one
            # flush interval behind the latest scrape.
            self.engine.store.flush()
        except StoreError as exc:
            log.warning("alerts: flush before evaluation failed, evaluating anyway: %s", exc)
        now = self.clock()
        self.engine.evaluate(now)
        self.slos.refresh(self.engine.store, now)

    async def run(self) -> None:
        await asyncio.to_thread(self.evaluate)

    def install(self, scheduler: AsyncIOScheduler) -> None:
        interval = self.engine.eval_interval
        scheduler.add_job(
            self.run, "interval", seconds=interval, id=JOB_ID, name=JOB_ID,
            # First run one interval after start, not at once: after a restart the rules
            # should see the scrapes of this process too, not just the gap before it.
            next_run_time=datetime.now(UTC) + timedelta(seconds=interval),
            coalesce=True, max_instances=1,
            misfire_grace_time=max(1, int(interval)), replace_existing=True,
        )

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()
