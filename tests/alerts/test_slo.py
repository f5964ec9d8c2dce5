"""SLO maths against the SRE Workbook's numbers and end to end over a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonwatch.alerts.rules import SloBurnRule
from tritonwatch.alerts.slo import (
    PERIOD_S,
    Events,
    Slo,
    _reset_aware,
    burn_rate,
    evaluate_tiers,
    events,
    load_windows,
    slo_status,
    slo_statuses,
)
from tritonwatch.schemas.config import ConfigError
from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.rules import SloSpec
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store

NOW = 1_800_000_000.0  # a multiple of 300 s: buckets line up with the runs below
H = 3600.0


def spec(objective: float = 99.9, window: str = "30d", **kw) -> SloSpec:
    data = {"name": "s", "objective": objective, "window": window,
            "sli": {"kind": "success", "probe": "p"}, **kw}
    return SloSpec.model_validate(data)


# --- the tiers as data -----------------------------------------------------------------------

WORKBOOK = [
    pytest.param("30d", "page-1h", 14.4, id="a 30-day SLO pages when 2% of the budget burns in 1h"),
    pytest.param("30d", "page-6h", 6.0, id="a 30-day SLO pages when 5% of the budget burns in 6h"),
    pytest.param("30d", "ticket-1d", 3.0,
                 id="a 30-day SLO tickets when 10% of the budget burns in 1d"),
    pytest.param("30d", "ticket-3d", 1.0,
                 id="a 30-day SLO tickets when 10% of the budget burns in 3d"),
    pytest.param("28d", "page-1h", 13.44, id="a 28-day SLO pages at 13.44x over 1h"),
    pytest.param("28d", "page-6h", 5.6, id="a 28-day SLO pages at 5.6x over 6h"),
    pytest.param("28d", "ticket-1d", 2.8, id="a 28-day SLO tickets at 2.8x over 1d"),
    pytest.param("28d", "ticket-3d", 672 / 720, id="a 28-day SLO tickets at 0.933x over 3d"),
]


@pytest.mark.parametrize(("window", "tier", "factor"), WORKBOOK)
def test_burn_rate_factors_match_the_workbook(window: str, tier: str, factor: float) -> None:
    slo = Slo.from_spec(spec(99.9, window))
    found = {t.window.name: t for t in slo.tiers}
    assert found[tier].factor == pytest.approx(factor)
    assert found[tier].enabled


@pytest.mark.parametrize(
    ("tier", "long_s", "short_s", "severity"),
    [
        pytest.param("page-1h", H, 300, "page", id="the fast page pairs 1h with 5m"),
        pytest.param("page-6h", 6 * H, 1800, "page", id="the slow page pairs 6h with 30m"),
        pytest.param("ticket-1d", 24 * H, 2 * H, "ticket", id="the fast ticket pairs 1d with 2h"),
        pytest.param("ticket-3d", 72 * H, 6 * H, "ticket", id="the slow ticket pairs 3d with 6h"),
    ],
)
def test_windows_file_pairs_each_long_window_with_a_short_one(
    tier: str, long_s: float, short_s: float, severity: str
) -> None:
    w = {w.name: w for w in load_windows()}[tier]
    assert (w.long_s, w.short_s, w.severity) == (long_s, short_s, severity)
    assert w.short_s == pytest.approx(w.long_s / 12)


@pytest.mark.parametrize(
    ("objective", "disabled"),
    [
        pytest.param(99.9, set(), id="at 99.9% every tier can fire"),
        pytest.param(96.0, set(), id="at 96% the maximum burn is 25x so 14.4x can still fire"),
        pytest.param(93.0, {"page-1h"}, id="at 93% the maximum burn 14.3x is below 14.4x"),
        pytest.param(90.0, {"page-1h"}, id="at 90% the maximum burn is 10x and 14.4x never fires"),
        pytest.param(80.0, {"page-1h", "page-6h"}, id="at 80% even the 6x tier never fires"),
    ],
)
def test_tiers_above_the_maximum_burn_are_disabled_with_a_warning(
    objective: float, disabled: set[str]
) -> None:
    slo = Slo.from_spec(spec(objective))
    assert slo.max_burn == pytest.approx(1 / (1 - objective / 100))
    assert {t.window.name for t in slo.tiers if not t.enabled} == disabled
    assert len(slo.warnings) == len(disabled)
    for name in disabled:
        assert any(name in w and "never fire" in w for w in slo.warnings)


def test_a_disabled_severity_disables_its_tiers_without_a_warning() -> None:
    slo = Slo.from_spec(spec(alerting={"ticket": {"enabled": False}}))
    assert [t.enabled for t in slo.tiers] == [True, True, False, False]
    assert slo.warnings == ()


def test_a_broken_windows_file_is_refused_with_its_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("version: 1\ntiers:\n  - {name: x, severity: sms, budget_fraction: 0.1, "
                   "long: 1h, short: 5m}\n")
    with pytest.raises(ConfigError) as err:
        load_windows(bad)
    assert any(e.startswith("tiers[0].severity:") for e in err.value.errors)
    bad.write_text("version: 1\ntiers:\n  - {name: x, severity: page, budget_fraction: 0.1, "
                   "long: 5m, short: 1h}\n")
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.short"):
        load_windows(bad)


# --- ratios and burn rates -------------------------------------------------------------------


def test_burn_rate_is_the_error_ratio_over_the_budget() -> None:
    assert burn_rate(Events(good=990, total=1000), 0.999) == pytest.approx(10.0)
    assert burn_rate(Events(good=0, total=0), 0.999) is None
    assert Events(5, 10) + Events(1, 10) == Events(6, 20)


def test_reset_aware_difference_counts_a_restart_from_zero() -> None:
    assert _reset_aware([10, 15, 3, 8]) == pytest.approx(5 + 3 + 5)
    assert _reset_aware([7]) == 0


# --- end to end through the store ------------------------------------------------------------

LABELS = {"probe": "p", "model": "llm", "protocol": "grpc"}


def write_runs(store: Store, runs: list[tuple[float, float, float]], sli: str = "success",
               **extra: str) -> None:
    """Probe runs as the sink writes them: per run, total and good counts of that run."""
    labels = make_labels({**LABELS, **extra, "sli": sli})
    for ts, total, good in runs:
        store.write("t", ts, [Sample("probe:slo_total", labels, total),
                              Sample("probe:slo_good", labels, good)])
    store.flush()


def runs(hours: float, *, bad_from: float = 1.0, bad_until: float = 0.0,
         total: float = 100.0, good_when_bad: float = 90.0) -> list[tuple[float, float, float]]:
    """One run every 5 min, 150 s off the grid (so a 5 m window holds exactly one), over the
    last ``hours``; runs between ``bad_from`` and ``bad_until`` hours ago have errors."""
    out = []
    for k in range(int(hours * 12)):
        ts = NOW - 150 - k * 300
        age = (NOW - ts) / H
        bad = bad_until < age < bad_from
        out.append((ts, total, good_when_bad if bad else total))
    return out


def test_error_ratio_is_the_sum_of_bad_over_the_sum_of_total_not_a_mean_of_ratios(
    store: Store,
) -> None:
    write_runs(store, [(NOW - 600, 1000, 1000), (NOW - 300, 10, 0)])
    found = events(store, Slo.from_spec(spec()), NOW - H, NOW)
    assert found == {(): Events(1000, 1010)}
    assert found[()].error_ratio == pytest.approx(10 / 1010)  # a mean of ratios would say 0.5


def test_a_fast_burn_trips_every_tier_with_the_workbook_burn_rates(store: Store) -> None:
    # 4 days of runs, 100 events each; during the last hour 10 % of them fail.
    write_runs(store, runs(96, bad_from=1.0))
    slo = Slo.from_spec(spec(99.9))
    (tiers,) = evaluate_tiers(store, slo, NOW).values()
    by = {t.name: t for t in tiers}
    assert by["page-1h"].long_burn == pytest.approx(100.0)  # 0.1 / 0.001
    assert by["page-1h"].short_burn == pytest.approx(100.0)
    assert by["page-6h"].long_burn == pytest.approx(120 / 7200 / 0.001)
    assert by["ticket-1d"].long_burn == pytest.approx(120 / 28800 / 0.001)
    assert by["ticket-1d"].short_burn == pytest.approx(120 / 2400 / 0.001)
    assert by["ticket-3d"].long_burn == pytest.approx(120 / 86400 / 0.001)
    assert by["page-1h"].long_total == 1200
    assert all(t.firing for t in tiers)
    status = slo_status(store, slo, NOW)
    assert status.page and status.ticket


def test_a_burn_that_stopped_resets_through_the_short_window(store: Store) -> None:
    # Errors from 50 to 10 minutes ago: the 1 h window still burns hard, the 5 m one is clean.
    write_runs(store, runs(8, bad_from=50 / 60, bad_until=10 / 60))
    (tiers,) = evaluate_tiers(store, Slo.from_spec(spec(99.9)), NOW).values()
    page = next(t for t in tiers if t.name == "page-1h")
    assert page.long_burn is not None and page.long_burn > 14.4
    assert page.short_burn == 0
    assert not page.firing


def test_a_slow_leak_tickets_but_does_not_page(store: Store) -> None:
    # 0.2 % errors all along at 99.9 %: burn 2 -> above 1x (3 d) but below 3x, 6x, 14.4x.
    write_runs(store, runs(80, bad_from=1e9, good_when_bad=99.8))
    status = slo_status(store, spec(99.9), NOW)
    by = {t.name: t for t in status.tiers}
    assert by["ticket-3d"].long_burn == pytest.approx(2.0)
    assert [n for n, t in by.items() if t.firing] == ["ticket-3d"]
    assert not status.page and status.ticket


def test_the_minimum_traffic_guard_silences_tiers_with_too_few_events(store: Store) -> None:
    write_runs(store, runs(8, bad_from=1.0))
    slo = Slo.from_spec(spec(99.9, min_traffic=2000))  # 1 h holds 1200 events, 6 h 7200
    (tiers,) = evaluate_tiers(store, slo, NOW).values()
    by = {t.name: t for t in tiers}
    assert not by["page-1h"].enough_traffic and not by["page-1h"].firing
    assert by["page-6h"].enough_traffic and by["page-6h"].firing


def test_budget_remaining_and_projected_exhaustion(store: Store) -> None:
    # 4 days at 100 events per run (115 200 events), 120 of them bad, at a 99 % objective.
    write_runs(store, runs(96, bad_from=1.0))
    status = slo_status(store, spec(99.0), NOW)
    assert (status.good, status.total) == (115200 - 120, 115200)
    assert status.error_ratio == pytest.approx(120 / 115200)
    assert status.consumed == pytest.approx(120 / 115200 / 0.01)
    assert status.remaining == pytest.approx(1 - 120 / 115200 / 0.01)
    assert status.allowed_bad == pytest.approx(1152)
    assert status.current_burn == pytest.approx(10.0)  # 1 h at 10 % errors / 1 % budget
    expected = status.remaining * PERIOD_S["30d"] / 10.0
    assert status.exhaustion_in_s == pytest.approx(expected)
    assert status.exhausts_at == pytest.approx(NOW + expected)
    assert status.met is True
    # The same data at 99.9 %: the budget is overspent, exhaustion is now.
    spent = slo_status(store, spec(99.9), NOW)
    assert spent.remaining < 0 and spent.exhaustion_in_s == 0 and spent.met is False


def test_a_quiet_slo_has_its_whole_budget_and_no_exhaustion(store: Store) -> None:
    write_runs(store, runs(2, bad_from=0.0))  # all good
    status = slo_status(store, spec(99.9), NOW)
    assert status.remaining == 1.0 and status.current_burn == 0
    assert status.exhaustion_in_s is None and status.exhausts_at is None
    empty = slo_status(store, spec(99.9, name="other", sli={"kind": "success", "probe": "x"}), NOW)
    assert empty.total == 0 and empty.error_ratio is None and empty.remaining == 1.0


def test_groups_split_budgets_and_the_aggregate_sums_them(store: Store) -> None:
    write_runs(store, [(NOW - 100, 100, 50)], model="a")
    write_runs(store, [(NOW - 100, 100, 100)], model="b")
    s = spec(99.0, sli={"kind": "success", "by": ["model"]})
    statuses = slo_statuses(store, s, NOW)
    assert [(st.group, st.good, st.total) for st in statuses] == [
        ((("model", "a"),), 50, 100), ((("model", "b"),), 100, 100)
    ]
    total = slo_status(store, s, NOW)
    assert (total.group, total.good, total.total) == ((), 150, 200)


def test_probe_sli_filters_by_probe_model_and_sli(store: Store) -> None:
    write_runs(store, [(NOW - 100, 10, 1)], sli="ttft")
    write_runs(store, [(NOW - 100, 10, 9)], sli="success")
    store.write("t", NOW - 100, [
        Sample("probe:slo_total", make_labels({**LABELS, "probe": "q", "sli": "ttft"}), 5.0),
        Sample("probe:slo_good", make_labels({**LABELS, "probe": "q", "sli": "ttft"}), 0.0),
    ])
    store.flush()
    ttft = Slo.from_spec(spec(sli={"kind": "ttft", "probe": "p"}))
    assert events(store, ttft, NOW - H, NOW) == {(): Events(1, 10)}
    every = Slo.from_spec(spec(sli={"kind": "ttft"}))
    assert events(store, every, NOW - H, NOW) == {(): Events(1, 15)}


def test_a_latency_threshold_of_its_own_counts_probe_result_rows(store: Store) -> None:
    def row(ts: float, ok: bool, ttft: float | None, model: str = "llm") -> ProbeResult:
        return ProbeResult(probe="p", target="t", model=model, protocol="grpc", ts=ts, ok=ok,
                           ttft_s=ttft, itl_s=None)

    store.write_probe_results([
        row(NOW - 50, True, 0.2), row(NOW - 40, True, 0.49), row(NOW - 30, True, 0.8),
        row(NOW - 20, False, None), row(NOW - 10, True, None), row(NOW - 5, True, 0.9, "x"),
        row(NOW - 2 * H, False, None),  # outside the hour
    ])
    store.flush()
    slo = Slo.from_spec(spec(sli={"kind": "ttft", "probe": "p", "model": "llm",
                                  "threshold": "500ms"}))
    # good: 0.2, 0.49, and the success without a TTFT; bad: 0.8 and the failure.
    assert events(store, slo, NOW - H, NOW) == {(): Events(3, 5)}
    by_model = Slo.from_spec(spec(sli={"kind": "ttft", "threshold": 0.5, "by": ["model"]}))
    assert events(store, by_model, NOW - H, NOW) == {
        (("model", "llm"),): Events(3, 5), (("model", "x"),): Events(0, 1)
    }


def counters(store: Store, model: str, points: list[tuple[float, float, float, float]]) -> None:
    """(ts, success, failure{reason=BACKEND}, failure{reason=REJECTED}) counter samples."""
    base = {"model": model, "version": "1"}
    for ts, ok, backend, rejected in points:
        store.write("t", ts, [
            Sample("nv_inference_request_success", make_labels(base), ok),
            Sample("nv_inference_request_failure",
                   make_labels({**base, "reason": "BACKEND"}), backend),
            Sample("nv_inference_request_failure",
                   make_labels({**base, "reason": "REJECTED"}), rejected),
        ])
    store.flush()


def test_availability_counts_counter_increases_across_a_restart(store: Store) -> None:
    counters(store, "a", [
        (NOW - 3000, 1000, 1, 0),
        (NOW - 2000, 1900, 5, 2),   # +900 ok, +6 bad
        (NOW - 1000, 100, 0, 1),    # restart: +100 ok, +1 bad
        (NOW, 600, 3, 1),           # +500 ok, +3 bad
    ])
    counters(store, "b", [(NOW - 3000, 0, 0, 0), (NOW, 50, 50, 0)])
    slo = Slo.from_spec(spec(sli={"kind": "availability", "by": ["model"]}))
    found = events(store, slo, NOW - H, NOW)
    assert found == {
        (("model", "a"),): Events(1500, 1510),
        (("model", "b"),): Events(50, 100),
    }
    only_a = Slo.from_spec(spec(sli={"kind": "availability", "model": "a"}))
    assert events(store, only_a, NOW - H, NOW) == {(): Events(1500, 1510)}


def test_availability_over_the_period_reads_five_minute_buckets(store: Store) -> None:
    # A sample every 5 minutes for 5 days (longer than the raw-window limit), one restart.
    points = []
    ok = bad = 0.0
    for k in range(5 * 288, -1, -1):
        ts = NOW - k * 300
        if k == 700:
            ok = bad = 0.0  # restart
        ok += 100
        bad += 1 if k < 100 else 0
        points.append((ts, ok, bad, 0.0))
    counters(store, "a", points)
    status = slo_status(store, spec(99.0, sli={"kind": "availability"}), NOW)
    # 1440 increments of 100 (the first sample is the baseline; the restart's sample counts
    # its own 100 as in Prometheus), and the last 100 intervals carried one failure each.
    assert status.good == pytest.approx(1440 * 100)
    assert status.total - status.good == pytest.approx(100)


def test_queue_time_weighs_each_interval_by_the_requests_it_served(store: Store) -> None:
    labels = make_labels({"model": "m", "version": "1"})
    for k in range(0, 241 + 4):  # every 15 s, from a minute before the hour to now
        ts = NOW - k * 15
        rate = 0.0 if k == 30 else 10.0
        queue = 0.2 if k < 20 or k == 30 else 0.01
        store.write("t", ts, [Sample("sli:request_rate", labels, rate),
                              Sample("sli:queue_time_seconds", labels, queue)])
    store.flush()
    slo = Slo.from_spec(spec(99.0, sli={"kind": "queue_time", "threshold": "50ms"}))
    found = events(store, slo, NOW - H, NOW)
    # 241 points in the hour (both ends inclusive), 150 requests each but the idle one (0).
    total = 240 * 150
    bad = 20 * 150  # the slow idle interval costs nothing
    assert found == {(): Events(total - bad, total)}


def test_slo_burn_rule_labels_are_stable_and_values_go_in_annotations(store: Store) -> None:
    write_runs(store, runs(8, bad_from=1.0))
    s = spec(99.9, labels={"team": "ml"}, sli={"kind": "success", "by": ["model"]},
             alerting={"page": {"labels": {"pager": "yes"}},
                       "annotations": {"runbook_url": "https://x/{labels[model]}",
                                       "burn": "{value:.0f}x"}})
    rule = SloBurnRule.from_spec(s)
    found = {dict(c.labels)["severity"]: c for c in rule.evaluate(store, NOW)}
    assert set(found) == {"page", "ticket"}
    page = found["page"]
    assert dict(page.labels) == {"alertname": "SLOBurnRate", "slo": "s", "severity": "page",
                                 "team": "ml", "model": "llm", "pager": "yes"}
    ann = dict(page.annotations)
    assert page.value == pytest.approx(100.0)
    assert ann["burn_rate_1h"] == "100" and ann["burn_rate_5m"] == "100"
    assert ann["long_window"] == "1h" and ann["short_window"] == "5m"
    assert ann["burn"] == "100x" and ann["runbook_url"] == "https://x/llm"
    assert float(ann["error_budget_remaining"]) == pytest.approx(1 - 120 / 9600 / 0.001)
    # An hour later at a lower burn, the labels are the same: the same alert instance.
    write_runs(store, [(NOW + 150 + k * 300, 100, 95) for k in range(12)])
    later = {dict(c.labels)["severity"]: c for c in rule.evaluate(store, NOW + H)}
    assert later["page"].labels == page.labels
    assert later["page"].annotations != page.annotations


def test_slo_burn_rule_is_silent_when_nothing_burns(store: Store) -> None:
    write_runs(store, runs(8, bad_from=0.0))
    assert SloBurnRule.from_spec(spec()).evaluate(store, NOW) == []
