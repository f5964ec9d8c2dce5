"""Engines for the two supported backends, and the transaction helper every statement uses.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (durable across process crashes, may lose
the last commits on power loss; that is the usual trade for a metrics store) and a busy timeout,
so a second process (the dashboard, a second collector) waits for the lock instead of failing.

PostgreSQL always goes through psycopg 3, whatever driver the URL named, because the write path
uses its COPY support.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

log = logging.getLogger(__name__)

# Execution option marking a connection whose transaction will write.  On SQLite it begins with
# BEGIN IMMEDIATE: a deferred transaction that reads first and writes later cannot wait for the
# lock (SQLite answers SQLITE_BUSY at once to avoid deadlock), an immediate one waits out the
# busy timeout like any other writer.
_WRITE = "tritonwatch_write"


def parse_url(url: str) -> URL:
    """The SQLAlchemy URL for ``url``, with PostgreSQL pinned to psycopg 3.

    Raises ValueError (quoting the redacted URL) for anything but a file SQLite database or
    PostgreSQL.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"store URL is not a database URL: {_redact_text(url)!r}") from exc
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            # Each pooled connection would get its own empty in-memory database.
            raise ValueError(
                f"store URL {redact(parsed)!r} names no file; use sqlite:///path/to/file.db"
            )
        return parsed.set(drivername="sqlite+pysqlite")
    raise ValueError(
        f"store URL {redact(parsed)!r}: unsupported backend {backend!r} "
        "(use sqlite:///path.db or postgresql://user:password@host/db)"
    )


def redact(url: URL) -> str:
    """The URL as text with its password masked, for logs and error messages."""
    return url.render_as_string(hide_password=True)


def _redact_text(url: str) -> str:
    # For text that did not even parse: drop everything between "://" and "@".
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def build_engine(url: URL, *, timeout_s: float, read_only: bool = False) -> Engine:
    """An engine for ``url`` (from :func:`parse_url`) with the per-backend settings applied.

    ``read_only``: the database itself refuses writes on every connection (SQLite's
    ``query_only``, PostgreSQL's ``default_transaction_read_only``), for readers that must
    never write, such as the dashboard.
    """
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, timeout_s=timeout_s, read_only=read_only)
    options = {"options": "-c default_transaction_read_only=on"} if read_only else {}
    return create_engine(
        url,
        # A restarted server leaves dead connections in the pool; test them on checkout rather
        # than failing the first flush after every PostgreSQL restart.
        pool_pre_ping=True,
        # libpq takes whole seconds and treats values below 2 as 2.
        connect_args={"connect_timeout": max(2, math.ceil(timeout_s)), **options},
    )


#: Prepared statements each SQLite connection keeps (the sqlite3 module's default is 128).
#: A read of many series is ``series_id IN (...)`` over chunks of up to 500 ids, and the last
#: chunk's length makes each read's text its own statement: 128 of them held 10 MB per
#: connection, and a collector's pooled connections grew by about 1 MB a minute at 1,000
#: targets (25 MB of SQLite memory after 25 minutes).  Re-preparing a 500-id read costs 0.1 ms.
SQLITE_CACHED_STATEMENTS = 16


def _sqlite_engine(url: URL, *, timeout_s: float, read_only: bool = False) -> Engine:
    assert url.database is not None  # parse_url refused the others
    parent = os.path.dirname(os.path.abspath(url.database))
    os.makedirs(parent, exist_ok=True)
    engine = create_engine(url, connect_args={
        "check_same_thread": False, "cached_statements": SQLITE_CACHED_STATEMENTS,
    })
    busy_ms = max(1, round(timeout_s * 1000))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (it would BEGIN lazily and
        # never for SELECT); the "begin" hook below emits BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first: switching to WAL needs a lock another process may hold.
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms:d}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            if read_only:
                cursor.execute("PRAGMA query_only = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


@contextmanager
def transaction(engine: Engine, *, write: bool) -> Iterator[Connection]:
    """A connection inside one transaction: committed on success, rolled back on error."""
    with engine.connect() as conn:
        if write:
            conn.execution_options(**{_WRITE: True})
        with conn.begin():
            yield conn
