"""Cluster membership, target leases and the evaluator lock in PostgreSQL (``cluster:``).

Two small tables, created on first use, and one advisory lock:

* ``tw_cluster_members(member, heartbeat, started, session_key)``: each ``serve`` renews its
  row every heartbeat.  A member is live while its row is younger than the lease TTL *and* its
  database session still holds the advisory lock ``session_key`` it took when it connected.
  The second condition is what makes a killed process's takeover fast: PostgreSQL ends the
  session (and drops its locks) the moment the process's socket closes, so the others see
  the member dead at their next heartbeat instead of a TTL later.  The TTL still covers what
  closes no socket (a host powered off, a network cut) and rows written without a key.
* ``tw_target_leases(target, holder, expires)``: a member scrapes a target only while it holds
  its lease.  :meth:`ClusterDb.claim` renews the leases a member holds and takes the free,
  expired or dead-held ones it should own, in one statement; it gives back the ones it should
  no longer own.  The database decides who holds what, so no two members ever hold one lease
  at once.
* Session-level advisory lock :data:`PG_LOCK_EVALUATOR` on the member's own connection: the
  one member evaluating alerts, writing reports and running maintenance.  PostgreSQL drops it
  the moment that connection ends, so a killed evaluator's successor takes over at its next
  heartbeat.

Times are the database server's (``now()``), so members' clocks need not agree.  Every call
raises :class:`StoreError` (naming the store, URL redacted) when the database cannot be
reached; the member then drops its connection (and with it the lock) and reconnects later.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import TYPE_CHECKING, Any

from tritonwatch.store.engine import parse_url, pg_connect_args, redact
from tritonwatch.store.errors import StoreError
from tritonwatch.store.writer_lock import _conninfo

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

#: The evaluator's advisory lock (beside the writer lock's 0x7477_0010).
PG_LOCK_EVALUATOR = 0x7477_0011
#: Serializes the first creation of the tables by members starting together.
PG_LOCK_SCHEMA = 0x7477_0012
#: How many random session keys to try before giving up (a clash is a 2**-63 event).
SESSION_KEY_TRIES = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tw_cluster_members (
    member text PRIMARY KEY,
    heartbeat timestamptz NOT NULL,
    started timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS tw_target_leases (
    target text PRIMARY KEY,
    holder text NOT NULL,
    expires timestamptz NOT NULL
);
ALTER TABLE tw_cluster_members ADD COLUMN IF NOT EXISTS session_key bigint;
"""

#: ``m`` (a tw_cluster_members row) is live: renewed within the TTL (``%(ttl)s``) and, when it
#: has a session key, its session still holds that advisory lock (a bigint key shows in
#: pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1).
_LIVE = """
    m.heartbeat > now() - make_interval(secs => %(ttl)s)
    AND (m.session_key IS NULL OR EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = (m.session_key >> 32)::oid
          AND l.objid = (m.session_key & 4294967295)::oid))
"""


