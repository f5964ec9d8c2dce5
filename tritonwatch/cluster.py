"""``serve`` as one member of a cluster (``cluster.enabled``): its share of the targets and,
for one member at a time, the evaluator role.

Every ``cluster.heartbeat`` seconds, in a worker thread (store/leases.py does the SQL):

1. renew this member's row and read the live members (renewed within ``lease_ttl`` and
   with their database session still open: store/leases.py);
2. rendezvous hashing: each target belongs to the live member with the highest
   ``sha256(member, target)``, so a member joining or leaving moves only its own share;
3. give back the leases of targets this member should no longer own and take or renew those
   it should (free, expired, held by a dead member, or already its own):
   :attr:`Membership.owned` is what the database granted.  A target moving between two live
   members is given back by the old one at its tick and taken by the new one at its next, so
   it is never scraped by both;
4. take the evaluator lock if free.  Gaining it reloads the alert state from the database
   (:attr:`on_gain`) before the flag turns on, so the new evaluator continues the last one's
   incidents (same ``startsAt``: Alertmanager deduplicates) and sends their resolves.

Takeover costs at most one scrape.  A killed process's session ends with its socket, so the
survivors see it dead at their next heartbeat (within ``heartbeat``, not ``lease_ttl``), and
the targets they gain are scraped at once (:attr:`on_gained`) rather than at their next
staggered tick: a target's gap is at most its interval (since the dead member's last scrape)
plus one heartbeat plus a round, under two intervals while ``heartbeat`` is at most half the
scrape interval.  A host that vanishes without closing its sockets is seen dead after
``lease_ttl`` instead.

A member whose database call fails has lost its session (the connection is dropped, and the
others may take its targets at their next heartbeat), so it stops collecting at once, and gives
up the evaluator role (the lock lived on that connection); it takes its share back at the next
heartbeat that reaches the database.  So no target is scraped by two members for longer than
the time between one's database call failing and the other's next heartbeat, at most a
heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable

from tritonwatch.schemas.cluster import ClusterConfig
from tritonwatch.store.errors import StoreError
from tritonwatch.store.leases import ClusterDb

log = logging.getLogger(__name__)


def default_member() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def rendezvous(targets: Iterable[str], members: list[str]) -> dict[str, str]:
    """{target: owner}: the member with the highest hash of (member, target)."""
    out = {}
    for target in targets:
        out[target] = max(members, key=lambda m: hashlib.sha256(
            f"{m}\0{target}".encode()).digest())
    return out


class Membership:
    """This process's place in the cluster; :meth:`run` keeps it up to date."""

    def __init__(self, config: ClusterConfig, store_url: str, targets: Iterable[str], *,
                 on_gain: Callable[[], object] | None = None,
                 on_owned: Callable[[frozenset[str]], None] | None = None,
                 on_gained: Callable[[frozenset[str]], None] | None = None) -> None:
        self.config = config
        self.member = config.member or default_member()
        self.targets = sorted(set(targets))
        self.db = ClusterDb(store_url, self.member, ttl_s=config.lease_ttl)
        self.on_gain = on_gain
        self.on_owned = on_owned
        #: Called in the event loop with the targets a round granted this member (taken over
        #: from another, back after an outage, or its first share), to be read at once.
        self.on_gained = on_gained
        #: The targets this member may scrape now (granted by the database).
        self.owned: frozenset[str] = frozenset()
        self.members: list[str] = []
        self._valid_until = 0.0  # monotonic: owned is void after this without a renewal
        self._leader = False

    @property
    def leader(self) -> bool:
        """True while this member evaluates alerts, writes reports and runs maintenance."""
        return self._leader

    def owns(self, target: str) -> bool:
        return target in self.owned and time.monotonic() < self._valid_until

    def tick(self) -> None:
        """One round (blocking; a worker thread): membership, leases, evaluator lock."""
        started = time.monotonic()
        try:
            members = self.db.heartbeat()
            if self.member not in members:  # our own row, just written, is live
                members = sorted({*members, self.member})
            mine = [t for t, m in rendezvous(self.targets, members).items() if m == self.member]
            owned = frozenset(self.db.claim(mine))
            leader = self.db.try_evaluator()
        except StoreError as exc:
            if self._leader:
                log.error("cluster: %s lost the evaluator role: %s", self.member, exc)
            self._leader = False
            # The failed call dropped the connection, so its session (our proof of life to the
            # others) is gone or going: they may take our targets at their next heartbeat.
            self._valid_until = 0.0
            if self.owned:
                log.error("cluster: %s stops collecting its %d target(s) until it reaches the "
                          "database again: %s", self.member, len(self.owned), exc)
                self._set_owned(frozenset())
            else:
                log.warning("cluster: heartbeat of %s failed: %s", self.member, exc)
            return
        # The database counts the TTL from when it ran the statement, after `started`.
        self._valid_until = started + self.config.lease_ttl
        if members != self.members:
            log.info("cluster: %d live member(s): %s", len(members), ", ".join(members))
            self.members = members
        if owned != self.owned:
            log.info("cluster: %s collects %d of %d target(s)%s", self.member, len(owned),
                     len(self.targets),
                     f" ({len(mine) - len(owned)} still held by another member)"
                     if len(owned) < len(mine) else "")
            self._set_owned(owned)
        if leader and not self._leader:
            if self.on_gain is not None:
                self.on_gain()  # the alert state as the last evaluator left it
            log.warning("cluster: %s is the evaluator now (alerts, reports, maintenance)",
                        self.member)
            self._leader = True

    def _set_owned(self, owned: frozenset[str]) -> None:
        self.owned = owned
        if self.on_owned is not None:
            self.on_owned(owned)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every heartbeat until ``stop``; then leave (leases and lock given back)."""
        try:
            while not stop.is_set():
                before = self.owned
                try:
                    await asyncio.to_thread(self.tick)
                except Exception:
                    log.exception("cluster: heartbeat of %s failed", self.member)
                gained = self.owned - before
                if gained and self.on_gained is not None:
                    try:
                        self.on_gained(gained)
                    except Exception:
                        log.exception("cluster: reading the targets %s took over failed",
                                      self.member)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.heartbeat)
        finally:
            self._leader = False
            self._set_owned(frozenset())
            await asyncio.to_thread(self.db.leave)

