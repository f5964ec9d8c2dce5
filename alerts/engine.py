"""The alert engine: Prometheus's alerting-rule state machine, persisted, then delivery.

Per evaluation (``Engine.evaluate(now)``), exactly as Prometheus's ``rules/alerting.go`` does it
(see ../shared/reference/slo-alerting.md §3.5):

* Every rule runs; a rule that raises is logged and counted, its alerts keep their state and are
  not sent this round (Prometheus skips ``sendAlerts`` for a rule whose query failed), and the
  other rules carry on.
* A candidate whose label set (fingerprint) is not active becomes **pending** with
  ``active_since = now``.  A resolved alert that comes back is a *new* instance: new
  ``active_since``, new ``fired_at``.
* A pending alert fires once ``now - active_since >= for``; ``fired_at = now`` is the
  ``startsAt`` Alertmanager sees (the firing time, not the pending time).  Pending alerts are
  never sent.
* When the condition no longer holds: a pending alert is dropped; a firing alert with
  ``keep_firing_for`` keeps firing until ``now - keep_firing_since >= keep_firing_for``, where
  ``keep_firing_since`` is the first evaluation at which the condition was false; then (or at
  once without ``keep_firing_for``) it is **resolved** with ``resolved_at = now``.
* A resolved alert is kept (and re-sent by the dispatcher) until ``now - resolved_at >
  resolved_retention`` (15 min), then forgotten.

States and the firing/resolved transitions (``AlertEvent``, source ``"engine"``) are written in
one transaction per evaluation; then the dispatcher gets every firing and retained resolved
alert and answers which it delivered, and their ``last_sent_at`` is persisted.

Restart (a new ``Engine`` + ``restore()``): firing alerts keep ``fired_at`` (the same
``startsAt``, so Alertmanager deduplicates: no second page) and ``last_sent_at`` (re-sent when the
resend delay says so), and resolved alerts within the retention are still re-sent, so no resolve
is lost.  Alerts of a rule that no longer exists resolve at the next evaluation.

Should the store be down, evaluation and delivery go on from memory; what could not be written
is retried at the next evaluation.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from tritonwatch.alerts.model import Rule
from tritonwatch.schemas.alerts import AlertCandidate, AlertEvent, AlertState, fingerprint
from tritonwatch.schemas.samples import make_labels
from tritonwatch.store.alerts import AlertStore, StoredAlert
from tritonwatch.store.errors import StoreError

if TYPE_CHECKING:
    from tritonwatch.store import Store

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: Prometheus ``resolvedRetention``: resolved alerts are re-sent this long (seconds).
RESOLVED_RETENTION_S = 900.0

#: Prometheus ``--rules.alert.for-outage-tolerance``: a pending alert restored after a longer
#: outage starts its ``for`` again (its condition may well have been false meanwhile).
FOR_OUTAGE_TOLERANCE_S = 3600.0

SOURCE = "engine"


class RuleRun(NamedTuple):
    """A rule's last evaluation, as ``/api/v1/rules`` reports it (Prometheus's rule health)."""

    at: float  # the evaluation's time (unix s)
    duration_s: float
    error: str | None  # None: the rule ran ("ok"); else why it failed ("err")


class Dispatcher(Protocol):
    """Delivery (alerts/notify): sends what is due, returns ``{fingerprint: sent_at}``."""

    def dispatch(self, states: Sequence[AlertState], now: float) -> dict[str, float]: ...


def _ms(ts: float) -> int:
    # Timings compare in whole milliseconds, as stored: float seconds such as 1000.1 - 970.1
    # would otherwise make a 30 s `for` fire one evaluation late.
    return round(ts * 1000)


class EngineMetrics:
    """The engine's own counters on Tritonwatch's /metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.evaluations = Counter(
            "tritonwatch_alert_evaluations", "Alert evaluations run", registry=self.registry
        )
        self.rule_failures = Counter(
            "tritonwatch_alert_rule_failures", "Alert rule evaluations that raised", ["rule"],
            registry=self.registry,
        )
        self.store_errors = Counter(
            "tritonwatch_alert_store_errors", "Alert state writes that failed (retried)",
            registry=self.registry,
        )
        self.dispatch_errors = Counter(
            "tritonwatch_alert_dispatch_errors", "Dispatcher calls that raised",
            registry=self.registry,
        )
        self.alerts = Gauge(
            "tritonwatch_alerts", "Alert instances by state", ["state"], registry=self.registry
        )
        self.duration = Gauge(
            "tritonwatch_alert_evaluation_seconds", "Duration of the last evaluation",
            registry=self.registry,
        )