class ClusterDb:
    """One member's connection to the cluster tables (not thread-safe: one caller)."""

    def __init__(self, url: str, member: str, *, ttl_s: float, timeout_s: float = 10.0) -> None:
        self.url = url
        self.member = member
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        parsed = parse_url(url)
        self.store = redact(parsed)
        self._params = _conninfo(parsed)
        self._params.update(pg_connect_args(
            parsed, timeout_s=timeout_s,
            application_name=f"tritonwatch member {member}"[:63]))
        self._conn: psycopg.Connection[Any] | None = None
        #: The advisory lock this connection's session holds: the others' proof that we live.
        self.session_key: int | None = None
        self.evaluator = False

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            # Imported here: serve imports this module for every store, SQLite included.
            import psycopg

            conn = psycopg.connect(autocommit=True, **self._params)
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (PG_LOCK_SCHEMA,))
                    conn.execute(_SCHEMA)
                self.session_key = self._take_session_key(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    @staticmethod
    def _take_session_key(conn: psycopg.Connection[Any]) -> int:
        for _ in range(SESSION_KEY_TRIES):
            key = secrets.randbits(63)  # positive bigint
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if row and row[0]:
                return key
        import psycopg

        raise psycopg.OperationalError("no free advisory lock for this member's session key")

    def _run(self, what: str, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
             ) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            cur = self._connection().execute(sql, params)
            return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            self.drop()
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StoreError(f"cluster {what} on {self.store} failed: {reason}",
                             url=self.store) from exc

    def heartbeat(self) -> list[str]:
        """Renew this member; the live members (this one included), sorted."""
        self._run("connect", "SELECT 1")  # (re)connects first: the row carries its key
        self._run("heartbeat", """
            INSERT INTO tw_cluster_members (member, heartbeat, started, session_key)
            VALUES (%(member)s, now(), now(), %(key)s)
            ON CONFLICT (member) DO UPDATE SET heartbeat = now(), session_key = %(key)s
        """, {"member": self.member, "key": self.session_key})
        rows = self._run("membership", f"""
            SELECT m.member FROM tw_cluster_members m WHERE {_LIVE} ORDER BY m.member
        """, {"ttl": self.ttl_s})
        return [r[0] for r in rows]

    def claim(self, targets: list[str]) -> set[str]:
        """Hold the leases of ``targets`` where free, expired, held by a member that is no
        longer live, or already ours (renewed); give back every other lease this member holds.
        Returns the targets held now."""
        self._run("lease release", """
            DELETE FROM tw_target_leases WHERE holder = %s AND NOT (target = ANY(%s))
        """, (self.member, targets))
        if not targets:
            return set()
        # Liveness is judged in the same statement, so a member that joined since our
        # heartbeat read the member list keeps what it took.
        rows = self._run("lease claim", f"""
            INSERT INTO tw_target_leases (target, holder, expires)
            SELECT t, %(member)s, now() + make_interval(secs => %(ttl)s)
            FROM unnest(%(targets)s::text[]) AS t
            ON CONFLICT (target) DO UPDATE SET holder = excluded.holder,
                                               expires = excluded.expires
            WHERE tw_target_leases.holder = excluded.holder
               OR tw_target_leases.expires < now()
               OR NOT EXISTS (SELECT 1 FROM tw_cluster_members m
                              WHERE m.member = tw_target_leases.holder AND {_LIVE})
            RETURNING target
        """, {"member": self.member, "ttl": self.ttl_s, "targets": targets})
        return {r[0] for r in rows}

    def holders(self) -> dict[str, str]:
        """Every unexpired lease: {target: holder} (for /api and tests)."""
        rows = self._run("lease read", """
            SELECT target, holder FROM tw_target_leases WHERE expires >= now()
        """)
        return {r[0]: r[1] for r in rows}

    def try_evaluator(self) -> bool:
        """Take (or confirm) the evaluator lock; True while this member holds it."""
        if self.evaluator:
            # Held for as long as this connection lives; the heartbeat just proved it does.
            return True
        rows = self._run("evaluator lock", "SELECT pg_try_advisory_lock(%s)",
                         (PG_LOCK_EVALUATOR,))
        self.evaluator = bool(rows and rows[0][0])
        return self.evaluator

    def leave(self) -> None:
        """Give everything back at once (a clean shutdown): the others need not wait a TTL."""
        with contextlib.suppress(StoreError):
            self._run("leave", "DELETE FROM tw_target_leases WHERE holder = %s", (self.member,))
            self._run("leave", "DELETE FROM tw_cluster_members WHERE member = %s",
                      (self.member,))
        self.drop()

    def drop(self) -> None:
        """Close the connection (the server then drops the evaluator lock and the session key:
        the others take this member's targets at their next heartbeat)."""
        self.evaluator = False
        self.session_key = None
        conn, self._conn = self._conn, None
        if conn is not None:
            import psycopg

            with contextlib.suppress(psycopg.Error):
                conn.close()
