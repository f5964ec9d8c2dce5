"""The ``alerting:`` section of ``tritonwatch.yaml``: evaluation, delivery and the receiver.

Delivery copies Prometheus (see ../shared/reference/slo-alerting.md §3.3 and §3.5): firing
alerts are re-sent every ``resend_delay`` with ``endsAt = now + 4 * max(eval_interval,
resend_delay)``, resolved alerts are sent at once with ``endsAt`` = the resolution time and
re-sent for ``resolved_retention``.  Every alert goes to **every** Alertmanager in
``alertmanagers`` (an HA cluster deduplicates; load-balancing would lose notifications).

Example::

    alerting:
      eval_interval: 30s
      alertmanagers: [http://am-0:9093, http://am-1:9093]
      webhooks:
        - url: https://hooks.example/tritonwatch
          headers: {Authorization: Bearer ...}
      external_url: http://tritonwatch.example:8501
      receiver:
        token: <at least 16 characters>

Secrets (webhook URLs and headers, the receiver's token and password) are never logged.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from tritonwatch.schemas.values import (
    ByteSize,
    Frozen,
    HttpUrl,
    PositiveDuration,
    SecretHttpUrl,
    real_secret,
)

#: Prometheus' notifier sends at most this many alerts per request (``maxBatchSize``).
DEFAULT_MAX_BATCH_SIZE = 256


class WebhookConfig(Frozen):
    """A generic webhook that receives Alertmanager's version-4 payload from us directly."""

    url: SecretHttpUrl = Field(repr=False)
    """Where the JSON is POSTed.  Treated as a secret (chat webhooks carry tokens in the path):
    logs and errors show only scheme and host."""
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Extra HTTP headers (e.g. ``Authorization``); values are never logged."""
    max_alerts: int = Field(default=0, ge=0)
    """At most this many alerts per message, the rest counted in ``truncatedAlerts``
    (Alertmanager's ``max_alerts``); 0 sends all."""
    receiver: str = Field(default="tritonwatch", pattern=r"^[a-z0-9_-]+$", max_length=100)
    """The ``receiver`` name written into each payload."""
    repeat_interval: PositiveDuration = 4 * 3600.0
    """A webhook hears of an alert when it fires, when it resolves, and again after this long
    if it is still firing (Alertmanager's ``repeat_interval``), not at every 60 s re-send
    that keeps Alertmanager's copy alive."""


class BasicAuthConfig(Frozen):
    """HTTP basic-auth credentials the receiver accepts."""

    username: str = Field(min_length=1, max_length=200)
    """User name Alertmanager sends (``http_config.basic_auth.username``)."""
    password: str = Field(repr=False)
    """Password (at least 16 characters, placeholders refused); never logged."""

    @field_validator("password")
    @classmethod
    def _password_is_real(cls, value: str) -> str:
        return real_secret(value)


class ReceiverConfig(Frozen):
    """``POST /api/v1/alertmanager/webhook``: alert history from any Alertmanager.

    At least one of ``token`` and ``basic_auth`` is required: the endpoint writes to the store,
    so it is never open.  With both set, either is accepted.
    """

    token: str | None = Field(default=None, repr=False)
    """Bearer token (``Authorization: Bearer <token>``; Alertmanager's
    ``http_config.authorization.credentials``).  At least 16 characters; placeholders refused."""
    basic_auth: BasicAuthConfig | None = None
    """Basic-auth credentials (Alertmanager's ``http_config.basic_auth``)."""
    max_body_bytes: ByteSize = 4 * 1024 * 1024
    """Larger bodies are refused with 413 before they are parsed."""

    @field_validator("token")
    @classmethod
    def _token_is_real(cls, value: str | None) -> str | None:
        return None if value is None else real_secret(value)

    @model_validator(mode="after")
    def _some_auth(self) -> ReceiverConfig:
        if self.token is None and self.basic_auth is None:
            raise ValueError("set `token` or `basic_auth`: the receiver is never open")
        return self


class AlertingConfig(Frozen):
    """Alert evaluation and delivery (``alerting:`` in ``tritonwatch.yaml``)."""

    rules_file: Path | None = None
    """Rules file (SLOs, threshold and regression rules); the built-in defaults without it."""
    eval_interval: PositiveDuration = 30.0
    """How often the rules are evaluated (and due notifications dispatched)."""
    alertmanagers: tuple[HttpUrl, ...] = ()
    """Alertmanager base URLs (``http://host:9093``); ``/api/v2/alerts`` is appended.  Every
    alert goes to every one of them (HA: never load-balance)."""
    webhooks: tuple[WebhookConfig, ...] = ()
    """Generic webhooks that get Alertmanager's v4 payload straight from us."""
    timeout: PositiveDuration = 10.0
    """Per-request deadline (connect + send + response) for every notification."""
    retry_budget: PositiveDuration = 10.0
    """How long one dispatch keeps retrying 5xx, 429, timeouts and connection errors (with
    exponential backoff) before giving up; what failed stays due and goes out on the next
    evaluation, so the engine is never stalled for long and nothing is lost."""
    resend_delay: PositiveDuration = 60.0
    """Firing alerts are re-sent when their last delivery is this old (Prometheus
    ``--rules.alert.resend-delay``); resolved ones too, during ``resolved_retention``."""
    resolved_retention: PositiveDuration = 900.0
    """Resolved alerts keep being re-sent this long after they resolved, so the resolve
    survives an Alertmanager restart (Prometheus keeps them 15 minutes)."""
    max_batch_size: int = Field(default=DEFAULT_MAX_BATCH_SIZE, ge=1, le=10_000)
    """At most this many alerts per request."""
    external_url: HttpUrl | None = None
    """Our own externally reachable URL (the dashboard); alerts link back to it through
    ``generatorURL``."""
    receiver: ReceiverConfig | None = None
    """The webhook receiver for Alertmanager notifications; not mounted when unset."""
