"""Bearer token matching (constant time, scheme in any case) and the middleware's settings."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from tritonwatch.api.auth import TokenAuth, bearer_matches

TOKEN = "api-token-0123456789abcdef"


@pytest.mark.parametrize(("header", "ok"), [
    (f"Bearer {TOKEN}", True), (f"bearer {TOKEN}", True), (f"BEARER  {TOKEN} ", True),
    (None, False), ("", False), (TOKEN, False), (f"Basic {TOKEN}", False),
    (f"Bearer {TOKEN[:-1]}", False), (f"Bearer {TOKEN}x", False), ("Bearer ", False),
    (f"Bearer {TOKEN.upper()}", False),
])
def test_bearer_matches(header: str | None, ok: bool) -> None:
    assert bearer_matches(header, TOKEN) is ok


def test_guarding_reads_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="auth_reads needs a token"):
        TokenAuth(FastAPI(), token=None, auth_reads=True)
