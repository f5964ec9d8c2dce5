"""Faults of the HTTP API (issue 19), each through the real API over a real store.

1. list answers are paged and read with LIMIT; range reads are capped before they read;
2. ``api.token`` guards every write, and reads with ``api.auth_reads``; /healthz stays open;
6. a frozen database (a real PostgreSQL stopped with SIGSTOP) leaves /healthz and /metrics
   answering, and reads beyond the bounded pool get a fast 503;
9. bad parameters are 400 naming them, a down database is 503, ±Inf and NaN round-trip;
12. /api/v1/targets lists configured targets only, and TargetDown of a removed target resolves.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.fixtures_http import FakeTargets, free_port
from tritonwatch.alerts.jobs import AlertJob
from tritonwatch.api.app import create_app
from tritonwatch.api.receiver import WEBHOOK_PATH
from tritonwatch.schemas.alerting import AlertingConfig
from tritonwatch.schemas.config import ApiConfig, validate_config
from tritonwatch.schemas.samples import Sample, TargetHealth
from tritonwatch.store import Store, open_store
from tritonwatch.store.alerts import AlertStore

R = TypeVar("R")
TOKEN = "api-token-0123456789abcdef"
RECEIVER_TOKEN = "receiver-token-abcdef-0123456789"
T0 = 1_700_000_000.0


def api(**settings: Any) -> ApiConfig:
    return ApiConfig.model_validate(settings)


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` behind uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def catalogue(store: Store, targets: int, per_target: int, name: str = "boom") -> None:
    for k in range(targets):
        store.write(f"t{k:03d}", T0, [Sample(name, (("i", f"{i:05d}"),), float(i))
                                      for i in range(per_target)])
    store.flush()


def next_link(response: Any) -> str | None:
    """The next page's URL from a list answer's ``Link`` header (TestClient's response or
    httpx's)."""
    link = response.headers.get("link")
    return None if link is None else link.split(">", 1)[0].lstrip("<")


# --- 1. limits and pages ---------------------------------------------------------------------


def test_series_come_in_pages_that_add_up_to_the_catalogue(make_store: Callable[..., Store]):
    store = make_store()
    catalogue(store, 3, 700)  # 2,100 series
    client = TestClient(create_app(store, api=api(default_limit=500, max_limit=1000)))
    seen: list[tuple[str, str]] = []
    url: str | None = "/api/v1/series?name=boom"
    pages = 0
    while url is not None:
        r = client.get(url)
        assert r.status_code == 200, r.text
        page = r.json()["data"]
        assert len(page) <= 500
        seen += [(s["target"], s["i"]) for s in page]
        url = next_link(r)
        if url is not None:
            assert r.json()["warnings"] == [
                "results truncated due to limit 500 (api.max_limit caps it)"]
        pages += 1
    assert pages == 5 and len(seen) == 2100 and seen == sorted(set(seen))
    r = client.get("/api/v1/series", params={"limit": 1001})
    assert r.status_code == 400 and '"limit"' in r.json()["error"] and "1000" in r.json()["error"]
    r = client.get("/api/v1/series", params={"name": "boom", "after": "bm90IGEgdG9rZW4"})
    assert r.status_code == 400 and 'invalid parameter "after"' in r.json()["error"]
    # A page asked for explicitly, up to max_limit.
    r = client.get("/api/v1/series", params={"target": "t001", "limit": 1000})
    assert len(r.json()["data"]) == 700 and next_link(r) is None
    assert "warnings" not in r.json()


def _peak_bytes(call: Callable[[], R]) -> tuple[R, int]:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        response = call()
        return response, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_huge_catalogue_costs_one_page_of_memory(make_store: Callable[..., Store]):
    # The fleet's 1.38 M series made one GET /api/v1/series take 800 MB: every key was read
    # and built before the answer.  20,000 here: building them all takes several MB; one page
    # of 10 read with LIMIT, a few hundred KB of request handling.
    store = make_store()
    catalogue(store, 4, 5_000)
    client = TestClient(create_app(store, api=api(max_series=100)))
    client.get("/healthz")
    r, peak = _peak_bytes(lambda: client.get("/api/v1/series", params={"name": "boom",
                                                                        "limit": 10}))
    assert r.status_code == 200 and len(r.json()["data"]) == 10 and next_link(r)
    assert peak < 2 << 20, f"a page of 10 series took {peak / 2**20:.1f} MiB"
    # A range query over the same name is refused before its samples or keys are read.
    r, peak = _peak_bytes(lambda: client.get("/api/v1/query_range", params={
        "name": "boom", "start": T0 - 60, "end": T0 + 60, "step": "60"}))
    assert r.status_code == 422, r.text
    assert "100 series" in r.json()["error"] and "api.max_series" in r.json()["error"]
    assert peak < 2 << 20, f"refusing took {peak / 2**20:.1f} MiB"


def test_range_queries_are_capped_in_points_series_and_samples(store: Store):
    for i in range(600):  # 600 samples of one series, 1 s apart
        store.write("t", T0 + i, [Sample("g", (), float(i))])
    store.flush()
    client = TestClient(create_app(store, api=api(max_samples=599)))
    r = client.get("/api/v1/query_range", params={"name": "g", "start": T0, "end": T0 + 86400,
                                                   "step": "1"})
    assert r.status_code == 400
    assert r.json()["error"].startswith("exceeded maximum resolution of 11,000 points per "
                                        "timeseries. Try decreasing the query resolution")
    r = client.get("/api/v1/query_range", params={"name": "g", "start": T0, "end": T0 + 600,
                                                   "step": "60"})
    assert r.status_code == 422 and "more than 599 samples" in r.json()["error"]
    assert "api.max_samples" in r.json()["error"] and r.json()["errorType"] == "execution"
    client = TestClient(create_app(store, api=api(max_samples=600)))
    r = client.get("/api/v1/query_range", params={"name": "g", "start": T0, "end": T0 + 299,
                                                   "step": "60"})
    assert r.status_code == 200, r.text
    [series] = r.json()["data"]["result"]
    assert [p[0] for p in series["values"]] == [T0 - 20 + 60 * k for k in range(6)]


def test_targets_are_paged(store: Store):
    for k in range(25):
        store.write_health(TargetHealth(f"t{k:02d}", "metrics", T0, True, 0.1, 3, None))
    client = TestClient(create_app(store, api=api(default_limit=10)))
    names: list[str] = []
    url: str | None = "/api/v1/targets"
    while url is not None:
        r = client.get(url)
        assert r.status_code == 200
        names += [h["target"] for h in r.json()["data"]]
        url = next_link(r)
    assert names == [f"t{k:02d}" for k in range(25)]


# --- 2. the API token -------------------------------------------------------------------------


def _write_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) of the app that writes, as its OpenAPI schema lists them."""
    return [(method.upper(), path) for path, ops in app.openapi()["paths"].items()
            for method in ops if method.upper() in {"POST", "PUT", "PATCH", "DELETE"}]


def test_the_token_guards_every_write_and_reads_only_when_asked(store: Store):
    alerting = AlertingConfig.model_validate({"receiver": {"token": RECEIVER_TOKEN}})
    app = create_app(store, alerting=alerting, api=api(token=TOKEN))
    writes = _write_routes(app)
    assert ("POST", WEBHOOK_PATH) in writes
    with served(app) as base, httpx.Client(base_url=base, timeout=30) as http:
        for method, path in writes:
            # Every write route refuses a request without credentials, or with the wrong ones.
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                            {"Authorization": f"Basic {TOKEN}"}):
                r = http.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.headers["www-authenticate"].startswith(("Bearer", "Basic"))
        # A route added later is guarded without knowing about it.
        extra = create_app(store, api=api(token=TOKEN))

        @extra.post("/api/v1/reload")
        async def reload() -> dict[str, str]:
            return {"status": "reloaded"}

        with TestClient(extra) as c:
            assert c.post("/api/v1/reload").status_code == 401
            assert c.post("/api/v1/reload", headers={"Authorization": "Bearer x"}
                          ).status_code == 401
            ok = c.post("/api/v1/reload", headers={"Authorization": f"bearer {TOKEN}"})
            assert ok.status_code == 200 and ok.json() == {"status": "reloaded"}
        # The receiver still takes its own token (Alertmanager sends one header), not api.token.
        payload = {"receiver": "r", "status": "firing", "alerts": [{
            "status": "firing", "labels": {"alertname": "X"},
            "startsAt": "2026-01-01T00:00:00Z"}]}
        r = http.post(WEBHOOK_PATH, json=payload,
                      headers={"Authorization": f"Bearer {RECEIVER_TOKEN}"})
        assert r.status_code == 200 and r.json()["stored"] == 1
        r = http.post(WEBHOOK_PATH, json=payload, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 401
        # Reads are open unless auth_reads is set.
        for path in ("/api/v1/targets", "/api/v1/series?match[]=up", "/metrics", "/openapi.json",
                     "/docs"):
            assert http.get(path).status_code == 200, path
    assert len(AlertStore(store).events()) == 1


def test_writes_are_refused_without_a_configured_token(store: Store):
    app = create_app(store)

    @app.delete("/api/v1/series")
    async def delete_series() -> dict[str, str]:
        return {"deleted": "everything"}

    with TestClient(app) as c:
        r = c.delete("/api/v1/series", headers={"Authorization": "Bearer anything-at-all-123"})
        assert r.status_code == 403 and "api.token" in r.json()["error"]


def test_auth_reads_guards_reads_docs_and_metrics_but_not_healthz(store: Store):
    app = create_app(store, api=api(token=TOKEN, auth_reads=True))
    with served(app) as base, httpx.Client(base_url=base, timeout=30) as http:
        for path in ("/api/v1/targets", "/api/v1/series?match[]=up", "/api/v1/query_range?name=x",
                     "/metrics", "/openapi.json", "/docs", "/redoc", "/no/such/path"):
            r = http.get(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"] == 'Bearer realm="tritonwatch"'
            r = http.get(path, headers={"Authorization": f"Bearer {TOKEN}x"})
            assert r.status_code == 401 and "invalid_token" in r.headers["www-authenticate"]
            r = http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code in (200, 404), (path, r.status_code)
        assert http.get("/healthz").status_code == 200


def test_auth_reads_without_a_token_is_a_config_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITONWATCH_API_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"auth_reads needs api\.token"):
        validate_config({"api": {"auth_reads": True}})
    monkeypatch.setenv("TRITONWATCH_API_TOKEN", TOKEN)
    assert validate_config({"api": {"auth_reads": True}}).api.token == TOKEN


def test_a_token_is_never_logged(store: Store, caplog: pytest.LogCaptureFixture):
    caplog.set_level("DEBUG")
    app = create_app(store, api=api(token=TOKEN, auth_reads=True))
    with TestClient(app) as c:
        c.get("/api/v1/series", headers={"Authorization": "Bearer guessed-secret-9876543210"})
        c.post("/api/v1/x", headers={"Authorization": "Bearer guessed-secret-9876543210"})
    assert "refused" in caplog.text
    assert "guessed-secret" not in caplog.text and TOKEN not in caplog.text


def test_refused_requests_neither_forge_nor_flood_the_log(store: Store,
                                                         caplog: pytest.LogCaptureFixture):
    caplog.set_level("DEBUG")
    app = create_app(store, api=api(token=TOKEN))
    with TestClient(app) as c:
        for _ in range(50):
            r = c.post("/api/v1/x%0AERROR%20forged%20line%1B[31m")
            assert r.status_code == 401
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1  # one line a minute per client, the rest counted
    assert "forged line" in lines[0]  # the path is there, escaped
    assert not any(ch in lines[0] for ch in "\n\r\x1b"), lines[0]


# --- 6. a frozen database ---------------------------------------------------------------------


def _server_pids(url: str) -> list[int]:
    """The postmaster of the PostgreSQL at ``url`` and every process it started."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    postmaster = int(Path(row[0], "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a process that just ended
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


