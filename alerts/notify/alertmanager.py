"""Alertmanager API v2: ``POST <base>/api/v2/alerts``, exactly as Prometheus sends.

Body (slo-alerting.md §3.2): a JSON list of ``{labels, annotations, startsAt, endsAt,
generatorURL}``.  ``startsAt`` is when the alert fired; ``endsAt`` is computed by the
Dispatcher (now + 4 x max(eval_interval, resend_delay) while firing, the resolution time once
resolved).  One notifier per Alertmanager: in an HA cluster every instance gets every alert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from tritonwatch.alerts.notify.base import HttpNotifier, OutgoingAlert, post_json, rfc3339

API_PATH = "/api/v2/alerts"


def postable_alert(alert: OutgoingAlert) -> dict[str, Any]:
    """One element of Alertmanager's ``postableAlerts``."""
    body: dict[str, Any] = {
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": rfc3339(alert.starts_at),
        "endsAt": rfc3339(alert.ends_at),
    }
    if alert.generator_url:
        body["generatorURL"] = alert.generator_url
    return body


class AlertmanagerNotifier(HttpNotifier):
    """Posts batches to one Alertmanager (``base_url`` like ``http://am:9093``)."""

    kind = "alertmanager"

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url.rstrip("/") + API_PATH, headers=headers, timeout=timeout, client=client
        )

    def notify(self, alerts: Sequence[OutgoingAlert]) -> None:
        if not alerts:
            return
        post_json(
            self._client, self.url, [postable_alert(a) for a in alerts],
            headers=self.headers, secrets=self._secrets, timeout=self.timeout,
        )

