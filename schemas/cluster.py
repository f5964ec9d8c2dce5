"""The ``cluster:`` section of ``tritonwatch.yaml``: several ``serve`` processes on one
PostgreSQL sharing the work.  No I/O here.

Example::

    store: {url: postgresql://tw@db/tritonwatch}
    cluster:
      enabled: true
      heartbeat: 5s      # each member renews its membership and leases this often
      lease_ttl: 20s     # a member silent this long is dead: its targets move

With ``enabled``, the store's single-writer lock (``store.writer_lock``) gives way to
membership: each member heartbeats into PostgreSQL, takes a stable-hash share of the targets
(rendezvous hashing over the live members) through per-target leases, and exactly one member
(a PostgreSQL advisory lock) evaluates alerts, writes reports and runs maintenance.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tritonwatch.schemas.values import Frozen, PositiveDuration


class ClusterConfig(Frozen):
    """Sharded collectors with failover and one alert evaluator (README "Cluster")."""

    enabled: bool = False
    """Share targets and roles with the other ``serve`` processes on this PostgreSQL."""
    member: str | None = Field(default=None, min_length=1, max_length=200,
                               pattern=r"^[A-Za-z0-9_.:@\-]+$")
    """This process's name among the members; default ``<host>:<pid>``.  Unique per
    process."""
    heartbeat: PositiveDuration = 5.0
    """How often membership and leases are renewed; a target changes hands within one
    heartbeat of a member joining, leaving or dying, so keep it at most half the scrape
    interval (a takeover then costs at most one scrape)."""
    lease_ttl: PositiveDuration = 20.0
    """A member (or lease) not renewed for this long is dead: its targets are taken over and,
    if it evaluated, another member takes over evaluation.  Takeover takes at most this plus
    one heartbeat; a killed process (its database session ended) is taken over at the next
    heartbeat."""

    @model_validator(mode="after")
    def _ttl_outlives_heartbeats(self) -> ClusterConfig:
        if self.lease_ttl < 2 * self.heartbeat:
            raise ValueError(f"lease_ttl ({self.lease_ttl:g}s) must be at least twice the "
                             f"heartbeat ({self.heartbeat:g}s), or one late heartbeat would "
                             "hand every target over")
        return self