class Engine:
    """Evaluates ``rules`` against ``store`` and keeps every alert instance's state.

    ``persist=False`` (backtests) neither reads nor writes alert state in the store.
    Thread-safe: evaluations are serialised.
    """

    def __init__(
        self,
        rules: Iterable[Rule],
        store: Store,
        *,
        eval_interval: float,
        dispatcher: Dispatcher | None = None,
        clock: Clock = time.time,
        resolved_retention: float = RESOLVED_RETENTION_S,
        persist: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not eval_interval > 0:
            raise ValueError(f"eval_interval must be positive, got {eval_interval!r}")
        self.rules: list[Rule] = list(rules)
        names = Tally(rule.name for rule in self.rules)
        twice = sorted(name for name, n in names.items() if n > 1)
        if twice:
            raise ValueError(f"rule names must be unique; used more than once: {twice}")
        self.store = store
        self.eval_interval = eval_interval
        self.dispatcher = dispatcher
        self.clock = clock
        self.resolved_retention = resolved_retention
        self.persist = persist
        self.metrics = EngineMetrics(registry)
        #: Evaluations that raised, per rule name (also ``tritonwatch_alert_rule_failures``).
        self.failures: Tally[str] = Tally()
        self._alert_store = AlertStore(store)
        self._active: dict[str, StoredAlert] = {}
        self._dirty: set[str] = set()  # fingerprints whose row must be written (or deleted)
        self._unsaved: list[AlertEvent] = []
        self._lock = threading.Lock()
        self._warned_clash: set[tuple[str, str]] = set()
        #: Each rule's last evaluation (health, time, duration) for ``/api/v1/rules``.
        self.runs: dict[str, RuleRun] = {}

    # --- state -------------------------------------------------------------------------------

    def restore(self, now: float | None = None) -> int:
        """Load the persisted states (after a restart); returns how many were restored."""
        if not self.persist:
            return 0
        now = self.clock() if now is None else now
        with self._lock:
            loaded = self._alert_store.load()
            self._active = {}
            dropped = []
            for stored in loaded:
                s = stored.state
                if s.status == "pending" and now - s.last_true_at > FOR_OUTAGE_TOLERANCE_S:
                    dropped.append(s.fingerprint)
                    continue
                self._active[s.fingerprint] = stored
            if dropped:
                self._dirty.update(dropped)
                log.info("alerts: %d pending alert(s) too old to restore", len(dropped))
            log.info("alerts: restored %d alert state(s)", len(self._active))
            self._update_gauges()
            return len(self._active)

    def states(self) -> list[AlertState]:
        """Every known instance (pending, firing, retained resolved), by fingerprint."""
        with self._lock:
            return [self._active[fp].state for fp in sorted(self._active)]

    # --- evaluation --------------------------------------------------------------------------

    def evaluate(self, now: float | None = None) -> list[AlertEvent]:
        """One evaluation at ``now`` (unix s; default the clock); returns its transitions."""
        with self._lock:
            start = time.perf_counter()
            now = self.clock() if now is None else now
            events: list[AlertEvent] = []
            healthy: set[str] = set()
            owners: dict[str, str] = {}  # fingerprint -> rule, for clashes between rules
            for fp, stored in self._active.items():
                owners[fp] = stored.state.rule
            for rule in self.rules:
                candidates = self._run(rule, now)
                if candidates is None:
                    continue
                healthy.add(rule.name)
                self._apply(rule, candidates, now, owners, events)
            known = {rule.name for rule in self.rules}
            for fp, stored in list(self._active.items()):
                if stored.state.rule not in known:
                    # Its rule is gone (rules file changed across a restart): the condition
                    # can no longer hold, so resolve rather than leave Alertmanager to expire it.
                    self._step_absent(fp, stored, now, 0.0, events)
            if self.persist:
                self._unsaved.extend(events)
                self._save(now)
            orphans = {s.state.rule for s in self._active.values()} - known
            self._dispatch(now, healthy | orphans)
            self.metrics.evaluations.inc()
            self._update_gauges()
            self.metrics.duration.set(time.perf_counter() - start)
            return events

    def _run(self, rule: Rule, now: float) -> list[AlertCandidate] | None:
        started = time.perf_counter()
        try:
            found = list(rule.evaluate(self.store, now))
        except Exception as exc:
            self.runs[rule.name] = RuleRun(now, time.perf_counter() - started,
                                           f"{type(exc).__name__}: {exc}"[:500])
            self.failures[rule.name] += 1
            self.metrics.rule_failures.labels(rule.name).inc()
            log.exception("alerts: rule %r failed at %.3f; its alerts keep their state",
                          rule.name, now)
            return None
        self.runs[rule.name] = RuleRun(now, time.perf_counter() - started, None)
        return found

    def _apply(
        self,
        rule: Rule,
        candidates: Sequence[AlertCandidate],
        now: float,
        owners: dict[str, str],
        events: list[AlertEvent],
    ) -> None:
        seen: set[str] = set()
        for cand in candidates:
            labels = cand.labels
            if not any(name == "alertname" for name, _ in labels):
                labels = make_labels((*labels, ("alertname", rule.name)))
            else:
                labels = make_labels(labels)
            fp = fingerprint(labels)
            owner = owners.setdefault(fp, rule.name)
            if owner != rule.name:
                if (fp, rule.name) not in self._warned_clash:
                    self._warned_clash.add((fp, rule.name))
                    log.warning("alerts: rule %r produced labels %s already owned by rule %r; "
                                "ignored (labels must differ, e.g. by alertname)",
                                rule.name, dict(labels), owner)
                continue
            if fp in seen:
                continue  # a rule listing one instance twice: the first one counts
            seen.add(fp)
            stored = self._active.get(fp)
            if stored is not None and stored.state.status != "resolved":
                state = stored.state._replace(
                    annotations=make_labels(cand.annotations), value=cand.value,
                    last_true_at=now,
                )
            else:
                # New, or a resolved alert coming back: a new instance (Prometheus replaces it).
                state = AlertState(
                    fingerprint=fp, rule=rule.name, labels=labels,
                    annotations=make_labels(cand.annotations), status="pending",
                    active_since=now, fired_at=None, resolved_at=None, last_true_at=now,
                    last_sent_at=None, value=cand.value,
                )
            self._active[fp] = StoredAlert(state, None)
            self._dirty.add(fp)
        for fp, stored in list(self._active.items()):
            if stored.state.rule != rule.name:
                continue
            if fp not in seen:
                self._step_absent(fp, stored, now, rule.keep_firing_for_s, events)
                continue
            state = stored.state
            if state.status == "pending" and _ms(now) - _ms(state.active_since) >= _ms(rule.for_s):
                state = state._replace(status="firing", fired_at=now)
                self._active[fp] = StoredAlert(state, None)
                events.append(_event(state, "firing", now))
                log.info("alerts: %s firing %s", rule.name, dict(state.labels))

    def _step_absent(
        self,
        fp: str,
        stored: StoredAlert,
        now: float,
        keep_firing_for: float,
        events: list[AlertEvent],
    ) -> None:
        """The condition of ``fp`` did not hold at ``now``."""
        state, since = stored.state, stored.keep_firing_since
        keep = False
        if state.status == "firing" and keep_firing_for > 0:
            if since is None:
                since = now
            keep = _ms(now) - _ms(since) < _ms(keep_firing_for)
        if state.status == "pending" or (
            state.resolved_at is not None
            and _ms(now) - _ms(state.resolved_at) > _ms(self.resolved_retention)
        ):
            del self._active[fp]
            self._dirty.add(fp)
            return
        if keep:
            self._active[fp] = StoredAlert(state, since)
            self._dirty.add(fp)
        elif state.status == "firing":
            state = state._replace(status="resolved", resolved_at=now)
            self._active[fp] = StoredAlert(state, None)
            self._dirty.add(fp)
            events.append(_event(state, "resolved", now))
            log.info("alerts: %s resolved %s", state.rule, dict(state.labels))

    # --- persistence and delivery ------------------------------------------------------------

    def _save(self, now: float) -> None:
        upsert = [self._active[fp] for fp in sorted(self._dirty) if fp in self._active]
        removed = [fp for fp in self._dirty if fp not in self._active]
        try:
            self._alert_store.save(upsert, removed=removed, events=self._unsaved, now=now)
        except StoreError as exc:
            self.metrics.store_errors.inc()
            log.error("alerts: could not persist %d state(s) and %d event(s), retrying at the "
                      "next evaluation: %s", len(upsert) + len(removed), len(self._unsaved), exc)
            return
        self._dirty.clear()
        self._unsaved = []

    def _dispatch(self, now: float, rules: set[str]) -> None:
        if self.dispatcher is None:
            return
        due = [
            stored.state for fp, stored in sorted(self._active.items())
            if stored.state.status != "pending" and stored.state.rule in rules
        ]
        if not due:
            return
        try:
            sent = self.dispatcher.dispatch(due, now)
        except Exception:
            self.metrics.dispatch_errors.inc()
            log.exception("alerts: dispatch failed; the alerts stay due")
            return
        marked = {}
        for fp, sent_at in sent.items():
            stored = self._active.get(fp)
            if stored is None or not math.isfinite(sent_at):
                continue
            self._active[fp] = stored._replace(state=stored.state._replace(last_sent_at=sent_at))
            marked[fp] = sent_at
        if not marked or not self.persist:
            return
        try:
            self._alert_store.mark_sent(marked)
        except StoreError as exc:
            self.metrics.store_errors.inc()
            self._dirty.update(marked)
            log.error("alerts: could not persist last_sent_at (retrying): %s", exc)

    def _update_gauges(self) -> None:
        counts = Tally(stored.state.status for stored in self._active.values())
        for status in ("pending", "firing", "resolved"):
            self.metrics.alerts.labels(status).set(counts.get(status, 0))


def _event(state: AlertState, status: str, now: float) -> AlertEvent:
    assert state.fired_at is not None
    if status == "firing":
        return AlertEvent(now, state.fingerprint, state.labels, state.annotations, "firing",
                          state.fired_at, None, SOURCE)
    return AlertEvent(now, state.fingerprint, state.labels, state.annotations, "resolved",
                      state.fired_at, state.resolved_at, SOURCE)
