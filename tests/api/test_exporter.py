"""/metrics for the user's Prometheus (api/exporter.py): derived SLIs, SLO status, ALERTS,
build info and process metrics from memory, a cap on exported series, and a clean
``promtool check metrics``."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures_http import FakeTargets
from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.rules import SloBurnRule, rules_from_file
from tritonwatch.alerts.status import SloBoard
from tritonwatch.api.app import create_app
from tritonwatch.api.exporter import Live, LiveCollector, label_name, metric_name
from tritonwatch.collector.jobs import Collector
from tritonwatch.schemas.config import ApiConfig, Config, TargetConfig
from tritonwatch.schemas.latest import LatestValues, SampleWindow
from tritonwatch.schemas.rules import validate_rules
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store, open_store

T0 = 1_700_000_000.0

RULES = """
version: 1
slos:
  - name: batcher-availability
    objective: 99
    sli: {kind: availability, model: batcher, by: [model]}
alerts:
  - name: FillRateLow
    series: sli:batch_fill_rate
    agg: last
    window: 5m
    op: "<"
    threshold: 0.9
    labels: {severity: ticket}
    annotations: {summary: "fill rate {value}"}
defaults: {enabled: false}
"""


def fill_store(store: Store) -> None:
    """Scrapes of a batcher with 10 % failures and a 50 % fill rate, 5 minutes apart (the
    SLO's 28-day period reads 5-minute buckets)."""
    model = make_labels({"model": "batcher", "version": "1"})
    for i, ts in enumerate(T0 - 300.0 * k for k in range(6, -1, -1)):
        store.write("rig", ts, [
            Sample("nv_inference_request_success", model, 90.0 * i),
            Sample("nv_inference_request_failure", make_labels({**dict(model),
                                                                "reason": "BACKEND"}), 10.0 * i),
            Sample("sli:batch_fill_rate", model, 0.5),
        ])
    store.flush()


def metrics_of(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def live_app(store: Store, **api: int) -> tuple[TestClient, Live]:
    rules = rules_from_file(validate_rules(yaml.safe_load(RULES)))
    engine = Engine(rules, store, eval_interval=30, clock=lambda: T0)
    engine.evaluate(T0)
    board = SloBoard([r.slo for r in rules if isinstance(r, SloBurnRule)])
    assert board.refresh(store, T0)
    latest = LatestValues()
    latest.put("rig", "metrics", T0, [
        Sample("sli:batch_fill_rate", make_labels({"model": "batcher", "version": "1"}), 0.5),
        Sample("sli:kv_cache_utilization", make_labels({"model": "llm", "version": "1"}), 0.3),
        Sample("nv_inference_count", make_labels({"model": "batcher"}), 5.0),  # raw: not kept
    ])
    latest.put("rig", "probe:p", T0, [
        Sample("probe:ttft_seconds", make_labels({"probe": "p", "model": "llm"}), 0.04)])
    live = Live(latest=latest, engine=engine, slos=board)
    app = create_app(store, api=ApiConfig.model_validate(api), live=live)
    return TestClient(app), live


def test_metrics_exports_slis_slo_status_alerts_build_info_and_process(store: Store):
    fill_store(store)
    client, _ = live_app(store)
    r = client.get("/metrics")
    assert r.status_code == 200
    m = metrics_of(r.text)
    assert m["tritonwatch_sli_batch_fill_rate"] == [
        ({"target": "rig", "model": "batcher", "version": "1"}, 0.5)]
    assert m["tritonwatch_sli_kv_cache_utilization"][0][1] == 0.3
    assert m["tritonwatch_sli_probe_ttft_seconds"] == [
        ({"target": "rig", "probe": "p", "model": "llm"}, 0.04)]
    assert "tritonwatch_nv_inference_count" not in m  # raw series stay Triton's to export
    # SLO status: 10 % bad against a 1 % budget: 10x burn, budget overspent 9x.
    slo = {"slo": "batcher-availability", "model": "batcher"}
    assert m["tritonwatch_slo_objective_ratio"] == [(slo, 0.99)]
    [(_, remaining)] = m["tritonwatch_slo_error_budget_remaining_ratio"]
    assert remaining == pytest.approx(1 - 0.1 / 0.01)
    [(labels, sli)] = m["tritonwatch_slo_sli_ratio"]
    assert labels == slo and sli == pytest.approx(0.9)
    burns = {lbl["window"]: v for lbl, v in m["tritonwatch_slo_burn_rate"]}
    assert burns["1h"] == pytest.approx(10.0) and {"5m", "6h", "3d"} <= set(burns)
    # 10x: above page-6h's 5.6x (28 d), below page-1h's 13.44x.
    tiers = {lbl["tier"]: v for lbl, v in m["tritonwatch_slo_tier_firing"]}
    assert tiers == {"page-1h": 0.0, "page-6h": 1.0, "ticket-1d": 1.0, "ticket-3d": 1.0}
    assert m["tritonwatch_slo_error_budget_exhaustion_seconds"] == [(slo, 0.0)]
    # ALERTS as Prometheus writes them: the SLO page and the threshold rule, both firing.
    alerts = {(lbl["alertname"], lbl["alertstate"]) for lbl, v in m["ALERTS"] if v == 1}
    assert ("FillRateLow", "firing") in alerts and ("SLOBurnRate", "firing") in alerts
    fill = next(lbl for lbl, _ in m["ALERTS"] if lbl["alertname"] == "FillRateLow")
    assert fill["model"] == "batcher" and fill["severity"] == "ticket"
    assert {v for _, v in m["ALERTS_FOR_STATE"]} == {T0}
    [(info, one)] = m["tritonwatch_build_info"]
    assert one == 1 and info["version"] and info["python_version"]
    assert "process_cpu_seconds_total" in m and "python_info" in m
    assert m["tritonwatch_exported_series"][0][1] > 10
    # Streamed, the live families (alerts and SLOs included) are prometheus_client's text.
    exporter = client.app.state.exporter  # type: ignore[attr-defined]
    assert r.content.startswith(generate_latest(exporter))


def test_promtool_check_metrics_is_clean(store: Store):
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is needed"
    fill_store(store)
    client, live = live_app(store)
    assert live.latest is not None
    # Awkward stored labels: a clash with `target`, a dash, a leading digit, a reserved name.
    live.latest.put("odd", "metrics", T0, [Sample("sli:odd", make_labels(
        {"target": "x", "a-b": "1", "9lives": "2", "__name__": "n", "quote": 'a"b\\c\n'}), 1.0)])
    text = client.get("/metrics").content
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == b"" and done.stderr == b"", done.stdout + done.stderr
    odd = metrics_of(text.decode())["tritonwatch_sli_odd"][0][0]
    assert odd == {"target": "odd", "exported_target": "x", "a_b": "1", "_9lives": "2",
                   "exported__name__": "n", "quote": 'a"b\\c\n'}


def test_exported_series_are_capped_and_the_drops_counted(store: Store):
    fill_store(store)
    client, live = live_app(store, max_exported_series=5)
    assert live.latest is not None
    live.latest.put("big", "metrics", T0, [
        Sample("sli:request_rate", make_labels({"model": f"m{i:03}"}), float(i))
        for i in range(100)])
    first = metrics_of(client.get("/metrics").text)
    assert first["tritonwatch_exported_series"] == [({}, 5.0)]
    dropped = first["tritonwatch_exported_series_dropped_total"][0][1]
    assert dropped > 100
    second = metrics_of(client.get("/metrics").text)
    assert second["tritonwatch_exported_series_dropped_total"][0][1] == 2 * dropped
    # Alerts go first: the cap never hides a firing alert behind SLIs.
    assert any(lbl.get("alertstate") == "firing" for lbl, _ in second["ALERTS"])


_LABEL_VALUES = st.text(st.sampled_from('ab"\\\n{}=,é😀 '), max_size=6)
_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 1e-300, 1234567.0, 12345678.5, 1e22]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    series=st.lists(st.tuples(st.sampled_from(["sli:a", "sli:a.b", "sli:a_b", "probe:t",
                                               "triton_model_ready", "nv_raw"]),
                              st.sampled_from(["model", "a.b", "a_b", "target", "__x"]),
                              _LABEL_VALUES, _VALUES),
                    max_size=40),
    targets=st.integers(1, 3),
    lines=st.integers(1, 5),
    cap=st.integers(1, 200),
)
def test_streamed_metrics_equal_prometheus_clients_text_of_the_whole_families(
    series: list[tuple[str, str, str, float]], targets: int, lines: int, cap: int,
) -> None:
    """Differential: /metrics streams the live families ``lines`` series at a time; the
    pieces put together are prometheus_client's ``generate_latest`` of the same families
    built whole, byte for byte, whatever the labels (quotes, backslashes, newlines, emoji,
    names that export alike), values (NaN, ±Inf, -0.0, exponents), cap and piece size."""
    latest = LatestValues()
    for t in range(targets):
        samples = [Sample(name, make_labels({label: value}), v)
                   for name, label, value, v in series[t::targets]]
        # A scrape's window (names filtered when read) and a probe's list, as the collector
        # keeps them.
        window = SampleWindow([s.name for s in samples], [s.labels for s in samples],
                              np.array([s.value for s in samples], dtype=np.float64))
        latest.put_window(f"t{t}", "metrics", T0, window)
        latest.put(f"t{t}", "probe:p", T0, samples[:2])
    collector = LiveCollector(Live(latest=latest), max_series=cap,
                              registry=CollectorRegistry())
    whole = generate_latest(collector)
    pieces = list(collector.chunks(lines))
    assert b"".join(pieces) == whole
    for piece in pieces:
        assert sum(not line.startswith(b"#") for line in piece.splitlines()) <= max(lines, 1)
    # And the text holds what was put: every exported series once, the first of a clash.
    families = {f.name: f for f in text_string_to_metric_families(whole.decode())}
    shown = [(s.name, s.labels, s.value) for f in families.values() for s in f.samples
             if s.name != "tritonwatch_exported_series"]
    assert len({(n, tuple(sorted(lb.items()))) for n, lb, _ in shown}) == len(shown)
    assert families["tritonwatch_exported_series"].samples[0].value == len(shown) <= cap
    assert all(n.startswith(("tritonwatch_sli_", "tritonwatch_triton_")) for n, _, _ in shown)


