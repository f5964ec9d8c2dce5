"""One Streamlit ``AppTest`` per page, on stores filled by the real collector from the rig
(``rig_store``), a synthetic week (``week_store``, SLO page) and an empty store, asserting on
the values the pages show against what the store and the alert layer hold."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboard.fill import XSS_ANNOTATION, XSS_MODEL
from tritonwatch.alerts.slo import slo_status
from tritonwatch.dashboard.loaders import CONFIG_ENV, step_for
from tritonwatch.schemas.rules import load_rules_file
from tritonwatch.store import Query, StoreError, open_store
from tritonwatch.store.alerts import AlertStore

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "streamlit_app.py")

pytestmark = pytest.mark.triton


def run_page(monkeypatch: pytest.MonkeyPatch, config: Path, page: str | None = None,
             **sidebar: str) -> AppTest:
    monkeypatch.setenv(CONFIG_ENV, str(config))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if page is not None:
        at.switch_page(f"app_pages/{page}.py")
    for key, value in sidebar.items():
        at.sidebar.selectbox(key=f"sb_{key}").set_value(value)
    if page is not None or sidebar:
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def frame(at: AppTest, column: str) -> pd.DataFrame:
    """The (first) table showing ``column``."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with column {column!r}: "
                         f"{[list(d.value.columns) for d in at.dataframe]}")


def texts(at: AppTest) -> list[str]:
    return [e.value for kind in ("text", "caption", "info", "success", "warning", "error",
                                 "markdown") for e in getattr(at, kind)]


def metric(at: AppTest, label: str) -> str:
    return next(str(m.value) for m in at.metric if m.label == label)


def stored_mean(url: str, name: str, match: dict[str, str], start: float,
                end: float) -> float:
    with open_store(url, read_only=True) as store:
        cols = store.read(Query(name, start=start, end=end, step=end - start, agg="avg",
                                match=match))
    sums, counts = cols.finite_sums()
    return float(np.sum(sums / counts))


def test_fleet_page_shows_targets_models_slos_and_alerts(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config)
    health = frame(at, "last error")
    gone = health[health["target"] == "gone"].iloc[0]
    assert gone["status"] == "DOWN" and "ConnectError" in gone["last error"]
    assert set(health[health["target"] == "rig"]["status"]) == {"up"}

    models = frame(at, "req/s").set_index(["target", "model"])
    assert {("rig", "batcher"), ("rig", "fake_llm"), ("edge", XSS_MODEL)} <= set(models.index)
    # The values shown are the stored SLIs over the window (the last 15 min).
    now = time.time()
    for column, name, scale in (("fill %", "sli:batch_fill_rate", 100),
                                ("req/s", "sli:request_rate", 1)):
        shown = models.loc[("rig", "batcher"), column]
        expected = stored_mean(rig_store.url, name, {"model": "batcher"}, now - 900, now) * scale
        assert shown == pytest.approx(expected, rel=0.02), column
    assert 5 < models.loc[("rig", "batcher"), "fill %"] <= 100
    kv = models.loc[("rig", "fake_llm"), "KV cache %"]
    assert 20 < kv < 95
    assert models.loc[("rig", "fake_llm"), "TTFT p95 ms"] > 100  # the slow act: 150 ms
    assert models.loc[("rig", "batcher"), "details"] == "/model?target=rig&model=batcher"
    # No week-old data: no change columns (rather than columns of blanks).
    assert not [c for c in models.columns if c.endswith("vs week ago")]

    # The SLO tile is alerts.slo's status of the rules file's SLO.
    spec = load_rules_file(rig_store.config.parent / "rules.yaml").slos[0]
    with open_store(rig_store.url, read_only=True) as store:
        status = slo_status(store, spec, time.time())
    assert status.compliance is not None
    assert metric(at, "SLI") == f"{status.compliance * 100:.3f} %"
    active = frame(at, "summary")
    assert {"SLOBurnRate", "TargetDown"} <= set(active["alert"])


