"""Issue 22, the fleet's collector: what one ``serve`` spends per target, in CPU and memory.

1. A scrape connection outlives the scrape interval: httpx's default keep-alive (5 s) closed
   every idle connection before a 15 s interval's next scrape, so each scrape paid a TCP
   connect and close (about a tenth of the collector's CPU at 1,000 targets).
2. ``serve`` does not load what it only needs on demand (pandas, matplotlib, streamlit, the
   Triton client, Jinja2 for the weekly report, protobuf and snappy for remote write).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.fixtures_http import KEEPALIVE_BODY, keepalive_server
from tritonwatch.collector.scrape import KEEPALIVE_EXPIRY_S, fetch_metrics, make_client

BODY = KEEPALIVE_BODY


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    with keepalive_server() as found:
        yield found


def test_idle_scrape_connection_is_kept_past_httpx_default(
    server: tuple[str, list[tuple[str, int]]],
) -> None:
    base, seen = server
    url = base + "/metrics"
    assert KEEPALIVE_EXPIRY_S >= 300  # as Prometheus: longer than any usual scrape interval

    async def two_scrapes() -> None:
        async with make_client() as client:
            for i in range(2):
                if i:
                    await asyncio.sleep(5.5)  # past httpx's default keep-alive of 5 s
                body = await fetch_metrics(client, "t", url, timeout=30, max_bytes=1 << 20)
                assert body.text == BODY.decode()

    asyncio.run(two_scrapes())
    ports = [port for _, port in seen]
    assert len(ports) == 2
    assert ports[0] == ports[1], "the second scrape opened a new connection"


def test_connection_the_target_closed_is_replaced() -> None:
    """A kept connection the target closed while idle is not reused: the scrape succeeds on
    a new one."""

    async def scrapes(url: str) -> None:
        async with make_client() as client:
            for i in range(2):
                if i:
                    await asyncio.sleep(2.0)  # the server closes it after 0.5 s idle
                body = await fetch_metrics(client, "t", url, timeout=30, max_bytes=1 << 20)
                assert body.text == BODY.decode()

    with keepalive_server(idle_timeout=0.5) as (base, seen):
        asyncio.run(scrapes(base + "/metrics"))
    ports = [port for _, port in seen]
    assert len(ports) == 2 and ports[0] != ports[1]


#: Modules ``serve`` must not load at start (each costs resident memory for the whole run).
NOT_AT_START = ("pandas", "matplotlib", "streamlit", "tritonclient", "grpc", "scipy", "pyarrow",
                "jinja2", "google.protobuf", "cramjam",
                # PostgreSQL's driver: a PostgreSQL store loads it when it connects.
                "psycopg")


def test_serve_does_not_import_what_it_needs_only_on_demand() -> None:
    code = ("import sys, tritonwatch.cli, tritonwatch.serve; "
            "print(' '.join(m for m in sys.argv[1:] if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *NOT_AT_START], capture_output=True,
                         text=True, timeout=120, env={**os.environ}, check=True)
    assert out.stdout.split() == [], f"imported at start: {out.stdout.strip()}"


def test_plans_of_a_fleet_share_their_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """3. Two servers of one deployment (own GPU UUIDs) hold one copy of the plan keys that
    name accumulators and fields, not one each (about 20 KB per target at 566 series)."""
    from tests.payloads import triton_payload
    from tritonwatch.collector.derive import Deriver, accumulate
    from tritonwatch.collector.shape import parse_columns

    monkeypatch.setattr(accumulate, "_SHARED", {})  # other tests may have filled it

    plans = []
    for seed in (11, 12):
        deriver = Deriver(f"t{seed}", max_gap_s=300.0)
        shape = None
        for step in range(2):
            text = triton_payload(models=7, gpus=2, seed=seed, step=step)
            shape, values = parse_columns(text, shape)
            deriver.derive_columns(shape, values, 1_700_000_000.0 + 15 * step, {})
        plan = deriver._engines[0].plan
        assert plan is not None
        plans.append(plan)
    a, b = plans
    for attr in ("seen_keys", "slot_keys", "gauge_keys", "seen_static"):
        mine: list[object] = getattr(a, attr)
        theirs = {x: x for x in getattr(b, attr)}
        common = [x for x in mine if x in theirs]
        assert common, attr
        assert all(theirs[x] is x for x in common), f"{attr}: equal keys are separate copies"


def test_equal_label_sets_are_one_tuple(monkeypatch: pytest.MonkeyPatch) -> None:
    """4. The label sets the derived series and alert rules make every scrape, for every
    target, are shared: one tuple per distinct set (248,000 live copies at 1,000 targets).
    Past the table's bound they are still right, only no longer shared."""
    from tritonwatch.schemas import samples
    from tritonwatch.schemas.samples import make_labels

    monkeypatch.setattr(samples, "_SHARED_LABELS", {})  # other tests may have filled it
    a = make_labels({"model": "m-fleet-test", "version": "1", "reason": "REJECTED"})
    b = make_labels((("reason", "REJECTED"), ("version", "1"), ("model", "m-fleet-test")))
    assert a == (("model", "m-fleet-test"), ("reason", "REJECTED"), ("version", "1"))
    assert a is b
    monkeypatch.setattr(samples, "SHARED_LABELS_MAX", 1)
    c = make_labels({"model": "m-fleet-test-2"})
    d = make_labels({"model": "m-fleet-test-2"})
    assert c == d == (("model", "m-fleet-test-2"),) and c is not d
