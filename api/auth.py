"""``api.token``: a bearer token on every write, and on every read with ``api.auth_reads``.

An ASGI middleware rather than a route dependency, so that it also covers what is not a
route of ours (/docs, /openapi.json) and every write route added later without that route
having to remember it.

- Writes (POST, PUT, PATCH, DELETE) need ``Authorization: Bearer <api.token>``; with no token
  configured they are refused (403): an API that anyone on the network could write to is not
  a default.  Paths that authenticate themselves (the Alertmanager webhook, with its own
  credentials: Alertmanager sends one Authorization header) are left to do so.
- Reads need the token only with ``api.auth_reads``; that includes /metrics, /docs and
  /openapi.json.  /healthz (and /readyz) stay open for liveness probes.
- The token is compared with :func:`secrets.compare_digest`; a refusal is 401 with
  ``WWW-Authenticate: Bearer``, and neither the header nor the token is ever logged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tritonwatch.api.errors import error_response
from tritonwatch.schemas.untrusted import RepeatLimiter, log_safe

log = logging.getLogger("tritonwatch.api.auth")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

#: Answer without a token whatever the settings: liveness and readiness probes carry none.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})

_REALM = 'Bearer realm="tritonwatch"'


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether ``header`` is ``Bearer <token>`` (scheme in any case), in constant time."""
    if not header:
        return False
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(credentials.strip().encode(), token.encode())


class TokenAuth:
    """The middleware: see the module docstring for what it guards."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        auth_reads: bool,
        self_authenticated: Collection[str] = (),
    ) -> None:
        if auth_reads and token is None:
            raise ValueError("auth_reads needs a token")
        self.app = app
        self.token = token
        self.auth_reads = auth_reads
        self.self_authenticated = frozenset(self_authenticated)
        # A client hammering the API with bad tokens must not flood the log: one line per
        # client and kind of refusal a minute, with the count of those held back.
        self._refusals = RepeatLimiter(60.0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        write = scope["method"] in WRITE_METHODS
        if path in OPEN_PATHS or path in self.self_authenticated or not (
                write or self.auth_reads):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        who = client[0] if client else "?"
        if self.token is None:
            held = self._refusals.check(("no-token", who))
            if held is not None:
                # The path is the client's text: escaped, so it cannot forge a log line.
                log.warning("refused %s %s from %s: writes need api.token to be configured%s",
                            scope["method"], log_safe(path), who, self._refusals.note(held))
            response = error_response(403, "forbidden", "writes are disabled: set api.token "
                                      "(or TRITONWATCH_API_TOKEN) to enable them")
            await response(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization")
        if bearer_matches(header, self.token):
            await self.app(scope, receive, send)
            return
        # Which credential was tried, and what it was, stays out of the log.
        held = self._refusals.check(("bad-token", who))
        if held is not None:
            log.log(logging.WARNING if write else logging.DEBUG,
                    "refused %s %s from %s: missing or wrong bearer token%s", scope["method"],
                    log_safe(path), who, self._refusals.note(held))
        challenge = _REALM if not header else f'{_REALM}, error="invalid_token"'
        response = error_response(401, "unauthorized", "authentication required: "
                                  "Authorization: Bearer <api.token>",
                                  {"WWW-Authenticate": challenge})
        await response(scope, receive, send)
