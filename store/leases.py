"""Cluster membership, target leases and the evaluator lock in PostgreSQL (``cluster:``).

Two small tables, created on first use, and one advisory lock:

* ``tw_cluster_members(member, heartbeat, started)``: each ``serve`` renews its row every
  heartbeat; a member whose row is older than the lease TTL is dead.
* ``tw_target_leases(target, holder, expires)``: a member scrapes a target only while it holds
  its lease.  :meth:`ClusterDb.claim` renews the leases a member holds and takes the free or
  expired ones it should own, in one statement; it gives back the ones it should no longer
  own.  The database decides who holds what, so no two members ever hold one lease at once.
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
from typing import Any

import psycopg

from tritonwatch.store.engine import parse_url, pg_connect_args, redact
from tritonwatch.store.errors import StoreError
from tritonwatch.store.writer_lock import _conninfo

log = logging.getLogger(__name__)

#: The evaluator's advisory lock (beside the writer lock's 0x7477_0010).
PG_LOCK_EVALUATOR = 0x7477_0011
#: Serializes the first creation of the tables by members starting together.
PG_LOCK_SCHEMA = 0x7477_0012

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
        self.evaluator = False

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            conn = psycopg.connect(autocommit=True, **self._params)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (PG_LOCK_SCHEMA,))
                conn.execute(_SCHEMA)
            self._conn = conn
        return self._conn

    def _run(self, what: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
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
        self._run("heartbeat", """
            INSERT INTO tw_cluster_members (member, heartbeat, started)
            VALUES (%s, now(), now())
            ON CONFLICT (member) DO UPDATE SET heartbeat = now()
        """, (self.member,))
        rows = self._run("membership", """
            SELECT member FROM tw_cluster_members
            WHERE heartbeat > now() - make_interval(secs => %s) ORDER BY member
        """, (self.ttl_s,))
        return [r[0] for r in rows]

    def claim(self, targets: list[str]) -> set[str]:
        """Hold the leases of ``targets`` where free, expired or already ours (renewed); give
        back every other lease this member holds.  Returns the targets held now."""
        self._run("lease release", """
            DELETE FROM tw_target_leases WHERE holder = %s AND NOT (target = ANY(%s))
        """, (self.member, targets))
        if not targets:
            return set()
        rows = self._run("lease claim", """
            INSERT INTO tw_target_leases (target, holder, expires)
            SELECT t, %s, now() + make_interval(secs => %s) FROM unnest(%s::text[]) AS t
            ON CONFLICT (target) DO UPDATE SET holder = excluded.holder,
                                               expires = excluded.expires
            WHERE tw_target_leases.holder = excluded.holder
               OR tw_target_leases.expires < now()
            RETURNING target
        """, (self.member, self.ttl_s, targets))
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
        """Close the connection (the server then drops the evaluator lock)."""
        self.evaluator = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
