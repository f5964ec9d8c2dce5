"""Alert delivery: Alertmanager API v2 and generic webhooks, driven by the Dispatcher.

The engine calls ``Dispatcher.dispatch(states, now)`` after each evaluation and stores the
returned ``{fingerprint: sent_at}`` as ``last_sent_at``.  See dispatch.py for the resend
rules and retries, base.py for the Notifier protocol and the exception tree.
"""

from tritonwatch.alerts.notify.alertmanager import AlertmanagerNotifier
from tritonwatch.alerts.notify.base import (
    Notifier,
    NotifyError,
    NotifyStatusError,
    NotifyTransportError,
    OutgoingAlert,
    redact_url,
)
from tritonwatch.alerts.notify.dispatch import Dispatcher, build_dispatcher
from tritonwatch.alerts.notify.webhook import WebhookNotifier

__all__ = [
    "AlertmanagerNotifier",
    "Dispatcher",
    "Notifier",
    "NotifyError",
    "NotifyStatusError",
    "NotifyTransportError",
    "OutgoingAlert",
    "WebhookNotifier",
    "build_dispatcher",
    "redact_url",
]
