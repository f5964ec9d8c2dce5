"""Delivery of a new report: a JSON summary with a link to a webhook, the HTML by e-mail.

Both are optional (``reports.webhook``, ``reports.smtp``) and neither can fail the report: it
is kept before delivery starts, and a failed delivery is logged (the webhook URL redacted, no
credential ever) and returns False; the report job records the outcome in the store and
retries it on its next run (``alerts.report.job``), from the kept JSON document.  Within one
run the webhook is retried on 5xx, 429 and transport errors (``WEBHOOK_ATTEMPTS`` with a
doubling pause), as the alert notifiers classify them.
SMTP credentials come from the environment variables ``reports.smtp.user_env`` /
``password_env`` at send time, never from the file.
"""

from __future__ import annotations

import logging
import os
import smtplib
import ssl
import time
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any

import httpx

from tritonwatch.alerts.notify.base import (
    NotifyError,
    post_json,
    redact_url,
    register_secrets,
    scrub,
    secrets_of,
)
from tritonwatch.alerts.report.model import Report, to_json
from tritonwatch.schemas.reports import ReportWebhookConfig, SmtpConfig

log = logging.getLogger(__name__)

WEBHOOK_ATTEMPTS = 3
WEBHOOK_BACKOFF_S = 1.0


def report_link(base: str | None, report_id: int) -> str | None:
    return None if base is None else f"{base.rstrip('/')}/api/v1/reports/{report_id}"


def _data(report: Report | Mapping[str, Any]) -> Mapping[str, Any]:
    # A kept report is retried from its stored JSON document, which is ``to_json``'s.
    return to_json(report) if isinstance(report, Report) else report


def webhook_payload(report: Report | Mapping[str, Any], report_id: int,
                    link: str | None) -> dict[str, Any]:
    """What the webhook gets: the summary, each SLO's headline numbers and the link."""
    data = _data(report)
    return {
        "kind": "tritonwatch.weekly_report", "id": report_id, "week": data["week"],
        "timezone": data["timezone"], "start": data["start"], "end": data["end"],
        "hours": data["hours"], "summary": data["summary"], "warnings": data["warnings"],
        "slos": [{k: s[k] for k in ("name", "state", "objective", "sli_week", "sli_window",
                                    "budget_remaining", "peak_burn_1h")}
                 for s in data["slos"]],
        "url": link, "html_url": link, "json_url": None if link is None else f"{link}?format=json",
    }


def send_webhook(cfg: ReportWebhookConfig, payload: dict[str, Any], *,
                 sleep: Any = time.sleep) -> bool:
    secrets = secrets_of(cfg.url, cfg.headers)
    register_secrets(secrets)
    target = redact_url(cfg.url)
    with httpx.Client(timeout=cfg.timeout) as client:
        for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
            try:
                post_json(client, cfg.url, payload, headers=cfg.headers, secrets=secrets)
            except NotifyError as exc:
                if exc.retryable and attempt < WEBHOOK_ATTEMPTS:
                    log.warning("report webhook %s failed (attempt %d/%d), retrying: %s",
                                target, attempt, WEBHOOK_ATTEMPTS, exc)
                    sleep(WEBHOOK_BACKOFF_S * 2 ** (attempt - 1))
                    continue
                log.error("report webhook %s failed, not delivered: %s", target, exc)
                return False
            log.info("report %s sent to webhook %s", payload["week"], target)
            return True
    return False


def email_message(cfg: SmtpConfig, report: Report | Mapping[str, Any], html: str,
                  markdown: str) -> EmailMessage:
    data = _data(report)
    s = data["summary"]
    msg = EmailMessage()
    msg["Subject"] = (f"SLO report {data['week']}: {s['held']} held, {s['at_risk']} at risk, "
                      f"{s['breached']} breached")
    msg["From"] = cfg.sender
    msg["To"] = ", ".join(cfg.to)
    msg.set_content(markdown)
    msg.add_alternative(html, subtype="html")
    return msg


def send_email(cfg: SmtpConfig, report: Report | Mapping[str, Any], html: str,
               markdown: str) -> bool:
    user = os.environ.get(cfg.user_env) or None
    password = os.environ.get(cfg.password_env) or ""
    secrets = [x for x in (user, password) if x]
    where = f"{cfg.host}:{cfg.port}"
    try:
        smtp: smtplib.SMTP
        if cfg.ssl:
            smtp = smtplib.SMTP_SSL(cfg.host, cfg.port, timeout=cfg.timeout,
                                    context=ssl.create_default_context())
        else:
            smtp = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout)
        with smtp:
            if cfg.starttls and not cfg.ssl:
                smtp.starttls(context=ssl.create_default_context())
            if user is not None:
                smtp.login(user, password)
            smtp.send_message(email_message(cfg, report, html, markdown))
    except (smtplib.SMTPException, OSError) as exc:
        # Server replies may echo what was sent (an AUTH line); keep the credentials out.
        reason = scrub(str(exc) or type(exc).__name__, secrets)
        log.error("report e-mail via %s failed, not delivered: %s", where, reason)
        return False
    log.info("report %s e-mailed via %s to %d recipient(s)", _data(report)["week"], where,
             len(cfg.to))
    return True
