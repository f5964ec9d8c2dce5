"""One writer per database: the lock ``serve`` holds for as long as it runs.

Two ``serve`` processes on one store both scrape every target and both evaluate the rules:
every bucket holds two samples, and each one's alert state (a TargetDown for a target only the
other knows) leaks into the other.  So ``serve`` takes this lock before it touches the store,
and a second one stops at once with a message naming the first (:class:`WriterLockHeld`).

SQLite: an OS file lock (``flock``) on ``<database>.lock`` beside the file, which holds the
holder's pid, host and start time for that message.  The kernel drops the lock when its
process ends, however it ends, so a crashed ``serve`` never leaves a stale lock behind.
Readers (the dashboard, ``backtest``) open the database itself, never the lock file, so they
read while ``serve`` runs.  (``flock`` is not reliable on some network file systems; neither is
SQLite.)

PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a connection of its
own, held until ``serve`` exits or that connection drops; advisory locks are per database, so
this is one writer per database.  The holder is found through ``pg_locks`` and
``pg_stat_activity``, whose ``application_name`` is ``tritonwatch serve pid=N host=H``.
``store.writer_lock: false`` turns it off; ``cluster.enabled`` replaces it by membership
(store/leases.py, tritonwatch/cluster.py), where several serve share the work safely.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine import URL

from tritonwatch.store.engine import parse_url, pg_connect_args, redact
from tritonwatch.store.errors import StoreError, WriterLockHeld

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

#: The advisory lock's key (a bigint).  The store's others: 0x7477_0000 (schema, in
#: ``store.store``) and 0x7477_0001 (rollups, in ``store.write``), both transaction-scoped.
PG_LOCK_WRITER = 0x7477_0010
#: The holder information a lock file may hold (it is ours, but it is read before trusting).
_MAX_HOLDER_BYTES = 4096


class WriterLock(Protocol):
    """A held lock; :meth:`release` gives it up (idempotent)."""

    def release(self) -> None: ...


def acquire(url: str, *, postgres: bool = True, timeout_s: float = 10.0) -> WriterLock | None:
    """Take the single-writer lock of the store at ``url``; None where there is none to take
    (PostgreSQL with ``postgres=False``).

    Raises WriterLockHeld naming the holder when another process has it, StoreError when a
    PostgreSQL server cannot be reached, OSError when the lock file cannot be opened.
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database is not None  # parse_url refused the others
        return _FileLock.acquire(parsed.database + ".lock", redact(parsed))
    if not postgres:
        return None
    return _AdvisoryLock.acquire(parsed, timeout_s=timeout_s)


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(UTC).isoformat(timespec="seconds")}


def _held_message(store: str, holder: str) -> str:
    return (f"store {store} is already in use by another tritonwatch serve ({holder}); stop "
            "that one first, or give this one its own store.url")


class _FileLock:
    def __init__(self, fd: int, path: str) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, path: str, store: str) -> _FileLock:
        # O_CREAT without O_TRUNC: the holder's record is only rewritten once the lock is ours.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read_holder(fd))
            os.close(fd)
            raise WriterLockHeld(_held_message(store, holder), holder=holder) from None
        except BaseException:
            os.close(fd)
            raise
        record = json.dumps(_me()).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        log.info("store: holding the writer lock %s", path)
        return cls(fd, path)

    def release(self) -> None:
        if self._fd is not None:
            # Closing drops the lock; the stale record stays, read only while someone holds it.
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, _MAX_HOLDER_BYTES, 0)
        record = json.loads(raw)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder.get("pid"):
        return "holder unknown"
    text = f"pid {holder['pid']}"
    if holder.get("host"):
        text += f" on {holder['host']}"
    if holder.get("started"):
        text += f", started {holder['started']}"
    return text


class _AdvisoryLock:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn: psycopg.Connection[Any] | None = conn

    @classmethod
    def acquire(cls, url: URL, *, timeout_s: float) -> _AdvisoryLock:
        store = redact(url)
        me = _me()
        # At most 63 bytes (NAMEDATALEN - 1); the server truncates longer names.
        name = f"tritonwatch serve pid={me['pid']} host={me['host']}"[:63]
        params = _conninfo(url)
        params.update(pg_connect_args(url, timeout_s=timeout_s, application_name=name))
        import psycopg  # loaded for a PostgreSQL store only (a SQLite collector never needs it)

        try:
            conn = psycopg.connect(autocommit=True, **params)
        except psycopg.Error as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StoreError(f"writer lock on {store} failed: {reason}", url=store) from exc
        try:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (PG_LOCK_WRITER,)).fetchone()
            if not (got and got[0]):
                holder = _pg_holder(conn)
                raise WriterLockHeld(_held_message(store, holder), holder=holder)
        except psycopg.Error as exc:
            conn.close()
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StoreError(f"writer lock on {store} failed: {reason}", url=store) from exc
        except BaseException:
            conn.close()
            raise
        log.info("store: holding the writer lock of %s (PostgreSQL advisory lock %d)",
                 store, PG_LOCK_WRITER)
        return cls(conn)

    def release(self) -> None:
        if self._conn is not None:
            import psycopg

            # The server drops a session's advisory locks when it ends.
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


def _conninfo(url: URL) -> dict[str, Any]:
    """libpq parameters of ``url``, as SQLAlchemy's psycopg dialect passes them."""
    params: dict[str, Any] = {k: v for k, v in url.query.items() if isinstance(v, str)}
    for key, value in (("host", url.host), ("port", url.port), ("user", url.username),
                       ("password", url.password), ("dbname", url.database)):
        if value is not None:
            params[key] = value
    return params


def _pg_holder(conn: psycopg.Connection[Any]) -> str:
    # A bigint key shows in pg_locks as classid (high half), objid (low half), objsubid 1.
    row = conn.execute(
        """
        SELECT a.application_name, a.client_addr::text, a.pid, a.backend_start
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.classid = %s AND l.objid = %s
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        """,
        (PG_LOCK_WRITER >> 32, PG_LOCK_WRITER & 0xFFFF_FFFF),
    ).fetchone()
    if row is None:
        return "holder unknown"
    app, addr, pid, started = row
    text = f"session {app!r}" if app else "a session without application_name"
    text += f", backend pid {pid}"
    if addr:
        text += f" from {addr}"
    if started is not None:
        text += f", connected {started.astimezone(UTC).isoformat(timespec='seconds')}"
    return text
