"""The golden test of the weekly report: a store holding a known synthetic fortnight
(tests/report/synthetic.py) yields exactly these numbers in the JSON report.

Derivations (W43 = 2026-W43 in Europe/Berlin, 169 hours: summer time ends that Sunday):
- scrapes every 300 s: W43 expects 169 * 12 = 2028, W42 168 * 12 = 2016;
- target b lost every fifth W43 scrape: 2028 - 405 = 1623 stored, 1623 / 2028 = 0.800296;
- availability: W43 requests = 2028 scrapes * 300 = 608,400, of which the incident's 24
  scrapes failed 150 each = 3,600 bad; W42 604,800 requests, none bad;
  the 28-day window at W43's end holds both weeks: 1,213,200 events, budget 1 % = 12,132
  bad events; consumed 3,600 / 12,132 = 0.296736;
- the incident's hour 10:00-11:00 UTC: 12 scrapes of 150 good + 150 bad: error ratio 0.5,
  burn 0.5 / 0.01 = 50 (the peak);
- the week's burn 3,600 / 608,400 / 0.01 = 0.591716; the budget left (0.703264) lasts
  0.703264 * 28 d / 0.591716 at that burn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.report import synthetic as syn
from tritonwatch.alerts.report.build import build_report
from tritonwatch.alerts.report.model import to_json
from tritonwatch.store import Store, open_store

R = 6  # the JSON's decimals


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path: Path = tmp_path_factory.mktemp("golden")
    store: Store = open_store(f"sqlite:///{path}/tw.db")
    store.migrations.apply()
    syn.fill(store)
    try:
        return to_json(build_report(store, syn.config(), syn.SLOS, syn.WEEK, config_key="k",
                                    now=syn.WEEK.end + 3600))
    finally:
        store.close()


def test_the_week_is_iso_2026_w43_in_berlin_and_says_it_has_169_hours(report) -> None:
    assert report["week"] == "2026-W43"
    assert report["start"] == syn.utc(2026, 10, 18, 22)  # Monday 00:00 CEST
    assert report["end"] == syn.utc(2026, 10, 25, 23)  # Monday 00:00 CET
    assert (report["start_local"], report["end_local"]) == (
        "2026-10-19 00:00 CEST", "2026-10-26 00:00 CET")
    assert report["hours"] == 169
    assert "169 hours" in report["dst_note"]


def test_completeness_counts_expected_scrapes_of_the_169_hour_week(report) -> None:
    assert report["completeness"] == [
        {"target": "a", "interval_s": 300.0, "expected": 2028, "stored": 2028, "ratio": 1.0,
         "warning": None},
        {"target": "b", "interval_s": 300.0, "expected": 2028, "stored": 1623,
         "ratio": round(1623 / 2028, R),
         "warning": "only 80.0 % of the expected scrapes of b are stored (1623 of 2028 at "
                    "300 s): numbers involving this target miss part of the week"},
    ]
    assert report["warnings"][0] == report["completeness"][1]["warning"]


def test_the_availability_slo_shows_the_incidents_cost(report) -> None:
    avail = report["slos"][0]
    window_events = (2016 + 2028) * 300
    allowed = 0.01 * window_events
    consumed = 3600 / allowed
    burn = 3600 / 608_400 / 0.01
    strip = avail.pop("strip")
    hourly = avail.pop("hourly_burn")
    assert avail == {
        "name": "availability", "description": "llm answers without errors",
        "kind": "availability", "objective": 0.99, "window": "28d", "state": "held",
        "sli_week": round(1 - 3600 / 608_400, R), "sli_previous_week": 1.0,
        "sli_change": round(-3600 / 608_400, R), "sli_window": round(1 - 3600 / window_events, R),
        "events_week": 608_400.0, "bad_week": 3600.0,
        "budget_consumed": round(consumed, R), "budget_remaining": round(1 - consumed, R),
        "budget_remaining_previous": 1.0, "budget_spent_week": round(consumed, R),
        "burn_week": round(burn, R), "peak_burn_1h": 50.0,
        "peak_burn_at": syn.utc(2026, 10, 21, 11),
        "exhaustion_at": round(syn.WEEK.end + (1 - consumed) * 28 * 86400 / burn, R),
        "exhausted": False,
    }
    assert len(hourly) == 169
    assert [h for h in hourly if h] == [50.0, 50.0]
    assert [c["week"] for c in strip] == [f"2026-W{n}" for n in range(32, 44)]
    assert [c["state"] for c in strip] == ["no_data"] * 10 + ["met", "met"]
    assert strip[-1] == {"week": "2026-W43", "sli": round(1 - 3600 / 608_400, R),
                         "burn": round(burn, R), "state": "met"}


def test_the_queue_time_slo_held_with_every_slice_good(report) -> None:
    q = report["slos"][1]
    assert (q["state"], q["sli_week"], q["events_week"], q["bad_week"]) == (
        "held", 1.0, 2028 * 300.0, 0.0)
    assert q["exhaustion_at"] is None
    # (W41 holds one slice too: the first scrape, at W42's first instant, covers the five
    # minutes before it, as every per-interval sample covers the interval it ends.)
    assert [c["state"] for c in q["strip"]][:9] == ["no_data"] * 9
    assert [c["state"] for c in q["strip"]][-2:] == ["met", "met"]


def test_summary_counts_slos_incidents_regressions_and_advice(report) -> None:
    assert report["summary"] == {
        "held": 2, "at_risk": 0, "breached": 0, "no_data": 0,
        "budget_health": "Lowest budget left: availability with 70.3 % of its 28d budget.",
        "incidents": 2, "postmortems": 1, "regressions": 1, "advice": 2,
    }


def test_incidents_carry_duration_and_budget_and_flag_a_postmortem(report) -> None:
    down, page = report["incidents"]
    assert (down["alertname"], down["duration_s"], down["budget"], down["postmortem"]) == (
        "TargetDown", 3600.0, [], False)
    assert page["alertname"] == "SLOBurnRate"
    assert (page["started_at"], page["resolved_at"], page["duration_s"]) == (
        syn.INCIDENT[0], syn.INCIDENT[1], 7200.0)
    assert page["budget"] == [{"slo": "availability", "bad_events": 3600.0,
                               "budget_spent": round(3600 / (0.01 * (2016 + 2028) * 300), R)}]
    assert page["postmortem"] is True  # 29.7 % of the budget > 20 %


def test_the_fill_rate_regression_is_found_with_its_size(report) -> None:
    (reg,) = report["regressions"]
    assert {k: reg[k] for k in ("series", "target", "labels", "direction", "current",
                                "baseline", "change", "load_current", "load_baseline")} == {
        "series": "sli:batch_fill_rate", "target": "a",
        "labels": {"model": "llm", "version": "1"}, "direction": "down",
        "current": 0.5, "baseline": 0.8, "change": -0.375,
        "load_current": 1.0, "load_baseline": 1.0,
    }
    assert reg["p_value"] <= 0.001


def test_efficiency_per_model_against_the_previous_week(report) -> None:
    gen, llm = report["efficiency"]
    assert (gen["model"], llm["model"]) == ("gen", "llm")
    assert llm["fill_rate"] == {"current": 0.5, "previous": 0.8, "change": -0.375}
    assert gen["kv_cache_headroom"] == {"current": 0.05, "previous": 0.05, "change": 0.0}
    assert gen["tokens_per_s_per_gpu"] == {"current": 500.0, "previous": 400.0, "change": 0.25}
    assert gen["energy_per_inference_j"] == {"current": 2.0, "previous": 2.5, "change": -0.2}
    assert llm["gpu_utilization"] == {"current": 0.6, "previous": 0.6, "change": 0.0}
    # No KV cache on llm, no fill rate on gen: missing, not zero.
    assert llm["kv_cache_headroom"]["current"] is None
    assert gen["fill_rate"] == {"current": None, "previous": None, "change": None}


def test_advice_is_exactly_the_expected_entries_with_their_numbers(report) -> None:
    assert [(a["rule"], a["model"]) for a in report["advice"]] == [
        ("kv_cache_full_with_waiting", "gen"), ("low_fill_queue_headroom", "llm")]
    kv, fill = report["advice"]
    assert kv["numbers"] == {"sli:kv_cache_utilization:peak": 0.95,
                             "sli:llm_waiting_requests": 2.0, "sli:llm_paused_requests": 1.0}
    assert fill["numbers"] == {"sli:batch_fill_rate": 0.5, "sli:queue_time_seconds": 0.001,
                               "queue_budget_s": 0.05, "max_queue_delay_us": 100.0,
                               "max_batch_size": 8.0, "instance_count": 1.0}
    # The text quotes the numbers it rests on.
    for quoted in ("50 %", "1 ms", "50 ms", "now 100 µs", "25000 µs"):
        assert quoted in fill["text"]
    for quoted in ("95 %", "2 requests waited", "1 were paused"):
        assert quoted in kv["text"]


def test_an_empty_week_says_so_instead_of_inventing_numbers(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/tw.db") as store:
        store.migrations.apply()
        data = to_json(build_report(store, syn.config(), syn.SLOS, syn.WEEK, config_key="k"))
    assert [c["stored"] for c in data["completeness"]] == [0, 0]
    assert all(s["state"] == "no_data" and s["sli_week"] is None for s in data["slos"])
    assert data["summary"]["no_data"] == 2
    assert any("availability had no events" in w for w in data["warnings"])
    assert data["regressions"] == [] and data["advice"] == [] and data["efficiency"] == []


def test_a_week_in_progress_expects_only_the_scrapes_of_the_hours_passed(tmp_path: Path) -> None:
    store: Store = open_store(f"sqlite:///{tmp_path}/tw.db")
    store.migrations.apply()
    syn.fill(store)
    try:
        # 24 hours into W43: 24 * 12 scrapes were due from each target, all stored for a.
        now = syn.WEEK.start + 24 * 3600
        got = to_json(build_report(store, syn.config(), syn.SLOS, syn.WEEK, config_key="k",
                                   now=now))
    finally:
        store.close()
    a = next(c for c in got["completeness"] if c["target"] == "a")
    assert (a["expected"], a["warning"]) == (24 * 12, None)
    assert a["stored"] >= 24 * 12  # a sample stamped at the boundary counts (module doc)
    assert any("2026-W43 is not over yet" in w for w in got["warnings"])