def test_series_that_export_alike_are_exported_once_and_each_takes_a_place_under_the_cap(
) -> None:
    latest = LatestValues()
    latest.put("t", "metrics", T0, [Sample("sli:x", make_labels({"a.b": "1"}), 1.0),
                                    Sample("sli:x", make_labels({"a_b": "1"}), 2.0),
                                    Sample("sli:y", make_labels({}), 3.0),
                                    Sample("sli:z", make_labels({}), 4.0)])
    registry = CollectorRegistry()
    collector = LiveCollector(Live(latest=latest), max_series=3, registry=registry)
    m = metrics_of(b"".join(collector.chunks()).decode())
    assert m["tritonwatch_sli_x"] == [({"target": "t", "a_b": "1"}, 1.0)]  # the first counts
    assert m["tritonwatch_sli_y"] == [({"target": "t"}, 3.0)]
    assert "tritonwatch_sli_z" not in m
    assert m["tritonwatch_exported_series"] == [({}, 2.0)]
    assert metrics_of(generate_latest(registry).decode())[
        "tritonwatch_exported_series_dropped_total"] == [({}, 1.0)]


def test_metrics_never_reads_the_database(tmp_path: Path):
    store = open_store(f"sqlite:///{tmp_path}/tw.db")
    store.migrations.apply()
    fill_store(store)
    client, _ = live_app(store)
    store.close()
    (tmp_path / "tw.db").unlink()
    r = client.get("/metrics")
    assert r.status_code == 200
    assert 'tritonwatch_sli_batch_fill_rate{model="batcher",target="rig",version="1"} 0.5' \
        in r.text
    assert "tritonwatch_slo_error_budget_remaining_ratio" in r.text


