"""Cluster takeover through real PostgreSQL (issue 18 item 3, "at most one missed interval").

A member's database session is its proof of life: when the session ends (its process died, its
socket closed), the others see it dead and take its leases at their next heartbeat, long before
its lease TTL runs out, and reads what it took at once.  A member whose own database call fails
stops collecting at once, so the takeover never makes two collectors read one target.  The
end-to-end version, with two real ``serve`` processes and SIGKILL, is
tests/scale/test_cluster.py.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tests.scale.targets import simulated_targets
from tritonwatch.cluster import Membership
from tritonwatch.collector.jobs import Collector, stagger_offset
from tritonwatch.schemas.cluster import ClusterConfig
from tritonwatch.schemas.config import validate_config
from tritonwatch.store import Store
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
        # its leases are still well inside the TTL.  The server's backend for it exits a
        # moment after the socket closes (on a loaded machine, not before b's next statement),
        # so b is given up to 60 s: a tenth of the TTL, a margin that holds under load.
        a.drop()
        deadline = time.monotonic() + 60
        while b.heartbeat() != ["b"]:
            assert time.monotonic() < deadline, "a still live 60 s after its session ended"
            time.sleep(0.05)
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
            # (waiting up to 10 s for the backend to be gone, so the next round meets a
            # closed connection, not one still shutting down)
            ended = admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM "
                                  "pg_stat_activity WHERE application_name = "
                                  "'tritonwatch member m'").fetchall()
            assert ended == [(True,)]
        member.tick()
        assert member.owned == frozenset() and not member.owns("t0")
        # The next round reaches the database again: its leases are still its own.
        member.tick()
        assert member.owned == set(TARGETS) and member.owns("t0")
    finally:
        member.db.leave()


def test_a_target_taken_over_is_scraped_at_once_and_its_staggered_turn_does_not_double_it(
    store: Store,
) -> None:
    """The survivor reads what it took at once (not up to an interval later at the target's
    staggered turn), says who it is, and skips a staggered turn that comes right after."""
    interval = 60.0
    # a target whose staggered turn is far from the start: only read_now explains a scrape
    name = next(n for n in (f"sim-{i}" for i in range(100))
                if stagger_offset(f"scrape:{n}", interval) > interval / 2)
    with simulated_targets(models=1, gpus=1) as sims:
        config = validate_config({"targets": [{"name": name, "metrics_url": sims.url(name)}],
                                  "scrape": {"interval": f"{interval:g}s"}})
        collector = Collector(config, store)
        owned: set[str] = set()
        collector.owns = owned.__contains__
        collector.member = "member-b"

        async def run() -> tuple[float, int]:
            scheduler = AsyncIOScheduler(timezone="UTC")
            collector.install(scheduler)
            scheduler.start()
            try:
                owned.add(name)  # the database granted it
                taken = time.time()
                collector.read_now({name})
                deadline = time.monotonic() + 30
                while not sims.scrapers(name) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                first = sims.scrapers(name)[0][0] - taken
                # the staggered turn coming now (within half an interval) is skipped ...
                await collector._scrape_if_owned(name)
                skipped = len(sims.scrapers(name))
                # ... and the one after it is not
                await collector._scrape_if_owned(name)
                return first, skipped
            finally:
                scheduler.shutdown(wait=False)
                await collector.close()

        first, after_skip = asyncio.run(run())
        assert first < 10, first  # its staggered turn was over 30 s away
        assert after_skip == 1
        assert [m for _, m in sims.scrapers(name)] == ["member-b", "member-b"]