@contextmanager
def frozen(url: str) -> Iterator[None]:
    """The whole server stopped (SIGSTOP), postmaster first so it starts nothing new."""
    pids = _server_pids(url)
    stopped = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue  # a backend that ended meanwhile
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.mark.postgres
def test_a_frozen_database_leaves_healthz_and_metrics_answering(postgres_db_url: str):
    # 45 reads on a frozen database took FastAPI's whole thread pool, and /healthz and /metrics
    # timed out behind them.  Connecting waits up to 30 s here, so a read hangs for longer than
    # the bounds below whether it holds a pooled connection or opens one.
    store = open_store(postgres_db_url, timeout_s=30)
    store.migrations.apply()
    catalogue(store, 2, 10)
    app = create_app(store, api=api(read_workers=4, read_queue=8))

    async def scenario(base: str) -> tuple[list[int], float, float, list[float]]:
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            assert (await http.get("/api/v1/series?match[]=up")).status_code == 200
            answers: list[tuple[int, float]] = []

            async def read() -> None:
                t = time.monotonic()
                r = await http.get("/api/v1/series", params={"name": "boom"})
                answers.append((r.status_code, time.monotonic() - t))

            with frozen(postgres_db_url):
                reads = [asyncio.create_task(read()) for _ in range(50)]
                deadline = time.monotonic() + 30
                while len(answers) < 38 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                t = time.monotonic()
                health = await http.get("/healthz", timeout=20)
                health_s = time.monotonic() - t
                assert health.status_code == 200
                t = time.monotonic()
                metrics = await http.get("/metrics", timeout=20)
                metrics_s = time.monotonic() - t
                assert metrics.status_code == 200
                assert "tritonwatch_api_reads_refused_total 38.0" in metrics.text
                refused_early = [s for code, s in answers if code == 503]
            await asyncio.wait_for(asyncio.gather(*reads), 90)
            return [code for code, _ in answers], health_s, metrics_s, refused_early

    with served(app) as base:
        try:
            codes, health_s, metrics_s, refused = asyncio.run(scenario(base))
        finally:
            store.close()
    assert health_s < 10 and metrics_s < 10, (health_s, metrics_s)
    # 4 running and 8 waiting; the other 38 were told "busy" at once, while frozen.
    assert len(refused) == 38 and max(refused) < 10, refused
    # Once the database is back, the 12 admitted reads finish.
    assert codes.count(200) == 12 and codes.count(503) == 38, codes