def test_names_and_labels_are_legal() -> None:
    assert metric_name("sli:batch_fill_rate") == "tritonwatch_sli_batch_fill_rate"
    assert metric_name("probe:ttft_seconds") == "tritonwatch_sli_probe_ttft_seconds"
    assert metric_name("triton_model_ready") == "tritonwatch_triton_model_ready"
    assert metric_name("sli:a.b-c") == "tritonwatch_sli_a_b_c"
    assert label_name("gpu-uuid") == "gpu_uuid"
    assert label_name("0x") == "_0x"
    assert label_name("__meta") == "exported__meta"


def test_the_collector_keeps_the_latest_slis_and_forgets_a_target_that_went_down(
    store: Store, fake_targets: FakeTargets, down_url: str
):
    config = Config(targets=(TargetConfig(name="t", metrics_url=fake_targets.url("/ok"),
                                          max_batch_size={"m": 4}, labels={"dc": "eu"}),),
                    nvml={"enabled": False})
    now = [T0]
    collector = Collector(config, store, clock=lambda: now[0])

    async def run() -> None:
        await collector.scrape("t")
        now[0] += 15
        await collector.scrape("t")
        await collector.close()

    asyncio.run(run())
    values = {(v.name, dict(v.labels).get("model")): v for v in collector.latest.values()}
    # OK_BODY never changes: rates of 0 and the SLIs of a idle model, with the target's
    # configured labels.
    assert set(values) == {("sli:inference_rate", "m"), ("sli:execution_rate", "m")}
    assert all(v.target == "t" and dict(v.labels)["dc"] == "eu" for v in values.values())
    assert all(name.startswith(("sli:", "probe:", "triton_")) for name, _ in values)
    state = collector.targets["t"]
    object.__setattr__(state.config, "metrics_url", down_url)

    async def down() -> None:
        await collector.scrape("t")
        await collector.close()

    asyncio.run(down())
    assert collector.latest.values() == []
