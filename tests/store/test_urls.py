"""URL handling that needs no database: driver pinning, redaction, refusals."""

from __future__ import annotations

import pytest

from tritonwatch.store import StoreError, open_store
from tritonwatch.store.engine import parse_url


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:pw@db/tw", "postgres://u:pw@db/tw", "postgresql+psycopg2://u:pw@db/tw"],
)
def test_postgres_urls_always_use_psycopg3(url: str) -> None:
    assert parse_url(url).drivername == "postgresql+psycopg"


def test_password_never_reaches_logs_or_errors() -> None:
    # Port 1 on localhost: nothing listens, the connection is refused at once.
    s = open_store("postgresql://tw:hunter2@127.0.0.1:1/tw", timeout_s=1)
    assert "hunter2" not in s.url_redacted
    assert "***" in s.url_redacted
    assert "hunter2" not in repr(s)
    s.write("t", 0.0, [])
    with pytest.raises(StoreError) as caught:
        s.migrations.apply()
    assert "hunter2" not in str(caught.value)
    assert s.url_redacted in str(caught.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "names no file"),
        ("sqlite:///:memory:", "names no file"),
        ("mysql://u:hunter2@db/tw", "unsupported backend 'mysql'"),
        ("not a url", "not a database URL"),
    ],
)
def test_unsupported_urls_are_refused_with_the_url_redacted(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        open_store(url)
    assert "hunter2" not in str(caught.value)


def test_postgres_connections_carry_timeouts_keepalives_and_keep_the_urls_options() -> None:
    from tritonwatch.store.engine import (
        PG_TCP_USER_TIMEOUT_S,
        pg_connect_args,
    )

    url = parse_url("postgresql://u:pw@db/tw?options=-c%20search_path%3Dtw")
    args = pg_connect_args(url, timeout_s=4.5, statement_timeout_s=30)
    assert args["connect_timeout"] == 5  # whole seconds, rounded up
    assert args["options"] == "-c search_path=tw -c statement_timeout=30000"
    assert args["keepalives"] == 1 and args["keepalives_idle"] > 0
    assert args["tcp_user_timeout"] == PG_TCP_USER_TIMEOUT_S * 1000
    assert args["application_name"] == "tritonwatch"
    named = parse_url("postgresql://u:pw@db/tw?application_name=mine")
    assert pg_connect_args(named, timeout_s=1)["application_name"] == "mine"
