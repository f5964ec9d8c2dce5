"""Sharded collectors with failover and one alert evaluator (issue 18 items 3 and 4), through
two real ``tritonwatch serve`` processes on one real PostgreSQL, simulated Triton targets and a
real Alertmanager.

One member is SIGKILLed mid-incident: its targets move to the other within 60 s at the cost of
at most one missed scrape each, no target is scraped by both for longer than one interval (the
targets see who scrapes them: ``X-Tritonwatch-Member``), the other becomes the evaluator, and
the incident that spans the failover is notified exactly once when it fires and once when it
resolves.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.fixtures_alertmanager import AlertmanagerServer
from tests.fixtures_http import free_port
from tests.scale.receivers import VictoriaMetrics, running
from tests.scale.targets import SimulatedTargets, simulated_targets
from tests.serving import terminate
from tritonwatch.cluster import rendezvous
from tritonwatch.schemas.config import validate_config
from tritonwatch.store.leases import PG_LOCK_EVALUATOR

CLI = [sys.executable, "-m", "tritonwatch.cli"]
TARGETS = [f"sim-{i}" for i in range(8)]
MEMBERS = ("member-a", "member-b")
# The recommended proportions (README "Cluster"): a heartbeat of at most half the interval.
# The TTL is long on purpose (over 3 intervals): a killed process must be seen dead through its
# ended database session at the next heartbeat, not by waiting out the TTL.
INTERVAL = 3.0
HEARTBEAT = 1.0
LEASE_TTL = 10.0
#: Scheduling slack on a busy 2-core machine shared with other test runs: a heartbeat round,
#: a worker-thread hop and an HTTP round trip can each be late by a fraction of a second.  It
#: stays under one interval, so a second missed scrape (a gap of 3 intervals) still fails.
MARGIN = 2.0
ALERT = "ScaleFailoverTargetDown"


class Member:
    def __init__(self, name: str, tmp: Path, sims: SimulatedTargets, db_url: str,
                 am_url: str, write_url: str) -> None:
        self.name = name
        self.port = free_port()
        self.dir = tmp / name
        self.dir.mkdir()
        rules = self.dir / "rules.yaml"
        rules.write_text(yaml.safe_dump({
            "defaults": {"enabled": False},
            # Still true while nobody scrapes the target (a failover): the last `up` counts.
            "alerts": [{"name": ALERT, "series": "up", "target": "sim-0", "agg": "last",
                        "window": "60s", "op": "<", "threshold": 1}],
        }))
        config = {
            "targets": [{"name": n, "metrics_url": sims.url(n)} for n in TARGETS],
            "scrape": {"interval": f"{INTERVAL:g}s", "timeout": "1s"},
            "store": {"url": db_url, "flush_interval": "1s", "spill_dir": str(self.dir)},
            "api": {"listen": f"127.0.0.1:{self.port}"},
            "reports": {"enabled": False},
            "nvml": {"enabled": False},
            "alerting": {"rules_file": str(rules), "eval_interval": "1s",
                         "alertmanagers": [am_url]},
            "remote_write": [{"name": "vm", "url": write_url,
                              "queue": {"batch_send_deadline": "1s"},
                              "buffer": {"dir": str(self.dir / "rw"), "max_size": "64MiB",
                                         "segment_size": "1MiB"}}],
            "cluster": {"enabled": True, "member": name, "heartbeat": f"{HEARTBEAT:g}s",
                        "lease_ttl": f"{LEASE_TTL:g}s"},
        }
        validate_config(config)
        self.config = self.dir / "tw.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = self.dir / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([*CLI, "-v", "serve", "--config", str(self.config)],
                                         cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                                         env=dict(os.environ))
        wait_until(f"{self.name} answering", lambda: httpx.get(
            f"http://127.0.0.1:{self.port}/metrics", timeout=5).status_code == 200, 60, self)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc, 60)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def wait_until(what: str, check: Callable[[], Any], timeout: float, *members: Member) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
            if found:
                return found
        except (httpx.HTTPError, psycopg.Error):
            pass
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {m.name}:\n{m.log_tail()}" for m in members)
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{logs}")
        time.sleep(0.25)


def holders(db_url: str) -> dict[str, str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT target, holder FROM tw_target_leases WHERE expires >= now()").fetchall()
    return {r[0]: r[1] for r in rows}


def evaluator(db_url: str) -> str | None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("""
            SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND l.classid = %s AND l.objid = %s
        """, (PG_LOCK_EVALUATOR >> 32, PG_LOCK_EVALUATOR & 0xFFFF_FFFF)).fetchone()
    return None if row is None else str(row[0]).removeprefix("tritonwatch member ")


def assert_never_scraped_by_two(sims: SimulatedTargets) -> None:
    """No target was scraped by both members for longer than one interval, over the whole run
    (member-b joining, then member-a killed).

    Each member's scrapes of a target form spans: its first to last scrape, split where it
    paused for over 2 intervals plus the margin (a target given away and taken back).  Two
    members scraping one target at once make spans that overlap for as long as they both
    do."""
    for name in TARGETS:
        spans: dict[str, list[list[float]]] = {}
        for t, member in sims.scrapers(name):
            assert member in MEMBERS, (name, member)  # every scrape says who sent it
            runs = spans.setdefault(member, [])
            if runs and t - runs[-1][1] <= 2 * INTERVAL + MARGIN:
                runs[-1][1] = t
            else:
                runs.append([t, t])
        for (m1, runs1), (m2, runs2) in itertools.combinations(spans.items(), 2):
            for s1, e1 in runs1:
                for s2, e2 in runs2:
                    overlap = min(e1, e2) - max(s1, s2)
                    assert overlap <= INTERVAL, (name, m1, (s1, e1), m2, (s2, e2))


def notifications(am: AlertmanagerServer, status: str) -> list[dict[str, Any]]:
    return [p for p in am.recorder.for_alertname(ALERT) if p.get("status") == status]


@pytest.mark.postgres
def test_two_collectors_share_targets_fail_over_and_one_evaluator_notifies_once(
    tmp_path: Path, postgres_db_url: str, running_alertmanager: AlertmanagerServer,
) -> None:
    am = running_alertmanager
    want = rendezvous(TARGETS, list(MEMBERS))
    assert set(want.values()) == set(MEMBERS)  # both get a share (fixed names: deterministic)
    with simulated_targets(models=2, gpus=1) as sims, \
            running(VictoriaMetrics(tmp_path / "vm")) as vm:
        a, b = (Member(n, tmp_path, sims, postgres_db_url, am.url, vm.write_url)
                for n in MEMBERS)
        try:
            a.start()
            wait_until("member-a evaluating", lambda: evaluator(postgres_db_url) == a.name,
                       30, a)
            b.start()
            # Every target held by its rendezvous owner, once both are live.
            wait_until("the targets shared by the hash",
                       lambda: holders(postgres_db_url) == want, 30, a, b)
            # member-b reads what it took at once, maybe a moment after member-a's last scrape
            # of it (two samples well apart in time, not a duplicate): let that pass first.
            time.sleep(INTERVAL)

            # Each target is scraped by one collector: over 5 intervals, about 5 hits each
            # (two collectors would make about 10).
            t0 = time.time()
            time.sleep(5 * INTERVAL)
            t1 = time.time()
            for name in TARGETS:
                hits = [t for t, _ in sims.hits(name) if t0 <= t < t1]
                assert 3 <= len(hits) <= 6, (name, len(hits))
            # ... and its series reach VictoriaMetrics once: one `up` per scrape, never two.
            wait_until("remote-write caught up", lambda: len(vm.raw_samples(
                '{__name__="up"}', t0, t1)) == len(TARGETS), 30, a, b)
            for labels, points in vm.raw_samples('{__name__="up"}', t0 - 1, t1).items():
                gaps = [b_[0] - a_[0] for a_, b_ in itertools.pairwise(points)]
                assert gaps and min(gaps) >= 0.5 * INTERVAL * 1000, (labels, gaps)

            # An incident begins; member-a evaluates and notifies it.
            sims.set_broken("sim-0", True)
            wait_until("the firing notification",
                       lambda: notifications(am, "firing"), 60, a, b)

            # SIGKILL member-a while the incident lasts.
            a_targets = [t for t, m in want.items() if m == a.name]
            killed_at = time.time()
            a.kill()
            wait_until("member-b holding every target",
                       lambda: holders(postgres_db_url) == dict.fromkeys(TARGETS, b.name),
                       60, b)
            moved_in = time.time() - killed_at
            wait_until("member-b evaluating", lambda: evaluator(postgres_db_url) == b.name,
                       60, b)
            wait_until("every moved target scraped again", lambda: all(
                any(t > killed_at + moved_in - 0.5 for t, _ in sims.hits(n))
                for n in a_targets), 60, b)
            assert moved_in < 60
            # At most one missed scrape per moved target: measured where the scrapes land (the
            # samples member-a scraped but had not yet flushed died with it; that is the
            # buffer's loss, flush_interval, not a gap in scraping).  The session of the
            # killed process ends with it, so member-b sees it dead at its next heartbeat
            # (not a TTL later) and scrapes what it took at once: the gap is at most the
            # interval since member-a's last scrape plus a heartbeat round, under 2 intervals.
            for name in a_targets:
                times = [t for t, _ in sims.hits(name)]
                before = max(t for t in times if t <= killed_at)
                after = min(t for t in times if t > killed_at)
                assert after - before <= 2 * INTERVAL + MARGIN, (name, after - before)

            # member-b's evaluations go on with the same incident, then the resolve.
            time.sleep(3)
            sims.set_broken("sim-0", False)
            wait_until("the resolve notification",
                       lambda: notifications(am, "resolved"), 60, b)
            time.sleep(3)  # room for a duplicate, had there been one
            assert len(notifications(am, "firing")) == 1, am.recorder.for_alertname(ALERT)
            assert len(notifications(am, "resolved")) == 1, am.recorder.for_alertname(ALERT)
            assert_never_scraped_by_two(sims)
            fired = notifications(am, "firing")[0]["alerts"][0]
            resolved = notifications(am, "resolved")[0]["alerts"][0]
            assert fired["startsAt"] == resolved["startsAt"]  # one incident, not two
            assert "is the evaluator now" in b.log.read_text()
        finally:
            for member in (a, b):
                if member.proc is not None and member.proc.poll() is None:
                    member.stop()