# --- 9. errors and values ---------------------------------------------------------------------


def test_bad_parameters_are_400_naming_the_parameter(store: Store):
    client = TestClient(create_app(store))
    cases = {
        "start": {"name": "g", "start": "-1e300", "end": "1e300", "step": "1e299"},
        "end": {"name": "g", "start": "0", "end": "nan"},
        "step": {"name": "g", "step": "1e299", "start": "0", "end": "10"},
        "agg": {"name": "g", "agg": "median"},
        "query": {"start": "0"},
    }
    for param, params in cases.items():
        r = client.get("/api/v1/query_range", params=params)
        assert r.status_code == 400, (param, r.text)
        body = r.json()
        assert body["status"] == "error" and body["errorType"] == "bad_data"
        assert f'invalid parameter "{param}"' in body["error"], (param, body)
    r = client.get("/api/v1/query_range", params={"name": "g", "start": "10", "end": "0"})
    assert r.status_code == 400 and "end timestamp must not be before start" in r.text
    r = client.get("/api/v1/query_range", params={"name": "g", "start": "2023-11-14T22:13:20Z",
                                                   "end": "2023-11-14T23:13:20+00:00",
                                                   "step": "1m"})
    assert r.status_code == 200 and r.json()["data"]["result"] == []


def test_a_database_that_is_down_answers_503(caplog: pytest.LogCaptureFixture):
    # A real PostgreSQL URL with nobody listening: every read fails to connect.
    url = f"postgresql://tw:pw-s3cret@127.0.0.1:{free_port()}/tw"
    store = open_store(url, timeout_s=2)
    client = TestClient(create_app(store, targets={"a"}))
    for path in ("/api/v1/targets", "/api/v1/series?match[]=up",
                 f"/api/v1/query_range?name=g&start={T0}&end={T0 + 60}"):
        r = client.get(path)
        assert r.status_code == 503, (path, r.text)
        assert r.json()["error"] == "the store (database) is unavailable; retry later"
        assert r.headers["retry-after"] == "5"
        assert "s3cret" not in r.text and "127.0.0.1" not in r.text
    assert "pw-s3cret" not in caplog.text
    assert client.get("/healthz").status_code == 200


