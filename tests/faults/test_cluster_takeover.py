"""Cluster takeover through real PostgreSQL (issue 18 item 3, "at most one missed interval").

A member's database session is its proof of life: when the session ends (its process died, its
socket closed), the others see it dead and take its leases at their next heartbeat, long before
its lease TTL runs out.  A member whose own database call fails stops collecting at once, so
the takeover never makes two collectors read one target.  The end-to-end version, with two
real ``serve`` processes and SIGKILL, is tests/scale/test_cluster.py.
"""

from __future__ import annotations

import psycopg
import pytest

from tritonwatch.cluster import Membership
from tritonwatch.schemas.cluster import ClusterConfig
from tritonwatch.store.leases import ClusterDb

TARGETS = [f"t{i}" for i in range(6)]
#: Far longer than the test: only the ended session can explain a takeover.
TTL_S = 600.0


@pytest.mark.postgres
def test_a_member_whose_session_ended_is_dead_at_once_and_its_leases_move(
    postgres_db_url: str,
) -> None:
    a = ClusterDb(postgres_db_url, "a", ttl_s=TTL_S)
    b = ClusterDb(postgres_db_url, "b", ttl_s=TTL_S)
    try:
        assert a.heartbeat() == ["a"]
        assert a.claim(TARGETS) == set(TARGETS)
        assert b.heartbeat() == ["a", "b"]
        # a is live: its leases stay its own, however b asks
        assert b.claim(TARGETS) == set()
        assert b.holders() == dict.fromkeys(TARGETS, "a")
        # a's connection ends as a killed process's would (its socket closes); its row and
        # its leases are still well inside the TTL
        a.drop()
        assert b.heartbeat() == ["b"]
        assert b.claim(TARGETS) == set(TARGETS)
        assert b.holders() == dict.fromkeys(TARGETS, "b")
        # a back (a new session, a new key): live again, but b's leases are b's until b
        # gives them back
        assert a.heartbeat() == ["a", "b"]
        assert a.claim(TARGETS) == set()
    finally:
        a.leave()
        b.leave()


@pytest.mark.postgres
def test_a_member_that_loses_its_session_stops_collecting_at_once_then_takes_its_share_back(
    postgres_db_url: str,
) -> None:
    config = ClusterConfig(enabled=True, member="m", heartbeat=1.0, lease_ttl=TTL_S)
    member = Membership(config, postgres_db_url, TARGETS)
    try:
        member.tick()
        assert member.owned == set(TARGETS) and member.owns("t0")
        # The server ends the session (an administrator, a failover, a network cut noticed):
        # the next round fails, and the member stops reading its targets there and then,
        # although its leases had most of their TTL left.
        with psycopg.connect(postgres_db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'tritonwatch member m'")
        member.tick()
        assert member.owned == frozenset() and not member.owns("t0")
        # The next round reaches the database again: its leases are still its own.
        member.tick()
        assert member.owned == set(TARGETS) and member.owns("t0")
    finally:
        member.db.leave()
