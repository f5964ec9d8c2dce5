"""The ``reports:`` section of ``tritonwatch.yaml``: the weekly SLO report.  No I/O.

Example::

    reports:
      timezone: Europe/Berlin       # ISO weeks start Monday 00:00 here
      day: mon                      # when serve produces last week's report
      hour: 8
      out_dir: tritonwatch-data/reports
      formats: [html, md, json]
      webhook: {url: https://hooks.example/reports}
      smtp:
        host: smtp.example
        port: 587
        starttls: true
        sender: tritonwatch@example.com
        to: [sre-leads@example.com]
        # credentials come from the environment, never from this file

Credentials (SMTP user and password, webhook URL and headers) are never logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from tritonwatch.schemas.values import (
    DEFAULT_DATA_DIR,
    Frozen,
    Headers,
    HttpUrl,
    PositiveDuration,
)

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
ReportFormat = Literal["html", "md", "json"]

#: Environment variables holding the SMTP credentials (names configurable, values never in files).
SMTP_USER_ENV = "TRITONWATCH_SMTP_USER"
SMTP_PASSWORD_ENV = "TRITONWATCH_SMTP_PASSWORD"


class ReportWebhookConfig(Frozen):
    """Where a JSON summary of each new report is POSTed (with a link to the full report)."""

    url: HttpUrl = Field(repr=False)
    """Treated as a secret (chat webhooks carry tokens in the path): logs show scheme and host."""
    headers: Headers = Field(default_factory=dict, repr=False)
    """Extra HTTP headers (e.g. ``Authorization``); values are never logged."""
    timeout: PositiveDuration = 10.0
    """Per-request deadline."""


class SmtpConfig(Frozen):
    """E-mail delivery of each new report (HTML body, Markdown as the plain-text part)."""

    host: str = Field(min_length=1, max_length=253)
    """SMTP server host name."""
    port: int = Field(default=587, ge=1, le=65535)
    """SMTP port (587 submission with STARTTLS, 465 implicit TLS, 25 plain)."""
    starttls: bool = True
    """Upgrade the connection with STARTTLS before logging in (ignored with ``ssl``)."""
    ssl: bool = False
    """Implicit TLS from the first byte (port 465)."""
    sender: str = Field(min_length=3, max_length=320)
    """The From address."""
    to: tuple[str, ...] = Field(min_length=1, max_length=100)
    """Recipients."""
    user_env: str = SMTP_USER_ENV
    """Environment variable holding the SMTP user; no login when it is unset or empty."""
    password_env: str = SMTP_PASSWORD_ENV
    """Environment variable holding the SMTP password."""
    timeout: PositiveDuration = 30.0
    """Per-connection deadline."""


class ReportsConfig(Frozen):
    """The weekly SLO report (``reports:``): when, where to, and the thresholds it uses."""

    enabled: bool = True
    """``serve`` produces last week's report every week at ``day`` ``hour`` (and once after a
    restart that missed it); ``tritonwatch report`` works either way."""
    timezone: str = "UTC"
    """IANA time zone of the ISO week boundaries and the schedule (``Europe/Berlin``)."""
    day: Weekday = "mon"
    """Day of the week the report of the week before is produced."""
    hour: int = Field(default=8, ge=0, le=23)
    """Hour of ``day`` (in ``timezone``) the report is produced."""
    out_dir: Path = DEFAULT_DATA_DIR / "reports"
    """Directory the report files go to (``<week>.<format>``); created when missing."""
    formats: tuple[ReportFormat, ...] = ("html", "md", "json")
    """Files written per report (all three are always kept in the store)."""
    completeness_warning: float = Field(default=0.95, gt=0, le=1)
    """A target with a smaller share of its expected scrapes stored gets a warning."""
    history_weeks: int = Field(default=12, ge=1, le=52)
    """Weeks in each SLO's status strip."""
    catch_up_weeks: int = Field(default=4, ge=1, le=52)
    """At start-up and at each scheduled time ``serve`` produces every due week not kept yet,
    back to this many weeks (oldest first), but none older than the first week kept for this
    configuration: a new install or a changed configuration starts with the latest week."""
    delivery_attempts: int = Field(default=4, ge=1, le=52)
    """Runs of the report job (start-up, each scheduled time) that try to deliver a report on
    each channel; a failed delivery is kept in the store and tried again on the next run."""
    external_url: HttpUrl | None = None
    """Base URL the webhook's link points to (``<external_url>/api/v1/reports/<id>``);
    ``alerting.external_url`` when unset."""
    webhook: ReportWebhookConfig | None = None
    """JSON summary of each new report to this webhook."""
    smtp: SmtpConfig | None = None
    """Each new report by e-mail."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (use an IANA name such as "
                             "Europe/Berlin or UTC)") from None
        return value

    @field_validator("formats")
    @classmethod
    def _some_format(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one of html, md, json")
        return tuple(dict.fromkeys(value))
