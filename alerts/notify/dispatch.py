"""Which alerts are due, and getting them through: the Prometheus notifier's contract.

``Dispatcher.dispatch(states, now)`` is called by the engine after every evaluation with every
alert state it holds.  It sends what is due to every notifier and returns
``{fingerprint: now}`` for what went out; the engine stores that as ``last_sent_at``.  The
rules (slo-alerting.md §3.3, §3.5 - Prometheus ``rules/alerting.go`` ``needsSending``):

- a newly firing alert (never sent since it fired) and a just-resolved one (not sent since it
  resolved) are sent at once;
- a firing alert is re-sent when ``last_sent_at + resend_delay <= now``, with
  ``endsAt = now + 4 * max(eval_interval, resend_delay)`` ("allow for two eval or Alertmanager
  send failures" before Alertmanager resolves it on its own);
- a resolved alert carries ``endsAt = resolved_at`` and is re-sent on the same cadence until
  ``resolved_retention`` after it resolved, so the resolve survives an Alertmanager restart;
- pending alerts are never sent.

Delivery: 2xx is success; 5xx, 429, timeouts and connection errors are retried with exponential
backoff (0.5 s x 1.5, at most 5 s apart, a 429/503 ``Retry-After`` honoured) until the
dispatch's ``retry_budget`` is spent, so an evaluation is never stalled for long (worst case
about ``retry_budget + timeout``).  What still failed is *not* reported as sent: it stays due
and goes out on the next dispatch.  That is what makes "Alertmanager down for two minutes loses
no notification" true.  Other 4xx are final (Alertmanager does not retry them either): the
body is logged and the alert counts as sent, so a misconfiguration is not hammered every
evaluation; it is tried again at the normal resend cadence.

Notifiers that carry a ``repeat_interval`` (generic webhooks) are people's endpoints, not an
Alertmanager to keep alive: they get an alert when it fires, when it resolves, and again only
every ``repeat_interval`` while it fires - like Alertmanager notifying a webhook.  The 60 s
re-sends that refresh Alertmanager's ``endsAt`` are not repeated to them.

HA: every notifier gets every due alert (notifiers run in parallel).  An alert counts as sent
only when *every* notifier accepted it or failed for good, so an Alertmanager replica that was
down gets the alert as soon as it is back, not one resend_delay later.  Re-posting to the
replicas that already had it is harmless: Alertmanager merges identical alerts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from urllib.parse import quote

from tritonwatch.alerts.notify.alertmanager import AlertmanagerNotifier
from tritonwatch.alerts.notify.base import Notifier, NotifyError, OutgoingAlert
from tritonwatch.alerts.notify.webhook import WebhookNotifier
from tritonwatch.schemas.alerting import DEFAULT_MAX_BATCH_SIZE, AlertingConfig
from tritonwatch.schemas.alerts import AlertState

log = logging.getLogger("tritonwatch.alerts.notify")

BACKOFF_INITIAL_S = 0.5  # Alertmanager's own (cenkalti/backoff) first interval and factor
BACKOFF_FACTOR = 1.5
BACKOFF_MAX_S = 5.0


class _Outcome(Enum):
    SENT = "sent"
    FAILED = "failed"  # for good (4xx): counts as sent, retried at the resend cadence
    RETRY = "retry"  # retryable and the budget ran out: stays due


class Dispatcher:
    """Sends due alerts to every notifier; see the module docstring for the rules."""

    def __init__(
        self,
        notifiers: Sequence[Notifier],
        *,
        eval_interval: float,
        resend_delay: float = 60.0,
        resolved_retention: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        retry_budget: float = 10.0,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        external_url: str | None = None,
    ) -> None:
        if eval_interval <= 0 or resend_delay < 0 or resolved_retention < 0:
            raise ValueError("eval_interval must be > 0; resend_delay, retention >= 0")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.notifiers = tuple(notifiers)
        self.eval_interval = eval_interval
        self.resend_delay = resend_delay
        self.resolved_retention = resolved_retention
        self.clock = clock  # bounds the retries of one dispatch (monotonic seconds)
        self.sleep = sleep
        self.retry_budget = retry_budget
        self.max_batch_size = max_batch_size
        self.external_url = external_url.rstrip("/") if external_url else None
        self._pool = (
            ThreadPoolExecutor(len(self.notifiers), thread_name_prefix="notify")
            if len(self.notifiers) > 1 else None
        )
        # (notifier index, fingerprint) -> (status, sent at) of what a notifier with a
        # repeat_interval was last told; each notifier thread writes only its own keys.
        self._told: dict[tuple[int, str], tuple[str, float]] = {}

    # -- what is due ---------------------------------------------------------------------
    @property
    def valid_for(self) -> float:
        """How far ahead a firing alert's ``endsAt`` lies: 4 x max(eval, resend)."""
        return 4 * max(self.eval_interval, self.resend_delay)

    def is_due(self, state: AlertState, now: float) -> bool:
        sent = state.last_sent_at
        if state.fired_at is None:  # pending, or resolved without ever firing
            return False
        if state.status == "firing":
            if sent is None or sent < state.fired_at:
                return True
            return sent + self.resend_delay <= now
        if state.status == "resolved" and state.resolved_at is not None:
            if now >= state.resolved_at + self.resolved_retention:
                return False
            if sent is None or sent < state.resolved_at:
                return True
            return sent + self.resend_delay <= now
        return False

    def outgoing(self, state: AlertState, now: float) -> OutgoingAlert:
        """The alert as sent at ``now`` (requires a fired state)."""
        assert state.fired_at is not None
        if state.status == "resolved" and state.resolved_at is not None:
            status, ends_at = "resolved", state.resolved_at
        else:
            status, ends_at = "firing", now + self.valid_for
        generator = None
        if self.external_url:
            # The rule's entry in /api/v1/rules (api/alerting.py): a page that exists.
            generator = (f"{self.external_url}/api/v1/rules?rule_name[]="
                         f"{quote(state.rule, safe='')}")
        return OutgoingAlert(
            fingerprint=state.fingerprint, labels=state.labels, annotations=state.annotations,
            status="resolved" if status == "resolved" else "firing",
            starts_at=state.fired_at, ends_at=ends_at, generator_url=generator,
        )

    # -- sending -------------------------------------------------------------------------
    def dispatch(self, states: Iterable[AlertState], now: float) -> dict[str, float]:
        """Send what is due at ``now``; ``{fingerprint: now}`` for what went out."""
        states = list(states)
        live = {s.fingerprint for s in states}
        for key in [k for k in self._told if k[1] not in live]:
            del self._told[key]  # alerts the engine no longer holds
        due = [self.outgoing(s, now) for s in states if self.is_due(s, now)]
        if not due or not self.notifiers:
            return {}
        batches = [due[i:i + self.max_batch_size]
                   for i in range(0, len(due), self.max_batch_size)]
        deadline = self.clock() + self.retry_budget
        if self._pool is None:
            results = [self._deliver(0, self.notifiers[0], batches, deadline, now)]
        else:
            futures = [self._pool.submit(self._deliver, i, n, batches, deadline, now)
                       for i, n in enumerate(self.notifiers)]
            results = [f.result() for f in futures]
        sent: dict[str, float] = {}
        for i, batch in enumerate(batches):
            if all(r[i] is not _Outcome.RETRY for r in results):
                sent.update((a.fingerprint, now) for a in batch)
        return sent

    def _deliver(
        self, index: int, notifier: Notifier, batches: list[list[OutgoingAlert]],
        deadline: float, now: float,
    ) -> list[_Outcome]:
        repeat: float | None = getattr(notifier, "repeat_interval", None)
        if repeat is None:
            return [self._deliver_batch(notifier, batch, deadline) for batch in batches]
        outcomes = []
        for batch in batches:
            news = [a for a in batch if self._news(index, a, now, repeat)]
            outcome = self._deliver_batch(notifier, news, deadline) if news else _Outcome.SENT
            if outcome is not _Outcome.RETRY:
                for a in news:
                    self._told[(index, a.fingerprint)] = (a.status, now)
            outcomes.append(outcome)
        return outcomes

    def _news(self, index: int, alert: OutgoingAlert, now: float, repeat: float) -> bool:
        told = self._told.get((index, alert.fingerprint))
        return told is None or told[0] != alert.status or (
            alert.status == "firing" and now - told[1] >= repeat
        )

    def _deliver_batch(
        self, notifier: Notifier, batch: list[OutgoingAlert], deadline: float
    ) -> _Outcome:
        attempt = 0
        while True:
            try:
                notifier.notify(batch)
            except NotifyError as exc:
                # str(exc) is built from redacted URLs and scrubbed bodies only.
                if not exc.retryable:
                    log.error("%s: %d alert(s) not delivered, not retrying: %s",
                              notifier.name, len(batch), exc)
                    return _Outcome.FAILED
                delay = min(BACKOFF_INITIAL_S * BACKOFF_FACTOR**attempt, BACKOFF_MAX_S)
                retry_after = getattr(exc, "retry_after", None)
                if retry_after is not None:
                    delay = max(delay, retry_after)
                if self.clock() + delay > deadline:
                    log.warning("%s: %d alert(s) not delivered after %d attempt(s), "
                                "kept due for the next evaluation: %s",
                                notifier.name, len(batch), attempt + 1, exc)
                    return _Outcome.RETRY
                log.info("%s: attempt %d failed, retrying in %.2fs: %s",
                         notifier.name, attempt + 1, delay, exc)
                self.sleep(delay)
                attempt += 1
            except Exception as exc:  # a bug in a notifier must not stop the engine
                # Only the type: an unknown exception's text may quote a URL or a header.
                log.error("%s: notifier raised %s; alerts kept due",
                          notifier.name, type(exc).__name__)
                return _Outcome.RETRY
            else:
                if attempt:
                    log.info("%s: delivered after %d attempt(s)", notifier.name, attempt + 1)
                return _Outcome.SENT

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for notifier in self.notifiers:
            close = getattr(notifier, "close", None)
            if callable(close):
                close()


def build_dispatcher(
    config: AlertingConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Dispatcher:
    """The Dispatcher for ``config.alerting``: one notifier per Alertmanager and webhook."""
    notifiers: list[Notifier] = [
        AlertmanagerNotifier(url, timeout=config.timeout) for url in config.alertmanagers
    ]
    notifiers += [
        WebhookNotifier(
            w.url, headers=w.headers, max_alerts=w.max_alerts, receiver=w.receiver,
            external_url=config.external_url or "", timeout=config.timeout,
            repeat_interval=w.repeat_interval,
        )
        for w in config.webhooks
    ]
    return Dispatcher(
        notifiers,
        eval_interval=config.eval_interval,
        resend_delay=config.resend_delay,
        resolved_retention=config.resolved_retention,
        clock=clock,
        sleep=sleep,
        retry_budget=config.retry_budget,
        max_batch_size=config.max_batch_size,
        external_url=config.external_url,
    )
