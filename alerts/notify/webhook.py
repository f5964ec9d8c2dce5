"""Generic webhooks that receive Alertmanager's version-4 payload straight from us.

Anything written for Alertmanager's ``webhook_config`` (including our own receiver,
api/receiver.py) can take these messages unchanged.  The shape follows
``notify/webhook/webhook.go`` and the captured samples (slo-alerting.md §3.1):

- alerts are grouped by ``alertname`` (Alertmanager's usual ``group_by``), one POST per group,
  ``groupKey`` ``{}:{alertname="X"}`` - stable, usable for dedup;
- ``status`` is ``firing`` if any alert of the message fires;
- a firing alert carries ``endsAt: "0001-01-01T00:00:00Z"`` exactly as Alertmanager shows it;
- ``commonLabels``/``commonAnnotations`` are computed over the whole group, before
  ``max_alerts`` truncation, whose dropped count goes in ``truncatedAlerts``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from tritonwatch.alerts.notify.base import (
    HttpNotifier,
    NotifyError,
    OutgoingAlert,
    post_json,
    rfc3339,
)
from tritonwatch.schemas.samples import Labels

ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time: Alertmanager's endsAt while firing


def _common(label_sets: Sequence[Labels]) -> dict[str, str]:
    common = dict(label_sets[0]) if label_sets else {}
    for labels in label_sets[1:]:
        other = dict(labels)
        common = {k: v for k, v in common.items() if other.get(k) == v}
    return common


def group_key(group_labels: Mapping[str, str]) -> str:
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(group_labels.items()))
    return "{}:{" + inner + "}"


def webhook_alert(alert: OutgoingAlert) -> dict[str, Any]:
    return {
        "status": alert.status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": rfc3339(alert.starts_at),
        "endsAt": ZERO_TIME if alert.status == "firing" else rfc3339(alert.ends_at),
        "generatorURL": alert.generator_url or "",
        "fingerprint": alert.fingerprint,
    }


def webhook_messages(
    alerts: Sequence[OutgoingAlert],
    *,
    receiver: str = "tritonwatch",
    external_url: str = "",
    max_alerts: int = 0,
) -> list[dict[str, Any]]:
    """The v4 messages for ``alerts``: one per ``alertname``, in first-seen order."""
    groups: dict[str, list[OutgoingAlert]] = {}
    for alert in alerts:
        groups.setdefault(dict(alert.labels).get("alertname", ""), []).append(alert)
    messages = []
    for alertname, members in groups.items():
        group_labels = {"alertname": alertname}
        kept = members[:max_alerts] if max_alerts else members
        messages.append({
            "receiver": receiver,
            "status": "firing" if any(a.status == "firing" for a in members) else "resolved",
            "alerts": [webhook_alert(a) for a in kept],
            "groupLabels": group_labels,
            "commonLabels": _common([a.labels for a in members]),
            "commonAnnotations": _common([a.annotations for a in members]),
            "externalURL": external_url,
            "version": "4",
            "groupKey": group_key(group_labels),
            "truncatedAlerts": len(members) - len(kept),
        })
    return messages


class WebhookNotifier(HttpNotifier):
    """POSTs v4 messages to one URL.  The URL and header values are secrets."""

    kind = "webhook"

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_alerts: int = 0,
        receiver: str = "tritonwatch",
        external_url: str = "",
        timeout: float = 10.0,
        client: httpx.Client | None = None,
        repeat_interval: float | None = 4 * 3600.0,
    ) -> None:
        super().__init__(url, headers=headers, timeout=timeout, client=client)
        #: Seconds between notifications of an unchanged firing alert (see Dispatcher).
        self.repeat_interval = repeat_interval
        self.max_alerts = max_alerts
        self.receiver = receiver
        self.external_url = external_url

    def notify(self, alerts: Sequence[OutgoingAlert]) -> None:
        """One POST per group; every group is tried, then the first error is raised
        (retryable if any failure was), so one bad group never blocks the others."""
        errors: list[NotifyError] = []
        for message in webhook_messages(
            alerts, receiver=self.receiver, external_url=self.external_url,
            max_alerts=self.max_alerts,
        ):
            try:
                post_json(self._client, self.url, message, headers=self.headers,
                          secrets=self._secrets, timeout=self.timeout)
            except NotifyError as exc:
                errors.append(exc)
        if errors:
            retryable = [e for e in errors if e.retryable]
            raise (retryable or errors)[0]

