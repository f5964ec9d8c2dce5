"""Alert values shared by the engine, the notifiers, the store, the API and the reports.  No I/O.

An alert instance is identified by its label set alone (``alertname`` included), exactly as in
Prometheus and Alertmanager: labels must be stable for as long as the condition lasts, so the
numbers that move (burn rate, % change, utilization) go in annotations, never in labels.
"""

from __future__ import annotations

import hashlib
from typing import Literal, NamedTuple

from tritonwatch.schemas.samples import Labels

AlertStatus = Literal["pending", "firing", "resolved"]
EventStatus = Literal["firing", "resolved"]


def fingerprint(labels: Labels) -> str:
    """A stable 16-hex-digit identity for a label set (like Alertmanager's fingerprint)."""
    digest = hashlib.sha256()
    for name, value in sorted(labels):
        digest.update(name.encode())
        digest.update(b"\xff")
        digest.update(value.encode())
        digest.update(b"\xff")
    return digest.hexdigest()[:16]


class AlertCandidate(NamedTuple):
    """One instance of a rule's condition that holds at evaluation time."""

    labels: Labels  # identity; includes ("alertname", ...); sorted pairs
    annotations: Labels  # summary, description, runbook_url, values...
    value: float  # the number that crossed the line (burn rate, ratio, % change, ...)


class AlertState(NamedTuple):
    """The engine's persisted state of one alert instance."""

    fingerprint: str
    rule: str
    labels: Labels
    annotations: Labels
    status: AlertStatus
    active_since: float  # unix s: condition first true (pending from here)
    fired_at: float | None  # unix s: became firing (Alertmanager startsAt)
    resolved_at: float | None  # unix s: resolved (endsAt of the resolve)
    last_true_at: float  # unix s: condition last seen true (for keep_firing_for)
    last_sent_at: float | None  # unix s: last delivery attempt that succeeded
    value: float


class AlertEvent(NamedTuple):
    """History: a transition of our engine, or an alert received from an Alertmanager."""

    ts: float  # unix s when it happened / was received
    fingerprint: str
    labels: Labels
    annotations: Labels
    status: EventStatus
    starts_at: float
    ends_at: float | None
    source: str  # "engine", or "alertmanager:<receiver>" for webhooks received
    group_key: str | None = None