def test_model_page_breakdown_batching_probes_markers_and_why(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config, "model", model="batcher", range="15 min")
    shown = texts(at)
    assert "model: batcher    target: rig    version: all" in shown
    assert any("max_batch_size = 16" in t for t in shown)
    assert any("preferred sizes 4, 8" in t for t in shown)
    mean = next(t for t in shown if t.startswith("Mean over the range:"))
    for part in ("queue", "compute input", "compute infer", "compute output"):
        assert f"{part} " in mean

    at = run_page(monkeypatch, rig_store.config, "model", model="fake_llm", range="15 min")
    markers = frame(at, "what")
    restart = rig_store.info["restart_at"]
    reloads = markers[markers["what"] == "reload"]
    assert len(reloads) == 1
    # The reset falls in the bucket of the first scrape after the restart.
    stamp = pd.Timestamp(reloads.iloc[0]["time (UTC)"].removesuffix(" UTC"), tz="UTC")
    assert abs(stamp.timestamp() - restart) < 60
    why = frame(at, "moved with it").set_index("part")
    # TTFT went from 20 ms to 150 ms and back; the why panel lines up the server side.
    assert {"queue time", "KV-cache utilization"} <= set(why.index)
    assert any(t.startswith("TTFT: median") for t in texts(at))


def test_llm_page_shows_kv_cache_and_its_forecast(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config, "llm", range="15 min")
    line = next(t for t in texts(at) if t.startswith("rig, fake_llm:"))
    with open_store(rig_store.url, read_only=True) as store:
        (kv,) = store.read(Query("sli:kv_cache_utilization", start=0, end=time.time() + 1,
                                 match={"model": "fake_llm"})).series()
    # The mean of the chart's last bucket (1 s scrapes: 3 s buckets over 15 min), in percent.
    step = step_for(900, 1.0)
    last_bucket = [v for t, v in zip(kv.ts, kv.values, strict=True)
                   if t // step == kv.ts[-1] // step]
    assert line.startswith(f"rig, fake_llm: {np.mean(last_bucket) * 100:.0f} % now")
    assert "No LLM serving metrics" not in " ".join(texts(at))


def test_gpus_page_works_from_tritons_nv_gpu_series_alone(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config, "gpus", range="15 min")
    now = frame(at, "utilization %").set_index("GPU")
    row = now.loc["edge, GPU-edge-0"]
    assert row["utilization %"] == pytest.approx(62.5)
    assert row["memory used GiB"] == pytest.approx(4.0)
    assert row["power W"] == pytest.approx(180.5)
    assert "temperature °C" not in now.columns  # NVML only
    assert any("Needs NVML" in t for t in texts(at))


def marker_rules(at: AppTest) -> list[int]:
    """Per Altair chart on the page, how many deploy-marker layers (dashed grey rules) it has."""
    out = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        out.append(sum(1 for layer in spec.get("layer", [spec])
                       if isinstance(layer.get("mark"), dict)
                       and layer["mark"].get("type") == "rule"
                       and layer["mark"].get("strokeDash") == [4, 3]))
    return out


def test_llm_page_draws_the_chosen_models_deploy_markers_on_every_chart(rig_store,
                                                                         monkeypatch):
    at = run_page(monkeypatch, rig_store.config, "llm", model="fake_llm", range="15 min")
    markers = frame(at, "what")
    reloads = markers[markers["what"] == "reload"]
    assert len(reloads) == 1
    stamp = pd.Timestamp(reloads.iloc[0]["time (UTC)"].removesuffix(" UTC"), tz="UTC")
    assert abs(stamp.timestamp() - rig_store.info["restart_at"]) < 60
    rules = marker_rules(at)
    # KV cache, free blocks, reuse, in-flight fill, requests, tokens: each with the markers.
    assert len(rules) >= 5 and all(r == 1 for r in rules), rules
    # Without a model chosen, no markers (they belong to one model).
    at = run_page(monkeypatch, rig_store.config, "llm", range="15 min")
    assert marker_rules(at) and all(r == 0 for r in marker_rules(at))
    assert "what" not in {c for d in at.dataframe for c in d.value.columns}


def test_fleet_target_rows_link_to_the_target_filtered_pages(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config)
    health = frame(at, "last error").set_index("source")
    rig = health[health["target"] == "rig"].iloc[0]
    assert (rig["models"], rig["alerts"]) == ("/model?target=rig", "/alerts?target=rig")
    gone = health[health["target"] == "gone"].iloc[0]
    assert gone["alerts"] == "/alerts?target=gone"
    unfiltered = frame(run_page(monkeypatch, rig_store.config, "alerts", range="15 min"),
                       "since (UTC)")
    assert "gone" in set(unfiltered["target"])

    # Following the link: ?target= preselects the sidebar's target, and the page filters.
    monkeypatch.setenv(CONFIG_ENV, str(rig_store.config))

    def alerts_page_linked_for(target: str) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=120)
        at.query_params["target"] = target
        at.run()
        at.switch_page("app_pages/alerts.py")
        at.sidebar.selectbox(key="sb_range").set_value("15 min")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    at = alerts_page_linked_for("gone")
    assert at.sidebar.selectbox(key="sb_target").value == "gone"
    active = frame(at, "since (UTC)")
    assert "TargetDown" in set(active["alert"])
    assert set(active["target"]) <= {"gone", ""}
    at = alerts_page_linked_for("rig")
    # The other target's TargetDown is filtered out of the active and history tables.
    assert "gone" not in set(frame(at, "since (UTC)")["target"])
    assert "gone" not in set(frame(at, "time (UTC)")["target"])
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["target"] = "rig"
    at.run()
    at.switch_page("app_pages/model.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert set(frame(at, "model")["target"]) == {"rig"}
    assert "Models served by rig:" in texts(at)


def test_alerts_page_lists_ours_and_alertmanagers_with_filters(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config, "alerts", range="15 min")
    active = frame(at, "since (UTC)")
    with open_store(rig_store.url, read_only=True) as store:
        states = AlertStore(store).states()
    firing = {dict(s.labels)["alertname"] for s in states if s.status == "firing"}
    assert firing <= set(active["alert"]) and "SLOBurnRate" in firing
    history = frame(at, "time (UTC)")
    received = history[history["source"] == "alertmanager:tritonwatch"].iloc[0]
    assert received["summary"] == XSS_ANNOTATION and received["model"] == XSS_MODEL
    assert "engine" in set(history["source"])
    at.multiselect(key="alerts_sev").set_value(["critical"]).run()
    assert set(frame(at, "time (UTC)")["severity"]) == {"critical"}


def test_probes_page_counts_runs_and_errors(rig_store, monkeypatch):
    at = run_page(monkeypatch, rig_store.config, "probes", range="1 h")
    with open_store(rig_store.url, read_only=True) as store:
        rows = store.probe_results(start=time.time() - 3600)
    summary = frame(at, "requests").set_index("probe")
    assert summary.loc["llm", "requests"] == len(rows)
    assert summary.loc["llm", "errors"] == sum(not r.ok for r in rows)
    ttft = sorted(r.ttft_s * 1000 for r in rows if r.ok and r.ttft_s is not None)
    assert summary.loc["llm", "TTFT p50 ms"] == pytest.approx(float(np.median(ttft)))


def test_slos_page_on_a_synthetic_week(week_store, monkeypatch):
    at = run_page(monkeypatch, week_store.config, "slos")
    # 7 days at 10 req/s, 0.05 % failing, one hour with 5 % failing.
    spec = load_rules_file(week_store.config.parent / "rules.yaml").slos[0]
    with open_store(week_store.url, read_only=True) as store:
        status = slo_status(store, spec, time.time())
    assert status.compliance is not None and 0.999 < status.compliance < 0.9995
    assert metric(at, "SLI") == f"{status.compliance * 100:.3f} %"
    assert metric(at, "budget remaining") == f"{status.remaining * 100:.1f} %"
    tiers = frame(at, "threshold (x)")
    assert list(tiers["threshold (x)"]) == [round(t.factor, 2) for t in status.tiers]
    spent = frame(at, "budget spent %")
    # The slice holding the bad hour (two days ago) spent the most.
    worst = pd.Timestamp(spent.iloc[0]["slice ending (UTC)"].removesuffix(" UTC"), tz="UTC")
    bad_hour = week_store.info["now"] - 2 * 86400
    assert bad_hour - 3600 < worst.timestamp() < bad_hour + 6.1 * 3600 + 3600


def test_empty_store_shows_what_to_configure(empty_store, monkeypatch):
    fleet = run_page(monkeypatch, empty_store.config)
    assert any("No target has been scraped yet" in t for t in texts(fleet))
    assert any("No SLOs defined" in t for t in texts(fleet))
    pages: dict[str, str] = {
        "probes": "No probes configured — add `probes:` to the config.",
        "slos": "No SLOs defined",
        "llm": "No LLM serving metrics",
        "gpus": "No GPU metrics",
        "alerts": "No alert is active",
        "model": "Choose a model",
    }
    for page, wanted in pages.items():
        at = run_page(monkeypatch, empty_store.config, page)
        assert any(wanted in t for t in texts(at)), (page, texts(at))


def test_unreachable_store_shows_one_error_without_the_password(tmp_path, monkeypatch):
    from tests.fixtures_http import free_port

    port = free_port()
    config = tmp_path / "tw.yaml"
    config.write_text(f"version: 1\nstore: {{url: 'postgresql://tw:s3cret-pw@127.0.0.1:"
                      f"{port}/tw'}}\n", encoding="utf-8")
    at = run_page(monkeypatch, config)
    assert [e.value for e in at.error] == ["The store cannot be read."]
    shown = " ".join(texts(at))
    assert f"127.0.0.1:{port}" in shown and "s3cret-pw" not in shown


def test_the_dashboard_store_refuses_writes(rig_store):
    from tritonwatch.schemas.samples import Sample

    with open_store(rig_store.url, read_only=True) as store:
        store.write("x", time.time(), [Sample("y", (), 1.0)])
        with pytest.raises(StoreError):
            store.flush()
        store.drain()  # what close() would flush again




def test_dashboard_command_refuses_a_bad_config_naming_the_key(tmp_path, capsys):
    from tritonwatch.cli import main

    bad = tmp_path / "tw.yaml"
    bad.write_text("version: 1\nstore: {url: 'mysql://x/y'}\n", encoding="utf-8")
    assert main(["dashboard", "--config", str(bad)]) == 2
    assert "store.url" in capsys.readouterr().err


def test_reports_page_lists_kept_reports_and_shows_one(tmp_path, monkeypatch):
    from tests.dashboard.fill import write_config
    from tests.report import synthetic as syn
    from tritonwatch.alerts.report.produce import produce

    url = f"sqlite:///{tmp_path}/tw.db"
    with open_store(url) as store:
        store.migrations.apply()
        syn.fill(store)
        made = produce(store, syn.config(out_dir=str(tmp_path / "out")), syn.WEEK,
                       specs=syn.SLOS)
    assert made is not None
    config = write_config(tmp_path, rig=None, db_url=url, rules="version: 1\n")
    at = run_page(monkeypatch, config, "reports")
    listed = frame(at, "week")
    assert list(listed["week"]) == ["2026-W43"]
    assert listed.iloc[0]["incidents"] == made.report.summary.incidents
    assert listed.iloc[0]["held"] == made.report.summary.held
    assert [getattr(b, "label", None) for b in at.get("download_button")] == [
        "Download HTML", "Download MD", "Download JSON"]


def test_reports_page_without_reports_says_how_to_make_one(empty_store, monkeypatch):
    at = run_page(monkeypatch, empty_store.config, "reports")
    assert any("No weekly report yet" in t for t in texts(at))
