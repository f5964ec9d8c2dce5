"""``POST /api/v1/alertmanager/webhook``: alert history from any Alertmanager.

Point an Alertmanager ``webhook_config`` here (with ``http_config.authorization`` for a bearer
token, or ``http_config.basic_auth``) and every alert of every notification is stored as an
:class:`~schemas.alerts.AlertEvent` with ``source = "alertmanager:<receiver>"``: alerts from our
own engine and from any Prometheus end up in the same history.

- Authentication comes first (401 without valid credentials, before the body is read);
  credentials are compared in constant time and never logged.
- Bodies over ``receiver.max_body_bytes`` get 413, also when no Content-Length was sent.
- The payload is version 4 (slo-alerting.md §3.1); unknown fields are ignored (Alertmanager
  0.32+ adds ``notification_reason``, 0.34+ ``routeLabels``) and the optional ones may be absent.
- A firing alert's ``endsAt`` of ``0001-01-01T00:00:00Z`` (Go's zero time) is stored as None.
- ``fingerprint`` is recomputed with :func:`schemas.alerts.fingerprint` from the labels, so the
  events of our engine and those received back from Alertmanager share one identity.
- A store that fails answers 503, which Alertmanager retries.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Protocol

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from tritonwatch.schemas.alerting import ReceiverConfig
from tritonwatch.schemas.alerts import AlertEvent, fingerprint
from tritonwatch.schemas.samples import make_labels
from tritonwatch.schemas.untrusted import RepeatLimiter, log_safe
from tritonwatch.store.errors import StoreError

log = logging.getLogger("tritonwatch.api.receiver")

WEBHOOK_PATH = "/api/v1/alertmanager/webhook"
_GO_ZERO_TIME_YEAR = 1


class AlertEventSink(Protocol):
    """Where received alerts go (``store.alerts.AlertStore`` in production)."""

    def append_events(self, events: Sequence[AlertEvent]) -> int: ...


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class WebhookAlertIn(_Tolerant):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str
    endsAt: str | None = None
    generatorURL: str = ""
    fingerprint: str = ""


class WebhookMessageIn(_Tolerant):
    """Alertmanager's webhook payload, version 4; unknown fields ignored."""

    receiver: str = Field(max_length=500)
    status: Literal["firing", "resolved"]
    alerts: list[WebhookAlertIn]
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    version: str = "4"
    groupKey: str | None = None
    truncatedAlerts: int = 0


class WebhookAck(BaseModel):
    status: Literal["ok"] = "ok"
    stored: int


def _timestamp(text: str, where: str) -> float | None:
    """Unix seconds from RFC 3339 (ms or ns precision, ``Z``); None for Go's zero time."""
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{where}: not an RFC 3339 time: {text[:64]!r}") from None
    if stamp.year == _GO_ZERO_TIME_YEAR:
        return None
    if stamp.tzinfo is None:
        raise ValueError(f"{where}: time without a timezone: {text[:64]!r}")
    return stamp.timestamp()


def events_from(message: WebhookMessageIn, *, received_at: float) -> list[AlertEvent]:
    """One AlertEvent per alert of ``message``; raises ValueError naming a bad field."""
    events = []
    for i, alert in enumerate(message.alerts):
        labels = make_labels(alert.labels)
        starts_at = _timestamp(alert.startsAt, f"alerts[{i}].startsAt")
        if starts_at is None:
            raise ValueError(f"alerts[{i}].startsAt: zero time")
        ends_at = _timestamp(alert.endsAt, f"alerts[{i}].endsAt") if alert.endsAt else None
        events.append(AlertEvent(
            ts=received_at,
            fingerprint=fingerprint(labels),
            labels=labels,
            annotations=make_labels(alert.annotations),
            status=alert.status,
            starts_at=starts_at,
            ends_at=ends_at,
            source=f"alertmanager:{message.receiver}",
            group_key=message.groupKey,
        ))
    return events


def _authorized(config: ReceiverConfig, header: str | None) -> bool:
    if not header:
        return False
    scheme, _, credentials = header.partition(" ")
    credentials = credentials.strip()
    scheme = scheme.lower()
    if scheme == "bearer" and config.token is not None:
        return hmac.compare_digest(credentials.encode(), config.token.encode())
    if scheme == "basic" and config.basic_auth is not None:
        try:
            user, sep, password = base64.b64decode(credentials, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        auth = config.basic_auth
        # Both compared every time: no early exit that would time which one was wrong.
        user_ok = hmac.compare_digest(user, auth.username.encode())
        password_ok = hmac.compare_digest(password, auth.password.encode())
        return bool(sep) and user_ok and password_ok
    return False


def _challenge(config: ReceiverConfig) -> str:
    return 'Basic realm="tritonwatch"' if config.token is None else "Bearer"


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # chunked or lying Content-Length: stop reading at the limit
            raise HTTPException(413, f"body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def receiver_router(config: ReceiverConfig, sink: AlertEventSink) -> APIRouter:
    """The webhook route, authenticated by ``config`` and writing to ``sink``."""
    router = APIRouter()
    # A client retrying with wrong credentials, or a store that stays down, logs once per 5 min.
    repeats = RepeatLimiter(300.0)

    @router.post(WEBHOOK_PATH, response_model=WebhookAck)
    async def alertmanager_webhook(request: Request) -> WebhookAck:
        if not _authorized(config, request.headers.get("authorization")):
            # Which credential was tried, and what it was, stays out of the log.
            host = log_safe(request.client.host if request.client else "?", 100)
            suppressed = repeats.check(("refused", host))
            if suppressed is not None:
                log.warning("webhook from %s refused: missing or wrong credentials%s", host,
                            repeats.note(suppressed))
            raise HTTPException(401, "authentication required",
                                headers={"WWW-Authenticate": _challenge(config)})
        body = await _read_body(request, config.max_body_bytes)
        try:
            message = WebhookMessageIn.model_validate_json(body)
            events = events_from(message, received_at=time.time())
        except ValidationError as exc:
            raise HTTPException(422, exc.errors(include_url=False, include_input=False)
                                ) from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        try:
            stored = await run_in_threadpool(sink.append_events, events)
        except StoreError as exc:
            suppressed = repeats.check("store")
            if suppressed is not None:
                log.error("webhook from receiver %s not stored: %s%s", log_safe(message.receiver),
                          log_safe(exc), repeats.note(suppressed))
            raise HTTPException(503, "alert history unavailable; retry later") from None
        # Sender's text: escaped and cut, so a newline in it cannot forge a log line.
        log.info("stored %d alert(s) from receiver %s, group %s (%s)", stored,
                 log_safe(message.receiver), log_safe(message.groupKey), message.status)
        return WebhookAck(stored=stored)

    return router
