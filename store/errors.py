"""Exceptions raised by the store.

Each subclasses the builtin a caller would already catch::

    ConnectionError
     └── StoreError        the database is unreachable or a statement failed; buffered
                           samples are kept and a later flush retries
    ValueError
     └── QueryError        bad query arguments (start after end, step <= 0, unknown agg...)
          └── LimitExceeded  the query would read more series or samples than its caller allows
    RuntimeError
     └── WriterLockHeld    another ``serve`` holds the store's single-writer lock
                           (``store.writer_lock``); the message names it

Messages name the store by its redacted URL, never with the password.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, SQLAlchemyError


class StoreError(ConnectionError):
    """The store could not be reached, or a statement against it failed."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        #: The store's URL with the password masked.
        self.url = url


class QueryError(ValueError):
    """A query was called with arguments that cannot be answered."""


class LimitExceeded(QueryError):
    """A query stopped before reading more than its caller's limit of ``what``.

    Raised from the store read itself (a ``LIMIT`` in SQL, or a count of the rows it would
    decode), so an oversized query costs a count, not the memory of its answer.
    """

    def __init__(self, message: str, *, what: str, limit: int) -> None:
        super().__init__(message)
        #: ``"series"`` or ``"samples"``.
        self.what = what
        self.limit = limit
class WriterLockHeld(RuntimeError):
    """Another process holds the single-writer lock of the store (``store.writer_lock``)."""

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        #: Who holds it, as far as the lock tells (pid, host, start time), for messages.
        self.holder = holder


def db_error_types() -> tuple[type[BaseException], ...]:
    """What a database call can raise that means "the store failed", on either backend.

    psycopg's errors only once psycopg is loaded: a PostgreSQL store loads it, and nothing
    else can raise them.  It is not imported here, so that a SQLite collector does not carry
    it (about 8 MB of RSS).
    """
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return (SQLAlchemyError, sqlite3.Error)
    return (SQLAlchemyError, psycopg.Error, sqlite3.Error)


@contextmanager
def db_errors(action: str, url: str) -> Iterator[None]:
    """Turn driver and SQLAlchemy errors into one :class:`StoreError` naming ``action`` and
    the redacted ``url`` and the driver's first line of reason."""
    try:
        yield
    except db_error_types() as exc:
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise StoreError(f"{action} on {url} failed: {reason}", url=url) from exc
