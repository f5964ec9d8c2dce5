"""Real local servers for delivery tests: an HTTP server recording POSTed JSON and an SMTP
server (aiosmtpd) recording messages, both on 127.0.0.1 in this process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from tests.fixtures_http import free_port
from tests.serving import QuietHandler, serving


class Hook(ThreadingHTTPServer):
    def __init__(self, statuses: list[int]) -> None:
        self.received: list[dict[str, Any]] = []
        self.posts = 0  # every POST, answered with any status
        self.headers_seen: list[dict[str, str]] = []
        self.statuses = statuses  # answered in turn, the last one repeated
        super().__init__(("127.0.0.1", 0), _HookHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks/s3cr3t-token-path"


class _HookHandler(QuietHandler):
    protocol_version = "HTTP/1.0"  # as it always answered
    server: Hook

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.posts += 1
        status = self.server.statuses.pop(0) if len(self.server.statuses) > 1 \
            else self.server.statuses[0]
        if status == 200:
            self.server.received.append(json.loads(body))
            self.server.headers_seen.append(dict(self.headers))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def webhook_server(statuses: list[int] | None = None) -> Iterator[Hook]:
    with serving(Hook(statuses or [200])) as server:
        yield server


class Mailbox:
    def __init__(self, user: str, password: str) -> None:
        self.messages: list[Envelope] = []
        self.user, self.password = user, password

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:
        self.messages.append(envelope)
        return "250 OK"

    def authenticate(self, server: Any, session: Session, envelope: Envelope, mechanism: str,
                     auth_data: Any) -> AuthResult:
        ok = (isinstance(auth_data, LoginPassword)
              and auth_data.login.decode() == self.user
              and auth_data.password.decode() == self.password)
        return AuthResult(success=ok, handled=False)


@contextmanager
def smtp_server(user: str, password: str) -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox(user, password)
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port, authenticator=box.authenticate,
                            auth_require_tls=False, ready_timeout=30)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()
