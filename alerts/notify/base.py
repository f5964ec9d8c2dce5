"""What every notifier is, what it raises, and how secrets are kept out of logs.

A notifier delivers one batch of :class:`OutgoingAlert` to one destination and either returns
(delivered: a 2xx) or raises :class:`NotifyError`, whose ``retryable`` says whether trying
again can help.  Retrying, backoff and the resend cadence live in the Dispatcher
(alerts/notify/dispatch.py), not in the notifiers, as in Alertmanager's ``notify.Retrier``.

Exception tree::

    Exception
     └── NotifyError                  .retryable, .target (redacted), .status (or None)
          ├── NotifyStatusError       a non-2xx answer: retryable for 5xx and 429
          │                           (.retry_after from a 429/503 Retry-After), else not;
          │                           the message quotes the (trimmed, scrubbed) body
          └── NotifyTransportError    timeouts, refused or reset connections, TLS and
              (also ConnectionError)  protocol errors: always retryable

429 is retryable: the receiver says "later", not "never"; the Dispatcher honours its
``Retry-After`` within the dispatch's retry budget and otherwise leaves the alert due.

URLs are secrets (chat webhooks carry tokens in their path, userinfo carries passwords):
errors and logs show only :func:`redact_url` (``scheme://host:port/<redacted>``), and
:func:`scrub` removes the URL, its parts and header values from any text that leaves a
notifier (exception messages from httpx, response bodies), and masks whatever looks like a
credential: a receiver that echoes the request back (a 400 quoting its headers) would otherwise
put ``Authorization: Basic <base64 of user:password>`` into the ERROR log.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

import httpx

from tritonwatch.schemas.alerts import EventStatus
from tritonwatch.schemas.samples import Labels
from tritonwatch.schemas.untrusted import ReplacingFilter

REDACTED = "<redacted>"
_BODY_LIMIT = 512  # characters of a failed response body quoted in errors


class OutgoingAlert(NamedTuple):
    """One alert as it is sent: Alertmanager's ``postableAlert`` plus status and identity."""

    fingerprint: str
    labels: Labels  # identity, sorted pairs, alertname included
    annotations: Labels
    status: EventStatus
    starts_at: float  # unix s: when it fired
    ends_at: float  # unix s: resolution time, or now + 4 x max(eval, resend) while firing
    generator_url: str | None = None


class Notifier(Protocol):
    """One destination.  ``notify`` returns on success and raises NotifyError otherwise."""

    @property
    def name(self) -> str:
        """A loggable, redacted name for the destination."""
        ...

    def notify(self, alerts: Sequence[OutgoingAlert]) -> None: ...