def test_infinities_and_nan_round_trip_as_prometheus_strings(store: Store):
    exact = [0.1 + 0.2, 1e-7, 5e-05, 1e21, 1.5e16, -2.5, 1e300, 3.0]
    store.write("t", T0, [Sample("v", (("k", "+inf"),), math.inf),
                          Sample("v", (("k", "-inf"),), -math.inf),
                          Sample("v", (("k", "nan"),), math.inf)]
                + [Sample("v", (("k", f"x{i}"),), x) for i, x in enumerate(exact)])
    store.write("t", T0 + 1, [Sample("v", (("k", "nan"),), -math.inf)])  # avg: inf - inf
    store.flush()
    client = TestClient(create_app(store))
    r = client.get("/api/v1/query_range", params={"name": "v", "start": T0, "end": T0 + 10,
                                                   "step": "60"})
    assert r.status_code == 200, r.text
    values = {s["metric"]["k"]: s["values"][0][1] for s in r.json()["data"]["result"]}
    assert (values["+inf"], values["-inf"], values["nan"]) == ("+Inf", "-Inf", "NaN")
    assert [float(values[f"x{i}"]) for i in range(len(exact))] == exact
    # Go's strconv text, as Prometheus writes it.
    assert [values[f"x{i}"] for i in range(len(exact))] == [
        "0.30000000000000004", "1e-07", "0.00005", "1e+21", "15000000000000000", "-2.5",
        "1e+300", "3"]


