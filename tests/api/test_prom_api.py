"""The Prometheus-shaped read API (api/prom.py, api/promql.py, api/evaluate.py) through the
real HTTP stack (uvicorn), and its selectors held against a real Prometheus's answers for the
same series."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.fixtures_http import serve_fake_targets
from tests.prometheus_server import free_port, run_prometheus, scrape_config
from tritonwatch.api.app import create_app
from tritonwatch.api.promql import parse_selector
from tritonwatch.schemas.config import ApiConfig
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store

T0 = 1_700_000_000.0
TOKEN = "read-token-0123456789abcdef"

#: Series of two targets: (target, name, labels).
SERIES: list[tuple[str, str, dict[str, str]]] = [
    ("rig", "sli:request_rate", {"model": "batcher", "version": "1"}),
    ("rig", "sli:request_rate", {"model": "fake_llm", "version": "1"}),
    ("rig", "sli:batch_fill_rate", {"model": "batcher", "version": "1"}),
    ("rig", "nv_inference_request_failure", {"model": "batcher", "version": "1",
                                             "reason": "BACKEND"}),
    ("rig", "nv_inference_request_failure", {"model": "batcher", "version": "1",
                                             "reason": "REJECTED"}),
    ("edge", "sli:request_rate", {"model": "batcher", "version": "2"}),
    ("edge", "sli:request_rate", {"model": "Batcher-canary", "version": "1"}),
    ("edge", "sli:kv_cache_utilization", {"model": "fake_llm"}),
    ("edge", "up", {}),
]

#: Selectors compared with Prometheus: every operator, anchoring, alternation, classes,
#: flags, absent labels, regexes on the name and the target.
SELECTORS = [
    'sli:request_rate',
    'sli:request_rate{model="batcher"}',
    'sli:request_rate{model!="batcher"}',
    'sli:request_rate{model=~"batch"}',
    'sli:request_rate{model=~"batch.*"}',
    'sli:request_rate{model=~"(?i)batch.*"}',
    'sli:request_rate{model=~"batcher|fake_llm"}',
    'sli:request_rate{model!~"batch.*"}',
    'sli:request_rate{model=~"[A-Z].*-canary"}',
    '{__name__=~"sli:.*"}',
    '{__name__=~"sli:.*_rate", target="edge"}',
    '{__name__=~".+", version=""}',
    '{__name__=~".+", reason!=""}',
    '{__name__!~"sli:.*", __name__=~".+"}',
    '{target=~"r.g"}',
    '{model=~"fake_llm", version!="2"}',
    '{model="batcher", version=~"1|2", reason!~"REJ.*"}',
    "sli:request_rate{model=~'b\\\\w+'}",
    'sli:request_rate{model=~`b\\w+`}',
    'up',
]


def exposition() -> str:
    lines = []
    for target, name, labels in SERIES:
        text = ",".join(f'{k}="{v}"' for k, v in {"target": target, **labels}.items())
        lines.append(f"{name}{{{text}}} 1")
    return "\n".join(lines) + "\n"


def fill(store: Store) -> None:
    for i in range(3):
        for target, name, labels in SERIES:
            store.write(target, T0 + 60 * i, [Sample(name, make_labels(labels), float(i))])
    store.flush()


@contextmanager
def served(app: FastAPI) -> Iterator[httpx.Client]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(10)


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success"
    return body["data"]


def bad(r: httpx.Response, param: str, code: int = 400) -> str:
    assert r.status_code == code, r.text
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "bad_data"
    assert f'"{param}"' in body["error"], body["error"]
    return str(body["error"])


def as_set(series: list[dict[str, str]]) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted((k, v) for k, v in s.items() if k not in ("job", "instance")))
            for s in series}


def test_selectors_select_what_prometheus_selects(store: Store, tmp_path: Path):
    fill(store)
    with serve_fake_targets(exposition()) as fake, run_prometheus(scrape_config([
            {"job_name": "same", "targets": [fake.url("/ok").split("/")[2]],
             "metrics_path": "/ok", "honor_labels": True}]), tmp_path / "prom") as prom, \
            served(create_app(store)) as api:
        prom.wait_for(lambda: len(prom.api("series", **{"match[]": '{__name__=~".+"}'}))
                      >= len(SERIES), what="the first scrape")
        for selector in SELECTORS:
            # Less Prometheus's own series of the scrape (up, scrape_*: no target label).
            want = {s for s in as_set(prom.api("series", **{"match[]": selector}))
                    if "target" in dict(s)}
            got = as_set(ok(api.get("/api/v1/series", params={"match[]": selector})))
            assert got == want, selector
            assert want or selector == 'sli:request_rate{model=~"batch"}', selector
        # Several match[] are a union, as in Prometheus.
        both = {"match[]": ["sli:batch_fill_rate", '{__name__="up"}']}
        assert as_set(ok(api.get("/api/v1/series", params=both))) == {
            s for s in as_set(prom.api("series", **both)) if "target" in dict(s)}
        # Selectors Prometheus refuses, we refuse (400 naming match[]).
        for refused in ('{}', '{model=~".*"}', '{model=~"("}', 'x{model=}', 'x{', 'sum(x)'):
            assert prom.http.get("/api/v1/series",
                                 params={"match[]": refused}).status_code == 400, refused
            bad(api.get("/api/v1/series", params={"match[]": refused}), "match[]")


def test_series_start_end_labels_values_and_buildinfo(store: Store):
    fill(store)
    store.write("old", T0 - 86400, [Sample("sli:request_rate", make_labels({"model": "x"}), 1)])
    store.flush()
    with served(create_app(store)) as api:
        everything = ok(api.get("/api/v1/series", params={"match[]": "sli:request_rate"}))
        assert len(everything) == 5
        recent = ok(api.get("/api/v1/series", params={"match[]": "sli:request_rate",
                                                      "start": T0 - 60, "end": T0 + 600}))
        assert {s["target"] for s in recent} == {"rig", "edge"} and len(recent) == 4
        old = ok(api.get("/api/v1/series", params={"match[]": "sli:request_rate",
                                                   "end": "2023-11-13T22:13:20Z"}))
        assert old == [{"__name__": "sli:request_rate", "target": "old", "model": "x"}]
        names = ok(api.get("/api/v1/labels"))
        assert names == ["__name__", "model", "reason", "target", "version"]
        assert ok(api.get("/api/v1/labels", params={"match[]": "up"})) == ["__name__", "target"]
        assert ok(api.get("/api/v1/label/model/values",
                          params={"match[]": '{target="edge"}'})) == [
            "Batcher-canary", "batcher", "fake_llm"]
        assert "sli:batch_fill_rate" in ok(api.get("/api/v1/label/__name__/values"))
        assert ok(api.get("/api/v1/label/target/values")) == ["edge", "old", "rig"]
        r = api.get("/api/v1/label/model/values", params={"limit": 2})
        assert ok(r) == ["Batcher-canary", "batcher"]
        assert r.json()["warnings"] == ["results truncated due to limit 2 (api.max_limit caps it)"]
        info = ok(api.get("/api/v1/status/buildinfo"))
        assert info["version"] and set(info) >= {"version", "revision", "goVersion"}


def test_series_pages_say_so_in_warnings_and_link_the_next(store: Store):
    fill(store)
    with served(create_app(store)) as api:
        seen: list[dict[str, str]] = []
        url: str | None = "/api/v1/series?match[]=%7B__name__%3D~%22.%2B%22%7D&limit=4"
        while url is not None:
            r = api.get(url)
            seen += ok(r)
            link = r.headers.get("link")
            if link:
                assert r.json()["warnings"] == [
                    "results truncated due to limit 4 (api.max_limit caps it)"]
                assert "warning" not in r.headers
                url = link.split(";")[0].strip("<>")
            else:
                assert "warnings" not in r.json()
                url = None
        assert len(seen) == len(SERIES) == len({tuple(sorted(s.items())) for s in seen})


def test_query_range_functions_and_matchers(store: Store):
    # A counter: 0, 10, 20, reset to 5, 15 (every 60 s); a gauge of the other model.
    counter = [0.0, 10.0, 20.0, 5.0, 15.0]
    for i, v in enumerate(counter):
        store.write("rig", T0 + 60 * i, [
            Sample("nv_inference_count", make_labels({"model": "batcher"}), v),
            Sample("nv_inference_count", make_labels({"model": "llm"}), 100.0 + i),
            Sample("sli:kv_cache_utilization", make_labels({"model": "llm"}), 0.1 * (i + 1)),
        ])
    store.flush()
    with served(create_app(store)) as api:
        def query(q: str, **extra: Any) -> list[dict[str, Any]]:
            params = {"query": q, "start": T0 + 240, "end": T0 + 240, "step": "1m", **extra}
            data = ok(api.get("/api/v1/query_range", params=params))
            assert data["resultType"] == "matrix"
            return list(data["result"])

        [inc] = query('increase(nv_inference_count{model="batcher"}[5m])')
        assert inc["metric"] == {"target": "rig", "model": "batcher"}  # no __name__
        assert inc["values"] == [[T0 + 240, "35"]]  # 10 + 10 + 5 (reset) + 10
        [rate] = query('rate(nv_inference_count{model="batcher"}[5m])')
        assert float(rate["values"][0][1]) == pytest.approx(35 / 240)  # first to last sample
        [short] = query('increase(nv_inference_count{model="batcher"}[2m])')
        assert short["values"] == [[T0 + 240, "10"]]  # samples at +180 (5) and +240 (15)
        [avg] = query('avg_over_time(sli:kv_cache_utilization[3m])')
        assert float(avg["values"][0][1]) == pytest.approx((0.3 + 0.4 + 0.5) / 3)
        assert query('max_over_time(sli:kv_cache_utilization[10m])')[0]["values"][0][1] == "0.5"
        assert query('min_over_time(sli:kv_cache_utilization[10m])')[0]["values"][0][1] == "0.1"
        assert [s["metric"]["model"] for s in query('nv_inference_count{model!="batcher"}')] \
            == ["llm"]
        assert [s["metric"]["model"] for s in query('nv_inference_count{model=~"b.*"}')] \
            == ["batcher"]
        assert [s["metric"]["model"] for s in query('nv_inference_count{model!~"b.*"}')] \
            == ["llm"]
        # A plain selector: the latest sample within 5 minutes, at each step.
        [latest] = query('nv_inference_count{model="batcher"}', start=T0, end=T0 + 600)
        assert latest["metric"]["__name__"] == "nv_inference_count"
        assert [v for _, v in latest["values"]] == ["0", "10", "20", "5", "15", "15", "15",
                                                    "15", "15"]
        # Durations for step (1m30s), and an RFC 3339 start.
        steps = query("sli:kv_cache_utilization", start="2023-11-14T22:13:20Z",
                      end=T0 + 270, step="1m30s")[0]["values"]
        assert [t for t, _ in steps] == [T0, T0 + 90, T0 + 180, T0 + 270]
        # The older name= form answers in the same envelope.
        legacy = ok(api.get("/api/v1/query_range", params={
            "name": "sli:kv_cache_utilization", "start": T0, "end": T0 + 300, "step": 300}))
        assert legacy["result"][0]["metric"]["__name__"] == "sli:kv_cache_utilization"


def test_bad_queries_and_steps_are_400_naming_the_parameter(store: Store):
    with served(create_app(store)) as api:
        def q(query: str, **extra: Any) -> httpx.Response:
            return api.get("/api/v1/query_range", params={"query": query, "start": T0,
                                                          "end": T0 + 60, **extra})
        assert "unsupported function or aggregation 'sum'" in bad(q("sum(x)"), "query")
        assert "histogram_quantile" in bad(q("histogram_quantile(0.9, x)"), "query")
        assert "binary operators" in bad(q("x / y"), "query")
        assert "offset" in bad(q("x offset 5m"), "query")
        assert "subqueries" in bad(q("rate(x[5m:1m])"), "query")
        assert "range selector outside a function" in bad(q("x[5m]"), "query")
        assert "invalid regex" in bad(q('x{a=~"(a"}'), "query")
        assert "non-empty matcher" in bad(q('{a!="b"}'), "query")
        bad(q('x{a="b}'), "query")
        bad(q("x{a~\"b\"}"), "query")
        bad(q('x{a="\\z"}'), "query")
        assert "longer than" in bad(q('x{a=~"' + "a" * 2001 + '"}'), "query")
        assert "duration" in bad(q("x", step="1parsec"), "step")
        assert "zero or negative" in bad(q("x", step="0"), "step")
        bad(q("x", step="-1m"), "step")
        bad(q("x", start="yesterday"), "start")
        bad(q("x", start=T0 + 60, end=T0), "end")
        assert "11,000 points" in q("x", end=T0 + 86400, step="1s").json()["error"]
        bad(api.get("/api/v1/query_range"), "query")
        bad(api.get("/api/v1/series"), "match[]")
        bad(api.get("/api/v1/series", params={"match[]": "up", "limit": 0}), "limit")
        bad(api.get("/api/v1/series", params={"match[]": "up", "after": "nope"}), "after")
        bad(api.get("/api/v1/series", params={"match[]": "up", "start": "x"}), "start")


def test_limits_on_series_and_samples_are_422(store: Store):
    for i in range(30):
        store.write("rig", T0, [Sample("g", make_labels({"i": f"{i:02}"}), 1.0)])
    for k in range(100):
        store.write("rig", T0 + k, [Sample("h", (), float(k))])
    store.flush()
    app = create_app(store, api=ApiConfig(max_series=10, max_samples=50))
    with served(app) as api:
        r = api.get("/api/v1/query_range", params={"query": 'g{i=~"0.*|1.*|2.*"}',
                                                   "start": T0, "end": T0 + 60})
        assert r.status_code == 422 and "more than 10 series" in r.json()["error"]
        assert len(ok(api.get("/api/v1/query_range", params={
            "query": 'g{i=~"0.*"}', "start": T0, "end": T0 + 60}))["result"]) == 10
        r = api.get("/api/v1/query_range", params={"query": "h", "start": T0,
                                                   "end": T0 + 100})
        assert r.status_code == 422 and "more than 50 samples" in r.json()["error"]


def test_reads_need_the_token_when_asked(store: Store):
    app = create_app(store, api=ApiConfig(token=TOKEN, read_token_required=True))
    with served(app) as api:
        for path in ("/api/v1/series?match[]=up", "/api/v1/labels", "/api/v1/label/x/values",
                     "/api/v1/status/buildinfo", "/api/v1/query_range?query=up", "/metrics"):
            r = api.get(path)
            assert r.status_code == 401 and r.json()["errorType"] == "unauthorized", path
            assert api.get(path, headers={"Authorization": "Bearer wrong-token-0123456789"}
                           ).status_code == 401
            assert api.get(path, headers={"Authorization": f"Bearer {TOKEN}"}
                           ).status_code == 200, path


def test_regex_cost_is_bounded() -> None:
    # Catastrophic backtracking for a backtracking engine; RE2 is linear.
    sel = parse_selector('x{a=~"(a+)+b"}')
    started = time.monotonic()
    assert not sel.matches({"__name__": "x", "a": "a" * 100_000 + "c"})
    # A backtracking engine would not return in hours; the margin holds on a loaded machine.
    assert time.monotonic() - started < 60.0