class NotifyError(Exception):
    """Delivery failed; ``retryable`` says whether sending the same batch again can help."""

    def __init__(
        self, message: str, *, retryable: bool, target: str, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.target = target
        self.status = status


class NotifyStatusError(NotifyError):
    """The destination answered with a non-2xx status."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        target: str,
        status: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, target=target, status=status)
        self.retry_after = retry_after


class NotifyTransportError(NotifyError, ConnectionError):
    """No answer: timeout, refused/reset connection, TLS or protocol error.  Always retryable."""

    def __init__(self, message: str, *, target: str) -> None:
        NotifyError.__init__(self, message, retryable=True, target=target)


def redact_url(url: str) -> str:
    """``scheme://host:port`` and a marker where the path/query were; no userinfo ever."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    if not parts.scheme or not host:
        return REDACTED
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    base = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    rest = parts.path.strip("/") or parts.query or parts.fragment
    return f"{base}/{REDACTED}" if rest else base


def secrets_of(url: str, headers: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every string that must never appear in a log line or an error: URL, its path, query
    and userinfo, and header values (``Bearer x`` contributes ``x`` too)."""
    found: list[str] = [url]
    try:
        parts = urlsplit(url)
        found += [parts.path, parts.query, parts.netloc.rpartition("@")[0],
                  parts.password or "", parts.username or ""]
        if parts.username is not None or parts.password is not None:
            # httpx turns URL userinfo into ``Authorization: Basic base64(user:password)``
            # (percent-decoded first), which a receiver may echo back.
            user, password = unquote(parts.username or ""), unquote(parts.password or "")
            found += [user, password, _basic(user, password)]
    except ValueError:
        pass
    for value in (headers or {}).values():
        found.append(value)
        found.extend(value.split())
    # Short fragments ("/", "Bearer") are not secrets and would shred every message.
    return tuple(sorted({s for s in found if len(s) >= 6 and s.strip("/")}, key=len,
                        reverse=True))


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


# Whatever looks like a credential in text we did not write (a response body): the value after
# an auth scheme, after a credential-carrying header name, or after a secret query parameter.
# Prose ("basic auth failed") may lose a word to it; a leaked password costs more.
_AUTH_SCHEME_RE = re.compile(r"(?i)\b(basic|bearer|digest|negotiate)(\s+)[A-Za-z0-9._~+/=\-]{8,}")
_CREDENTIAL_HEADER_RE = re.compile(
    r"(?i)\b(authorization|proxy-authorization|cookie|set-cookie|x-api-key|api-key|"
    r"x-auth-token|private-token)(\"?\s*[:=]\s*\[?\s*\"?)([^\"\r\n,}\]]+)"
)
_CREDENTIAL_PARAM_RE = re.compile(
    r"(?i)\b(token|access_token|api_key|apikey|key|password|passwd|secret|sig|signature)="
    r"([^&\s\"']+)"
)


def scrub_credentials(text: str) -> str:
    """``text`` with the values of auth schemes (``Basic …``, ``Bearer …``), of credential
    headers (``Authorization: …``, ``Cookie: …``) and of secret query parameters masked."""
    text = _CREDENTIAL_HEADER_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _AUTH_SCHEME_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _CREDENTIAL_PARAM_RE.sub(lambda m: f"{m.group(1)}={REDACTED}", text)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``<redacted>`` (longest first), then whatever
    looks like a credential masked (:func:`scrub_credentials`)."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return scrub_credentials(text)


# httpx logs every request at INFO as ``HTTP Request: POST <full URL> ...``; with a chat
# webhook that line would carry the token in its path to whatever handler is configured.
_HTTP_LOG_FILTER = ReplacingFilter(finish=scrub_credentials)
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(_HTTP_LOG_FILTER)


def register_secrets(secrets: Iterable[str]) -> None:
    """Keep ``secrets`` out of httpx's and httpcore's log records from now on."""
    _HTTP_LOG_FILTER.add(dict.fromkeys(secrets, REDACTED))


def rfc3339(ts: float) -> str:
    """Unix seconds as RFC 3339 UTC with milliseconds, like Prometheus sends them.

    Rounded to the millisecond as the store keeps alert times (``store.alerts``), not truncated:
    an alert's ``startsAt`` is then the same before and after a restart restored its state from
    the store, and equals the ``starts_at`` of the engine's own events.
    """
    ms = round(ts * 1000)
    stamp = datetime.fromtimestamp(ms // 1000, UTC) + timedelta(milliseconds=ms % 1000)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare for these APIs; fall back to our own backoff


class HttpNotifier:
    """What every HTTP notifier shares: a URL and headers whose secrets are registered for
    log scrubbing, an ``httpx`` client it closes only if it made it, and a redacted name."""

    #: First word of :attr:`name` (``alertmanager``, ``webhook``).
    kind = "http"

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._secrets = secrets_of(self.url, self.headers)
        register_secrets(self._secrets)
        self._client = client or httpx.Client(timeout=timeout, follow_redirects=False)
        self._owns_client = client is None

    @property
    def name(self) -> str:
        return f"{self.kind} {redact_url(self.url)}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def post_json(
    client: httpx.Client,
    url: str,
    payload: Any,
    *,
    headers: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    timeout: float | None = None,
) -> None:
    """POST ``payload`` as compact JSON; return on 2xx, raise a classified NotifyError.

    Classification (style practice 8): 2xx success; 5xx and 429 retryable; any other status
    fails for good with the body quoted; transport errors and timeouts retryable.
    """
    target = redact_url(url)
    body = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
    request_headers = {"Content-Type": "application/json", **(headers or {})}
    try:
        response = client.post(
            url, content=body, headers=request_headers,
            timeout=timeout if timeout is not None else client.timeout,
        )
    except httpx.TimeoutException as exc:
        raise NotifyTransportError(
            f"{target}: timed out ({type(exc).__name__})", target=target
        ) from None
    except httpx.TransportError as exc:
        reason = scrub(str(exc), secrets) or type(exc).__name__
        raise NotifyTransportError(f"{target}: {reason}", target=target) from None
    status = response.status_code
    if 200 <= status < 300:
        return
    text = scrub(response.text[:_BODY_LIMIT].strip(), secrets)
    retryable = status >= 500 or status == 429
    raise NotifyStatusError(
        f"{target}: HTTP {status}: {text or '(empty body)'}",
        retryable=retryable, target=target, status=status,
        retry_after=_retry_after(response) if status in (429, 503) else None,
    )