# --- 12. removed targets ----------------------------------------------------------------------


def test_targets_lists_only_configured_targets(store: Store):
    for name in ("kept", "removed"):
        store.write_health(TargetHealth(name, "metrics", T0, True, 0.1, 3, None))
    with TestClient(create_app(store, targets={"kept"})) as c:
        assert [h["target"] for h in c.get("/api/v1/targets").json()["data"]] == ["kept"]
    with TestClient(create_app(store)) as c:  # no configuration: the whole store
        assert [h["target"] for h in c.get("/api/v1/targets").json()["data"]] == [
            "kept", "removed"]


def test_serve_lists_only_the_targets_of_its_config(tmp_path: Path, fake_targets: FakeTargets):
    db = tmp_path / "tw.db"
    with open_store(f"sqlite:///{db}") as store:
        store.migrations.apply()
        store.write_health(TargetHealth("removed", "metrics", time.time() - 1122, True, 0.1, 3,
                                        None))
    config = tmp_path / "tw.yaml"
    config.write_text(
        "targets:\n"
        f"  - {{name: kept, metrics_url: '{fake_targets.base}/ok'}}\n"
        "scrape: {interval: 1s, timeout: 1s}\n"
        f"store: {{url: 'sqlite:///{db}', flush_interval: 1s}}\n"
        "nvml: {enabled: false}\n"
    )
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tritonwatch.cli", "serve", "--config",
                             str(config), "--listen", f"127.0.0.1:{port}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        seen: list[str] = []
        while time.monotonic() < deadline:
            try:
                seen = [h["target"] for h in
                        httpx.get(f"http://127.0.0.1:{port}/api/v1/targets",
                                  timeout=5).json()["data"]]
            except httpx.HTTPError:
                seen = []
            if seen:
                break
            time.sleep(0.3)
        assert seen == ["kept"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


def test_target_down_of_a_removed_target_resolves(store: Store):
    def job(targets: list[str], now: float) -> AlertJob:
        config = validate_config({"targets": [
            {"name": n, "metrics_url": f"http://{n}:8002/metrics"} for n in targets]})
        return AlertJob.from_config(config, store, clock=lambda: now)

    for t in range(0, 600, 15):  # both up for 10 min, then "gone" stops answering
        store.write("kept", T0 + t, [Sample("up", (), 1.0)])
        store.write("gone", T0 + t, [Sample("up", (), 1.0 if t < 300 else 0.0)])
    store.flush()
    before = job(["kept", "gone"], T0 + 600)
    for t in (420, 480, 540, 600):
        before.engine.evaluate(T0 + t)
    [firing] = [s for s in before.engine.states() if s.status == "firing"]
    assert dict(firing.labels)["target"] == "gone"
    # "gone" is taken out of the config and the process restarted: its alert resolves once
    # keep_firing_for (1 min) has passed, and no TargetDown fires for it again.
    after = job(["kept"], T0 + 615)
    events = []
    for t in (615, 630, 690):
        events += after.engine.evaluate(T0 + t)
    assert [(e.status, dict(e.labels)["target"]) for e in events] == [("resolved", "gone")]
    assert all(s.status == "resolved" for s in after.engine.states())
