"""Engines for the two supported backends, and the transaction helper every statement uses.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (durable across process crashes, may lose
the last commits on power loss; that is the usual trade for a metrics store) and a busy timeout,
so a second process (the dashboard, a second collector) waits for the lock instead of failing.

PostgreSQL always goes through psycopg 3, whatever driver the URL named, because the write path
uses its COPY support.  No PostgreSQL call waits forever:

- connecting gives up after the store's timeout (``connect_timeout``), and so does waiting for
  a pooled connection (``pool_timeout``);
- the server cancels a statement after ``statement_timeout``;
- TCP keepalives and ``tcp_user_timeout`` drop a connection to a host that has gone away
  (powered off, partitioned) within about :data:`PG_TCP_USER_TIMEOUT_S`;
- a server that is there but does not answer (a frozen host or process: its kernel still
  acknowledges every packet, so TCP sees nothing wrong and it cannot cancel its own statement)
  is caught by :class:`ConnectionGuard`, which cuts a connection once it has been waiting
  ``statement_timeout`` + :data:`UNRESPONSIVE_GRACE_S` for an answer.  The caller gets a
  StoreError, as for any other outage, and its data stays buffered.

``interrupt_connections`` and ``refuse_connections`` let shutdown end database calls that
would not end by themselves (``store.Store.interrupt`` and ``abort``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError

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


#: SQLite checkpoints its WAL into the database file once it holds this many pages (4 KB).
SQLITE_WAL_CHECKPOINT_PAGES = 10_000
#: PostgreSQL's ``statement_timeout`` unless the caller sets another (``store.statement_timeout``).
DEFAULT_STATEMENT_TIMEOUT_S = 60.0
#: How much longer than ``statement_timeout`` a PostgreSQL connection may wait for an answer
#: before :class:`ConnectionGuard` cuts it: the server had its chance to cancel the statement.
UNRESPONSIVE_GRACE_S = 10.0
#: TCP keepalive: first probe after this much idle time, then every interval, ``count`` tries.
PG_KEEPALIVES_IDLE_S = 10
PG_KEEPALIVES_INTERVAL_S = 5
PG_KEEPALIVES_COUNT = 3
#: Sent data left unacknowledged this long drops the connection (``tcp_user_timeout``).
PG_TCP_USER_TIMEOUT_S = 30
#: ``application_name`` of the store's PostgreSQL sessions (unless the URL names another).
APPLICATION_NAME = "tritonwatch"


def build_engine(
    url: URL, *, timeout_s: float, statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
    read_only: bool = False, scratch: bool = False,
) -> Engine:
    """An engine for ``url`` (from :func:`parse_url`) with the per-backend settings applied.

    ``timeout_s`` bounds the wait for SQLite's write lock, for a PostgreSQL connection and for
    a connection from the pool; ``statement_timeout_s`` is PostgreSQL's ``statement_timeout``.
    ``read_only``: the database itself refuses writes on every connection (SQLite's
    ``query_only``, PostgreSQL's ``default_transaction_read_only``), for readers that must
    never write, such as the dashboard.  ``scratch`` (SQLite only): a throwaway database that
    one process writes and reads, then deletes (``replay``): no journal and no fsync, since
    nothing in it has to survive a crash.
    """
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, timeout_s=timeout_s, read_only=read_only, scratch=scratch)
    if scratch:
        raise ValueError("a scratch store is SQLite only")
    connect_args = pg_connect_args(url, timeout_s=timeout_s,
                                   statement_timeout_s=statement_timeout_s)
    if read_only:
        connect_args["options"] += " -c default_transaction_read_only=on"
    engine = create_engine(
        url,
        pool_timeout=timeout_s,
        connect_args=connect_args,
    )
    # A restarted server leaves dead connections in the pool: the guard tests each on checkout
    # (what ``pool_pre_ping`` does, but inside its own watch, see ConnectionGuard).
    ConnectionGuard(engine, limit_s=statement_timeout_s + UNRESPONSIVE_GRACE_S)
    return engine


def pg_connect_args(
    url: URL, *, timeout_s: float, statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
    application_name: str | None = None,
) -> dict[str, Any]:
    """psycopg connection parameters: timeouts, keepalives, ``application_name``.

    Options the URL already carries (``?options=-c search_path=...``) are kept.
    """
    options = [str(url.query["options"])] if "options" in url.query else []
    options.append(f"-c statement_timeout={max(1, round(statement_timeout_s * 1000)):d}")
    return {
        # libpq takes whole seconds and treats values below 2 as 2.
        "connect_timeout": max(2, math.ceil(timeout_s)),
        "keepalives": 1,
        "keepalives_idle": PG_KEEPALIVES_IDLE_S,
        "keepalives_interval": PG_KEEPALIVES_INTERVAL_S,
        "keepalives_count": PG_KEEPALIVES_COUNT,
        "tcp_user_timeout": PG_TCP_USER_TIMEOUT_S * 1000,
        "options": " ".join(options),
        "application_name": application_name or str(
            url.query.get("application_name", APPLICATION_NAME)
        ),
    }


class ConnectionGuard:
    """Watches one PostgreSQL engine's connections and cuts those whose server stopped answering.

    A connection counts as waiting from the moment it is checked out of the pool (and pinged),
    a statement starts or ends, or a transaction commits or rolls back, until it is checked
    back in.  One that has waited ``limit_s`` is cut: its socket is shut down, which ends the
    blocked call at once with an OperationalError (SQLAlchemy then discards the connection).
    Time spent in Python between two statements of a transaction counts too, which is why the
    limit is far above any such gap.

    Cutting the socket is the only way to end a call to a server that is frozen rather than
    gone: its kernel acknowledges every packet, so neither keepalives nor ``tcp_user_timeout``
    fire, and it cannot run its own ``statement_timeout``; a cancel request would go to its
    (equally frozen) postmaster.
    """

    def __init__(self, engine: Engine, *, limit_s: float) -> None:
        self.limit_s = limit_s
        self.refusing = False
        self._lock = threading.Lock()
        # Every open connection of the engine, and since when each checked-out one waits.
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        self._waiting: dict[int, tuple[Any, float]] = {}
        self._fresh: weakref.WeakSet[Any] = weakref.WeakSet()
        self._dialect = engine.dialect
        self._name = redact(engine.url)
        _GUARDS[engine] = self
        event.listen(engine, "do_connect", self._do_connect)
        event.listen(engine.pool, "connect", self._on_connect)
        event.listen(engine.pool, "checkout", self._on_checkout)
        event.listen(engine.pool, "checkin", self._on_checkin)
        event.listen(engine.pool, "reset", self._on_activity_record)
        event.listen(engine, "before_cursor_execute", self._on_statement)
        event.listen(engine, "after_cursor_execute", self._on_statement)
        event.listen(engine, "commit", self._on_transaction)
        event.listen(engine, "rollback", self._on_transaction)
        _watchdog().add(self)

    # --- events ------------------------------------------------------------------------------

    def _do_connect(self, *_args: Any) -> None:
        if self.refusing:
            # A DBAPI error, so that SQLAlchemy and the store report it like any other.
            import psycopg  # this guard is PostgreSQL's, which has loaded it

            raise psycopg.OperationalError(f"{self._name}: the store is shutting down")

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        with self._lock:
            self._open.add(dbapi_connection)
            self._fresh.add(dbapi_connection)

    def _on_checkout(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        self._touch(dbapi_connection)
        if self.refusing:
            raise DisconnectionError("the store is shutting down")
        with self._lock:
            fresh = dbapi_connection in self._fresh
            self._fresh.discard(dbapi_connection)
        if fresh:
            return
        import psycopg  # this guard is PostgreSQL's, which has loaded it

        try:
            self._dialect.do_ping(dbapi_connection)
        except psycopg.Error as exc:
            # The pool replaces the connection (a server restart leaves only dead ones).
            raise DisconnectionError(f"connection lost: {exc}") from exc
        self._touch(dbapi_connection)

    def _on_checkin(self, dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection is not None:
            with self._lock:
                self._waiting.pop(id(dbapi_connection), None)

    def _on_activity_record(self, dbapi_connection: Any, *_args: Any) -> None:
        self._touch(dbapi_connection)

    def _on_statement(self, conn: Connection, *_args: Any) -> None:
        self._touch(conn.connection.dbapi_connection)

    def _on_transaction(self, conn: Connection) -> None:
        self._touch(conn.connection.dbapi_connection)

    def _touch(self, dbapi_connection: Any) -> None:
        if dbapi_connection is not None:
            with self._lock:
                self._waiting[id(dbapi_connection)] = (dbapi_connection, time.monotonic())

    # --- cutting -----------------------------------------------------------------------------

    def check(self, now: float) -> None:
        """Cut the connections that have waited ``limit_s`` (the watchdog calls this)."""
        with self._lock:
            stuck = [(c, now - since) for c, since in self._waiting.values()
                     if now - since > self.limit_s]
            for c, _ in stuck:
                self._waiting.pop(id(c), None)
        for c, waited in stuck:
            if _shut_down(c):
                log.warning("store: %s has not answered for %.0f s; connection dropped",
                            self._name, waited)

    def interrupt(self) -> int:
        """Cut every open connection, busy or idle; returns how many were cut.

        Idle ones are cut too: on a server that stopped answering, their next ping would hang.
        """
        with self._lock:
            conns = list(self._open)
            self._waiting.clear()
        return sum(_shut_down(c) for c in conns)


def _shut_down(dbapi_connection: Any) -> bool:
    """Shut down the socket under a psycopg connection; False if it was already closed."""
    import psycopg  # only ever given psycopg connections

    try:
        if dbapi_connection.closed:
            return False
        fd = dbapi_connection.pgconn.socket
    except psycopg.Error:
        return False
    try:
        # A duplicate descriptor: closing it leaves libpq's own, which libpq closes itself.
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    finally:
        sock.close()
    return True


_GUARDS: weakref.WeakKeyDictionary[Engine, ConnectionGuard] = weakref.WeakKeyDictionary()


def interrupt_connections(engine: Engine) -> int:
    """Cut ``engine``'s open PostgreSQL connections (see :meth:`ConnectionGuard.interrupt`);
    0 for SQLite, whose calls are bounded by its busy timeout."""
    guard = _GUARDS.get(engine)
    return guard.interrupt() if guard is not None else 0


def refuse_connections(engine: Engine, refuse: bool = True) -> None:
    """While ``refuse`` holds, ``engine`` opens no new PostgreSQL connection and hands out none
    from its pool: at shutdown, a caller must fail at once rather than wait for a connection
    to a server that does not answer.  ``refuse=False`` accepts them again."""
    guard = _GUARDS.get(engine)
    if guard is not None:
        guard.refusing = refuse


class _Watchdog:
    """One daemon thread checking every guard once a second."""

    def __init__(self) -> None:
        self._guards: weakref.WeakSet[ConnectionGuard] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, guard: ConnectionGuard) -> None:
        with self._lock:
            self._guards.add(guard)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tritonwatch-store-watchdog", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(WATCHDOG_INTERVAL_S)
            with self._lock:
                guards = list(self._guards)
            now = time.monotonic()
            for guard in guards:
                try:
                    guard.check(now)
                except Exception:  # the watchdog must outlive any one engine's trouble
                    log.exception("store: connection watchdog failed")


#: How often the watchdog looks at the waiting connections.
WATCHDOG_INTERVAL_S = 1.0
_WATCHDOG: _Watchdog | None = None
_WATCHDOG_LOCK = threading.Lock()


def _watchdog() -> _Watchdog:
    global _WATCHDOG
    with _WATCHDOG_LOCK:
        if _WATCHDOG is None:
            _WATCHDOG = _Watchdog()
        return _WATCHDOG


#: Prepared statements each SQLite connection keeps (the sqlite3 module's default is 128).
#: A read of many series is ``series_id IN (...)`` over chunks of up to 500 ids, and the last
#: chunk's length makes each read's text its own statement: 128 of them held 10 MB per
#: connection, and a collector's pooled connections grew by about 1 MB a minute at 1,000
#: targets (25 MB of SQLite memory after 25 minutes).  Re-preparing a 500-id read costs 0.1 ms.
SQLITE_CACHED_STATEMENTS = 16


def _sqlite_engine(
    url: URL, *, timeout_s: float, read_only: bool = False, scratch: bool = False,
) -> Engine:
    assert url.database is not None  # parse_url refused the others
    parent = os.path.dirname(os.path.abspath(url.database))
    os.makedirs(parent, exist_ok=True)
    engine = create_engine(url, pool_timeout=timeout_s, connect_args={
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
            if scratch:
                cursor.execute("PRAGMA journal_mode = OFF")
                cursor.execute("PRAGMA synchronous = OFF")
            else:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
                # A checkpoint copies every page changed since the last one into the database
                # file; the sample log's pages change at every flush and maintenance's pages
                # every run, so checkpointing every 40 MB of WAL instead of SQLite's 4 MB
                # writes them a tenth as often (bench/storage.py: 811 -> 544 bytes written
                # per sample for a 566-series target).  The WAL file may reach that size.
                cursor.execute(f"PRAGMA wal_autocheckpoint = {SQLITE_WAL_CHECKPOINT_PAGES:d}")
            # Debian's SQLite (and others) is built with SECURE_DELETE: every page freed is
            # overwritten with zeros, which makes dropping the moved hour of the sample log
            # (``samplelog.transpose``) write the whole hour again instead of a few freelist
            # pages (50 MB written to drop a 50 MB table; 0.1 MB with FAST).  FAST still
            # zeroes deleted content on pages written anyway.  The samples are no secret
            # once retention has deleted them; the file is the user's.
            cursor.execute("PRAGMA secure_delete = FAST")
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


def fetch_tuples(conn: Connection, statement: Any,
                 params: Mapping[str, Any] | None = None) -> Sequence[Any]:
    """Every row of ``statement`` (with ``params`` bound) as the driver returns it (tuples),
    for the reads that fetch many rows of plain columns (integers and blobs: no result type
    to convert).  SQLAlchemy builds a ``Row`` for each row of ``.all()``: at 100 targets the
    hourly move fetched 2.2 M log rows and spent 1.1 of its 10 s of CPU building them."""
    result = conn.execute(statement, params)
    try:
        return result.cursor.fetchall()
    finally:
        result.close()
