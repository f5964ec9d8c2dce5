"""Issue 22 (ingest CPU, fleet memory): the scrape client's per-target pools, the open-files
limit of a fleet, and the weekly report's memory (matplotlib loaded late, figures freed, the
completeness chart bounded).  Real HTTP servers, real matplotlib, a real ``serve`` import."""

from __future__ import annotations

import asyncio
import base64
import resource
import struct
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.fixtures_http import KEEPALIVE_BODY, keepalive_server
from tritonwatch.collector.scrape import PoolPerUrl, fetch_metrics, make_client
from tritonwatch.serve import OPEN_FILES_SPARE, raise_open_files_limit

BODY = KEEPALIVE_BODY


@pytest.fixture
def peers() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    with keepalive_server() as found:
        yield found


def test_each_target_keeps_its_own_connection(peers: tuple[str, list[tuple[str, int]]]) -> None:
    base, seen = peers

    async def scrape_all() -> None:
        async with make_client() as client:
            for _ in range(3):
                for path in ("/a/metrics", "/b/metrics", "/c/metrics"):
                    body = await fetch_metrics(client, path, base + path, timeout=30,
                                               max_bytes=1 << 20)
                    assert body.text == BODY.decode()

    asyncio.run(scrape_all())
    ports = {path: {port for p, port in seen if p == path} for path, _ in seen}
    assert len(seen) == 9
    # One connection per target, reused by its every scrape; no two targets share one (a
    # shared pool re-examined every pooled connection on each request).
    assert all(len(p) == 1 for p in ports.values()), ports
    assert len(set().union(*ports.values())) == 3, ports


def test_urls_past_the_bound_share_one_pool(peers: tuple[str, list[tuple[str, int]]]) -> None:
    base, seen = peers
    transport = PoolPerUrl(shared_connections=2, max_urls=2)

    async def scrape_all() -> None:
        import httpx

        async with httpx.AsyncClient(transport=transport) as client:
            for i in range(6):
                body = await fetch_metrics(client, f"t{i}", f"{base}/t/{i}", timeout=30,
                                           max_bytes=1 << 20)
                assert body.size == len(BODY)

    asyncio.run(scrape_all())
    assert len(seen) == 6
    # Two URLs got pools of their own; the four others went through the shared one, and so
    # over one reused connection (sequential scrapes).
    assert len({port for path, port in seen if path in ("/t/2", "/t/3", "/t/4", "/t/5")}) == 1


def test_open_files_limit_is_raised_for_a_fleet() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1000 + OPEN_FILES_SPARE
    if hard != resource.RLIM_INFINITY and hard < want + 1:
        want = hard - OPEN_FILES_SPARE - 1  # a small hard limit: ask for what it allows
    low = 256
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        raise_open_files_limit(want - OPEN_FILES_SPARE)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want
        raise_open_files_limit(10)  # never lowered
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_serve_does_not_load_matplotlib_until_a_report_is_drawn() -> None:
    code = "import sys, tritonwatch.serve; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False"


def _png_size(uri: str) -> tuple[int, int]:
    data = base64.b64decode(uri.split(",", 1)[1])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_completeness_chart_of_a_large_fleet_is_bounded() -> None:
    from tritonwatch.alerts.report.charts import COMPLETENESS_CHART_MAX, completeness_chart
    from tritonwatch.alerts.report.model import TargetCompleteness

    rows = [TargetCompleteness(f"triton-{i}", 15.0, 40320, 40320 - (i % 7), 1 - (i % 7) / 40320,
                               None) for i in range(1000)]
    rows[500] = TargetCompleteness("triton-500", 15.0, 40320, 20000, 20000 / 40320, "low")
    few = completeness_chart(rows[:COMPLETENESS_CHART_MAX], 0.95)
    many = completeness_chart(rows, 0.95)
    # One bar per target drew 1,000 targets 33,000 pixels tall (120 MB of image buffer); the
    # chart now holds the lowest COMPLETENESS_CHART_MAX, as tall as that many.
    assert _png_size(many)[1] <= _png_size(few)[1] * 1.2
    assert _png_size(many)[1] < 5000
