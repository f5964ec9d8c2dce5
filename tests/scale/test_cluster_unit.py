"""Cluster pieces on their own: rendezvous hashing and the ``cluster:`` config."""

from __future__ import annotations

import pytest

from tritonwatch.cluster import rendezvous
from tritonwatch.schemas.config import ConfigError, validate_config

TARGETS = [f"triton-{i:04d}" for i in range(1000)]


def test_a_member_leaving_moves_only_its_own_targets():
    three = rendezvous(TARGETS, ["a", "b", "c"])
    two = rendezvous(TARGETS, ["a", "b"])
    for target, owner in three.items():
        if owner != "c":
            assert two[target] == owner
    shares = [sum(1 for o in three.values() if o == m) for m in "abc"]
    assert all(250 < s < 420 for s in shares), shares  # about a third each


def test_a_member_joining_takes_targets_from_each_and_moves_nothing_else():
    two = rendezvous(TARGETS, ["a", "b"])
    three = rendezvous(TARGETS, ["a", "b", "c"])
    assert {t for t in TARGETS if two[t] != three[t]} == {t for t in TARGETS if three[t] == "c"}


def test_cluster_config_needs_postgres_and_a_ttl_over_two_heartbeats():
    with pytest.raises(ConfigError, match=r"cluster\.enabled: members share one PostgreSQL"):
        validate_config({"cluster": {"enabled": True}})
    with pytest.raises(ConfigError, match="lease_ttl"):
        validate_config({"store": {"url": "postgresql://tw@db/tw"},
                         "cluster": {"enabled": True, "heartbeat": "10s", "lease_ttl": "15s"}})
    config = validate_config({"store": {"url": "postgresql://tw@db/tw"},
                              "cluster": {"enabled": True}})
    assert config.cluster.heartbeat == 5.0 and config.cluster.lease_ttl == 20.0
