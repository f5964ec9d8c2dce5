"""Regression detection (alerts/detect.py) against a real SQLite store."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.alerts.test_history import CountingStore
from tritonwatch.alerts.baseline import WEEK_S, DeployEvent, baseline_windows
from tritonwatch.alerts.defaults import _regression_spec
from tritonwatch.alerts.detect import RegressionRule, detect, regression_rules
from tritonwatch.alerts.formatting import fmt_change
from tritonwatch.alerts.moved import likely_cause, moved_with
from tritonwatch.alerts.stats import (
    Comparison,
    LoadModel,
    fit_load_model,
    is_regression,
    judge,
    mann_whitney_p,
    robust_z,
)
from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Store

T0 = 1_750_003_200.0
M = make_labels({"model": "llm", "version": "1"})
NOW = T0 + 6 * 3600.0


Fn = Callable[[float], tuple[float, float, float]]  # ts -> (fill, load, queue time)


def write(store: Store, fn: Fn, *, start: float = T0, end: float = NOW, seed: int = 0,
          target: str = "t1") -> None:
    rng = np.random.default_rng(seed)
    ts = start
    while ts <= end:
        fill, load, queue = fn(ts)
        store.write(target, ts, [
            Sample("sli:batch_fill_rate", M, fill * float(rng.lognormal(0, 0.05))),
            Sample("sli:request_rate", M, load * float(rng.lognormal(0, 0.05))),
            Sample("sli:queue_time_seconds", M, queue * float(rng.lognormal(0, 0.1))),
        ])
        ts += 30.0
    store.flush()


def step_at(onset: float, before: float, after: float) -> Callable[[float], float]:
    return lambda ts: after if ts >= onset else before


SPEC = RegressionSpec(name="fill", series="sli:batch_fill_rate", direction="down")
ONSET = NOW - 600.0  # 10 of the 15 recent minutes are after the change


def test_fires_on_a_drop_at_same_load_with_numbers_in_annotations(store: Store) -> None:
    fill = step_at(ONSET, 0.6, 0.36)
    queue = step_at(ONSET, 0.01, 0.03)
    write(store, lambda ts: (fill(ts), 20.0, queue(ts)))
    found = detect(store, SPEC, NOW)
    assert len(found) == 1
    f = found[0]
    assert f.baseline_kind == "trailing"
    assert f.comparison.change == pytest.approx(-0.4, abs=0.06)
    ann = dict(f.candidate.annotations)
    assert ann["summary"].startswith("Batch fill rate -")
    assert "vs last 4h" in ann["summary"]
    assert "queue time" in ann["summary"] and "\u00d7" in ann["summary"]  # queue time x3
    assert "req/s" in ann["description"] and "robust z" in ann["description"]
    assert float(ann["change_percent"]) == pytest.approx(-40, abs=6)
    assert ann["baseline"] == "trailing"
    assert dict(f.candidate.labels) == {
        "alertname": "fill", "rule": "fill", "target": "t1", "model": "llm", "version": "1"
    }
    assert f.candidate.value == pytest.approx(f.comparison.change)


def test_labels_are_stable_while_the_numbers_move(store: Store) -> None:
    fill = step_at(ONSET - 600, 0.6, 0.3)
    write(store, lambda ts: (fill(ts), 20.0, 0.01))
    a = detect(store, SPEC, NOW - 60)
    b = detect(store, SPEC, NOW)
    assert a and b
    assert a[0].candidate.labels == b[0].candidate.labels
    assert a[0].candidate.annotations != b[0].candidate.annotations


def test_quiet_on_steady_noisy_data(store: Store) -> None:
    write(store, lambda ts: (0.6, 20.0, 0.01), seed=3)
    for i in range(0, 120, 5):
        assert detect(store, SPEC, NOW - i * 60) == []


@pytest.mark.parametrize(("drop", "min_effect", "fires"), [
    (0.1, 0.2, False),
    (0.1, 0.05, True),
    (0.3, 0.2, True),
    (0.3, 0.4, False),
])
def test_min_effect(store: Store, drop: float, min_effect: float, fires: bool) -> None:
    fill = step_at(ONSET - 300, 0.6, 0.6 * (1 - drop))
    write(store, lambda ts: (fill(ts), 20.0, 0.01))
    spec = SPEC.model_copy(update={"min_effect": min_effect})
    assert bool(detect(store, spec, NOW)) is fires


def test_traffic_drop_is_not_a_regression(store: Store) -> None:
    # Fill rate halves because traffic halved: a baseline at one load level cannot say how
    # the fill rate responds to load, so it cannot judge at half the load (no verdict).
    fill = step_at(ONSET, 0.6, 0.3)
    load = step_at(ONSET, 20.0, 10.0)
    write(store, lambda ts: (fill(ts), load(ts), 0.01))
    assert detect(store, SPEC, NOW) == []
    # Without a load model the same data is a regression.
    assert detect(store, SPEC.model_copy(update={"load_series": None}), NOW)


def write_halving_fill(store: Store, seed: int, load_known: Callable[[float], bool]) -> None:
    """A fill rate that halves at ONSET, with the request rate stored only where
    ``load_known(ts)``."""
    fill = step_at(ONSET, 0.6, 0.3)
    rng = np.random.default_rng(seed)
    ts = T0
    while ts <= NOW:
        ss = [Sample("sli:batch_fill_rate", M, fill(ts) * float(rng.lognormal(0, 0.05)))]
        if load_known(ts):
            ss.append(Sample("sli:request_rate", M, 20.0 * float(rng.lognormal(0, 0.05))))
        store.write("t1", ts, ss)
        ts += 30.0
    store.flush()


def test_load_known_in_one_window_only_is_not_comparable(store: Store) -> None:
    # The fill rate halves; the request rate is only stored during the baseline (traffic, or
    # its exporter, stopped): nothing shows the load was comparable, so no verdict.
    write_halving_fill(store, 0, lambda ts: ts < NOW - SPEC.recent_window)
    assert detect(store, SPEC, NOW) == []
    assert detect(store, SPEC.model_copy(update={"load_series": None}), NOW)


def test_load_known_only_now_is_not_comparable(store: Store) -> None:
    write_halving_fill(store, 1, lambda ts: ts >= NOW - SPEC.recent_window)
    assert detect(store, SPEC, NOW) == []


def test_no_load_data_at_all_is_judged_and_said(store: Store) -> None:
    fill = step_at(ONSET, 0.6, 0.3)
    rng = np.random.default_rng(2)
    ts = T0
    while ts <= NOW:
        store.write("t1", ts, [Sample("sli:batch_fill_rate", M,
                                      fill(ts) * float(rng.lognormal(0, 0.05)))])
        ts += 30.0
    store.flush()
    (f,) = detect(store, SPEC, NOW)
    assert "load unknown" in dict(f.candidate.annotations)["description"]


def test_week_ago_baseline_is_used_when_history_exists(store: Store) -> None:
    # Fill fell 3 h ago: the trailing 4 h are mostly at the new level, last week was not.
    fill = step_at(NOW - 3 * 3600, 0.6, 0.35)
    write(store, lambda ts: (fill(ts), 20.0, 0.01), start=NOW - 5 * 3600)
    spec = SPEC.model_copy(update={"baseline": "week_ago"})
    assert detect(store, spec, NOW) == []  # no week-old history: trailing, absorbed
    write(store, lambda ts: (0.6, 20.0, 0.01), start=NOW - WEEK_S - 3 * 3600,
          end=NOW - WEEK_S + 3 * 3600, seed=5)
    found = detect(store, spec, NOW)
    assert len(found) == 1
    assert found[0].baseline_kind == "week_ago"
    ann = dict(found[0].candidate.annotations)
    assert ann["baseline"] == "week_ago" and "vs last week" in ann["summary"]
    assert "same hours last week" in ann["description"]
    # The trailing spec on the same data still sees nothing.
    assert detect(store, SPEC, NOW) == []


def test_week_ago_at_other_load_falls_back_to_trailing(store: Store) -> None:
    fill = step_at(ONSET, 0.6, 0.3)
    write(store, lambda ts: (fill(ts), 20.0, 0.01), start=NOW - 5 * 3600)
    # Last week had twice the traffic: not comparable, so the trailing baseline decides.
    write(store, lambda ts: (0.9, 40.0, 0.01), start=NOW - WEEK_S - 3 * 3600,
          end=NOW - WEEK_S + 3 * 3600, seed=5)
    found = detect(store, SPEC.model_copy(update={"baseline": "week_ago"}), NOW)
    assert [f.baseline_kind for f in found] == ["trailing"]


def test_up_direction_and_rule_protocol(store: Store) -> None:
    q = step_at(ONSET, 0.01, 0.02)
    write(store, lambda ts: (0.6, 20.0, q(ts)))
    spec = RegressionSpec.model_validate({
        "name": "queue", "series": "sli:queue_time_seconds", "direction": "up",
        "for": "2m", "keep_firing_for": "7m", "labels": {"severity": "ticket"},
        "annotations": {"runbook_url": "https://example.invalid/rb"},
    })
    (rule,) = regression_rules([spec])
    assert isinstance(rule, RegressionRule)
    assert (rule.name, rule.for_s, rule.keep_firing_for_s) == ("queue", 120.0, 420.0)
    (c,) = rule.evaluate(store, NOW)
    assert dict(c.labels)["severity"] == "ticket"
    assert dict(c.annotations)["runbook_url"] == "https://example.invalid/rb"
    assert c.value > 0.5
    assert rule.evaluate(store, ONSET - 60) == []
    assert detect(store, spec.model_copy(update={"direction": "down"}), NOW) == []


def test_statistics() -> None:
    rng = np.random.default_rng(0)
    base = list(rng.normal(100, 10, 240))
    same = list(rng.normal(100, 10, 15))
    higher = list(rng.normal(120, 10, 15))
    assert mann_whitney_p(higher, base, "up") < 1e-4
    assert mann_whitney_p(higher, base, "down") > 0.99
    assert 0.01 < mann_whitney_p(same, base, "up") < 0.99
    assert mann_whitney_p([1.0] * 5, [1.0] * 20, "up") == 1.0  # all tied
    assert robust_z(higher, base) > 4
    assert abs(robust_z(same, base)) < 3
    assert robust_z([2.0] * 5, [1.0] * 20) > 100  # flat baseline: sigma floored, finite
    assert fmt_change(3.0, 1.0) == "\u00d73.0"
    assert fmt_change(1.38, 1.0) == "+38 %"
    assert fmt_change(0.75, 1.0) == "-25 %"


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="min_points"):
        RegressionSpec(name="x", series="s", direction="up", recent_window=120.0)
    with pytest.raises(ValueError):
        RegressionSpec.model_validate({"name": "x", "series": "s", "direction": "sideways"})


# --- baselines kept between evaluations ----------------------------------------------------


def test_baseline_windows_are_aligned_to_five_minutes() -> None:
    spec = SPEC.model_copy(update={"baseline": "week_ago"})
    for now in (NOW, NOW + 30, NOW + 299, NOW + 300):
        (wk_kind, (w0, w1)), (kind, (b0, b1)) = baseline_windows(spec, now)
        assert (wk_kind, kind) == ("week_ago", "trailing")
        recent_start = now - spec.recent_window
        assert b1 % 300 == 0 and recent_start - 300 < b1 <= recent_start
        assert b1 - b0 == spec.baseline_window
        unaligned = now - spec.recent_window / 2 - WEEK_S - spec.baseline_window / 2
        assert w0 % 300 == 0 and unaligned - 300 < w0 <= unaligned
        assert w1 - w0 == spec.baseline_window


def test_short_windows_are_aligned_to_a_fraction_of_them_not_to_five_minutes() -> None:
    # A rule watching seconds (a 10 s recent window, a 60 s baseline) would otherwise get a
    # baseline ending up to 5 minutes before its recent window: often none at all.
    spec = SPEC.model_copy(update={"recent_window": 10.0, "baseline_window": 60.0, "step": 1.0})
    for now in (NOW, NOW + 1, NOW + 2.5, NOW + 7):
        ((kind, (b0, b1)),) = baseline_windows(spec, now)
        recent_start = now - spec.recent_window
        assert kind == "trailing" and b1 - b0 == 60.0
        assert b1 % 4 == 0 and recent_start - 4 < b1 <= recent_start


def test_rule_reads_the_baseline_once_per_five_minutes(store: Store) -> None:
    write(store, lambda ts: (0.6, 20.0, 0.01), start=NOW - 5 * 3600, end=NOW + 3600)
    counting = CountingStore(store)
    rule = RegressionRule(SPEC)
    for i in range(10):  # 5 minutes of evaluations within one quantum
        rule.evaluate(counting.as_store(), NOW + i * 30.0)
    old = [c for c in counting.calls if c[3] < NOW - SPEC.recent_window]
    # Read once, not on each of the 10 evaluations (load: successes and failures), an hour
    # at a time (alerts.history.READ_SLICE_S): the hours tile the window.
    start = NOW - SPEC.recent_window - SPEC.baseline_window
    hours = [(start + h * 3600, start + (h + 1) * 3600 - 0.001)
             for h in range(round(SPEC.baseline_window / 3600))]
    assert [(name, a, b) for _, name, a, b in old] == (
        [("sli:batch_fill_rate", a, b) for a, b in hours]
        + [(name, a, b) for a, b in hours for name in ("sli:request_rate", "sli:failure_rate")])
    assert rule.cache.reads == 2
    counting.calls.clear()
    for i in range(10, 20):  # the next quantum: only its new 5 minutes are read
        rule.evaluate(counting.as_store(), NOW + i * 30.0)
    old = [c for c in counting.calls if c[3] < NOW + 300 - SPEC.recent_window]
    assert [(start, end) for _, _, start, end in old] == [
        (NOW - SPEC.recent_window, NOW + 300 - SPEC.recent_window - 0.001)] * 3
    assert rule.cache.reads == 4


def test_rules_of_one_file_share_the_load_history_and_decide_as_alone(store: Store) -> None:
    fill = step_at(ONSET, 0.6, 0.3)
    write(store, lambda ts: (fill(ts), 20.0, step_at(ONSET, 0.01, 0.05)(ts)),
          start=NOW - 5 * 3600, end=NOW + 3600)
    queue = SPEC.model_copy(update={"name": "queue", "series": "sli:queue_time_seconds",
                                    "direction": "up"})
    shared = regression_rules([SPEC, queue])
    alone = [RegressionRule(SPEC), RegressionRule(queue)]
    counting = CountingStore(store)
    for i in range(0, 20, 5):
        now = NOW + i * 30.0
        together = [r.evaluate(counting.as_store(), now) for r in shared]
        assert together == [r.evaluate(store, now) for r in alone]
        assert all(together)  # both fire: the comparison is not between two empty lists
    a, b = (r.cache for r in shared if isinstance(r, RegressionRule))
    assert a._load["trailing"] is b._load["trailing"]
    # What a pending or firing instance holds owns its buckets: not views keeping a past
    # quantum's history arrays alive for as long as the alert lasts.
    held = [h.baseline.model for r in shared for h in r.held.values()]  # type: ignore[attr-defined]
    assert held and all(m.y.base is None and (m.x is None or m.x.base is None) for m in held)
    assert alone[0].cache._load["trailing"] is not alone[1].cache._load["trailing"]
    # The load was read once for both rules: the first read (an hour at a time), then one
    # slice at NOW + 300.
    loads = [c for c in counting.calls
             if c[1] == "sli:request_rate" and c[3] < NOW - SPEC.recent_window]
    assert len(loads) == len(set(loads)) == round(SPEC.baseline_window / 3600)


def test_shared_load_history_keeps_each_targets_load_apart_across_quanta(store: Store) -> None:
    # Two targets at different loads, both regressing: each finding quotes its own target's
    # load, now and in the baseline, as rules alone find them; through window moves and a
    # step back in time (the shared history re-read whole by one rule while the other's
    # caches still describe the old rows).
    fill = step_at(ONSET, 0.6, 0.3)
    for target, load, seed in (("t1", 20.0, 0), ("t2", 60.0, 3)):
        def fn(ts: float, load: float = load) -> tuple[float, float, float]:
            return fill(ts), load, 0.01
        write(store, fn, start=NOW - 5 * 3600, end=NOW + 3600, target=target, seed=seed)
    queue = SPEC.model_copy(update={"name": "queue", "series": "sli:queue_time_seconds",
                                    "direction": "up"})
    shared = regression_rules([SPEC, queue])
    alone = [RegressionRule(SPEC), RegressionRule(queue)]
    order = [0, 300, 600, 0, 900]  # the fourth step goes back: the first rule re-reads
    for step, dt in enumerate(order):
        now = NOW + dt
        for r in (*shared, *alone):  # the current baselines, not those held at onset
            r.held.clear()  # type: ignore[attr-defined]
        together = [r.evaluate(store, now) for r in (shared if step != 3 else shared[:1])]
        fresh = [RegressionRule(r.spec).evaluate(store, now)  # type: ignore[attr-defined]
                 for r in (shared if step != 3 else shared[:1])]
        assert together == fresh
        if step != 3:
            assert together == [r.evaluate(store, now) for r in alone]
    shared[0].held.clear()  # type: ignore[attr-defined]
    found = {dict(c.labels)["target"]: dict(c.annotations)
             for c in shared[0].evaluate(store, NOW + 900)}
    assert set(found) == {"t1", "t2"}
    assert float(found["t1"]["load_current"]) == pytest.approx(20.0, rel=0.1)
    assert float(found["t2"]["load_current"]) == pytest.approx(60.0, rel=0.1)
    assert float(found["t2"]["load_baseline"]) == pytest.approx(60.0, rel=0.1)


def test_week_ago_baseline_is_read_once_per_five_minutes_too(store: Store) -> None:
    write(store, lambda ts: (0.6, 20.0, 0.01), start=NOW - 5 * 3600, end=NOW + 3600)
    rule = RegressionRule(SPEC.model_copy(update={"baseline": "week_ago"}))
    for i in range(20):  # 10 minutes of evaluations
        rule.evaluate(store, NOW + i * 30.0)
    # Two series (fill rate, load), each: the first read, then one slice per new quantum:
    # the trailing window moves at NOW + 300, the week-ago one (its start is the recent
    # midpoint minus 2 h, a week ago) at NOW + 150 and NOW + 450.
    assert rule.cache.reads == 2 * (1 + 1) + 2 * (1 + 2)


def test_cached_baselines_decide_exactly_as_a_fresh_read(store: Store) -> None:
    # A drop that fires for a while: the cached rule must agree with an uncached detect at
    # every evaluation, numbers and all, across quantum changes and a series that vanishes.
    fill = step_at(ONSET, 0.6, 0.36)
    write(store, lambda ts: (fill(ts), 20.0, 0.01), end=NOW + 1800)
    write(store, lambda ts: (0.8, 10.0, 0.01), end=NOW - 3600, target="t2", seed=4)
    rule = RegressionRule(SPEC)
    fired = 0
    for i in range(0, 3600 // 30, 3):
        now = NOW - 1800 + i * 30.0
        cached = detect(store, SPEC, now, cache=rule.cache)
        fresh = detect(store, SPEC, now)
        assert cached == fresh
        fired += bool(cached)
    assert fired >= 10
    # t2 stopped an hour before NOW: by NOW + 1800 its buckets are still in the 4 h baseline
    # window, but once the window slid past them the cache forgets it.
    assert any(t == "t2" for t, _ in rule.cache._series["trailing"].data)
    for k in range(1, 60):
        detect(store, SPEC, NOW + 1800 + k * 300, cache=rule.cache)
    assert not any(t == "t2" for t, _ in rule.cache._series["trailing"].data)


def test_effect_prefilter_never_hides_a_regression(store: Store) -> None:
    # The same data through compare() directly: where the detector is quiet, either the
    # effect is below min_effect or a test did not pass.
    fill = step_at(ONSET, 0.6, 0.45)  # -25 %: effect passes, tests decide
    write(store, lambda ts: (fill(ts), 20.0, 0.01))
    (found,) = detect(store, SPEC, NOW)
    assert found.comparison.change == pytest.approx(-0.25, abs=0.05)
    quiet = SPEC.model_copy(update={"min_effect": 0.3})
    assert detect(store, quiet, NOW) == []


# --- load is every request that arrived, failed ones too ------------------------------------


@pytest.mark.parametrize("rule", ["kv_cache_regression", "gpu_efficiency_regression"])
def test_a_failure_spike_at_the_same_arrivals_is_not_a_resource_regression(
    store: Store, rule: str
) -> None:
    # 30 % of requests start failing while as many arrive: KV-cache and GPU use stay what the
    # arrivals ask for, but per *successful* request they rose by 1 / 0.7.  Load measured
    # as successes alone called that a +43 % regression.
    spec = _regression_spec(rule, None)
    rng = np.random.default_rng(5)
    gpu = make_labels({"gpu_uuid": "GPU-0"})
    ts = NOW - 6 * 3600
    while ts <= NOW:
        arrivals = 20.0 * (1 + 0.3 * np.sin(2 * np.pi * ts / 86400)) * rng.lognormal(0, 0.05)
        failing = 0.3 if ts >= ONSET else 0.002
        store.write("t1", ts, [
            Sample("sli:request_rate", M, arrivals * (1 - failing)),
            Sample("sli:failure_rate", make_labels({**dict(M), "reason": "timeout"}),
                   arrivals * failing),
            Sample("sli:kv_cache_utilization", M, 0.02 * arrivals * rng.lognormal(0, 0.03)),
            Sample("sli:gpu_utilization", gpu, 0.03 * arrivals * rng.lognormal(0, 0.05)),
        ])
        ts += 30.0
    store.flush()
    for i in range(0, 10):
        assert detect(store, spec, NOW - i * 30.0) == []
    # The same data judged against successes alone: it fires (what the default prevents).
    old = spec.model_copy(update={"load_series": "sli:request_rate"})
    assert detect(store, old, NOW)


# --- firing instances: fitted load response and hysteresis (issue 20 item 2) ----------------


def _model_on_a_ramp(seed: int = 0) -> tuple[RegressionSpec, LoadModel]:
    """A fill rate following load with elasticity 0.7 over a baseline whose load moved
    little (±3 %): the slope's interval is wide."""
    rng = np.random.default_rng(seed)
    spec = SPEC.model_copy(update={"elasticity": (0.0, 1.0)})
    x = 20 * (1 + 0.03 * np.sin(np.linspace(0, 3, 240))) * rng.lognormal(0, 0.02, 240)
    y = 0.6 * (x / 20) ** 0.7 * rng.lognormal(0, 0.05, 240)
    model = fit_load_model(y, x, spec)
    assert model is not None
    return spec, model


def test_a_firing_instance_is_judged_with_the_fitted_slope_at_any_load() -> None:
    # The load doubled since the held baseline (a daily cycle): a new alert cannot be
    # judged there (the slope's interval is too wide), a firing one is, with the fitted
    # slope: -30 % at this load is still -30 %, and a recovered series is no regression.
    spec, model = _model_on_a_ramp()
    assert model.slopes[2] - model.slopes[0] > 0.2
    load_now = 40.0
    expected = 0.6 * 2 ** model.slopes[1]
    regressed = np.full(5, 0.7 * expected)
    assert judge(model, regressed, load_now, spec) is None
    c = judge(model, regressed, load_now, spec, held=True)
    assert c is not None and abs(c.change + 0.3) < 0.01 and c.elasticity == model.slopes[1]
    assert is_regression(c, spec, held=True)
    recovered = judge(model, np.full(5, expected), load_now, spec, held=True)
    assert recovered is not None and not is_regression(recovered, spec, held=True)


def test_hysteresis_holds_a_firing_instance_at_half_the_thresholds() -> None:
    spec = SPEC.model_copy(update={"min_effect": 0.2, "z_threshold": 4.0})
    c = Comparison(current=0.88, baseline=1.0, change=-0.12, z=-2.5, p_value=0.005,
                   n_recent=5, n_baseline=240)
    assert not is_regression(c, spec)  # would not start an alert
    assert is_regression(c, spec, held=True)  # keeps one firing (>= 10 %, z >= 2)
    assert not is_regression(c._replace(change=-0.08), spec, held=True)  # under half
    assert not is_regression(c._replace(p_value=0.05), spec, held=True)


# --- deploy events and throttle reasons (items 3, 4) ---------------------------------------


def test_deploy_event_texts() -> None:
    key = ("t1", make_labels({"model": "llm", "version": "1"}))
    assert (DeployEvent("version", 0.0, key, math.inf, "1", "2").since_text("10:04")
            == "since version 2 at 10:04 UTC")
    assert DeployEvent("config", 0.0, key, 0.0).since_text("10:04") == (
        "since config change at 10:04 UTC")
    assert DeployEvent("reload", 0.0, key, 0.0).since_text("10:04") == (
        "since reload at 10:04 UTC")


def test_throttle_reasons_rank_with_the_other_signals(store: Store) -> None:
    # Thermally throttled 73 % of the recent window (never before), power-capped as often
    # as before, queue time x1.5: the throttle ranks first, the unchanged cap is no cause.
    g = make_labels({"gpu_uuid": "GPU-0"})
    m = make_labels({"model": "llm", "version": "1"})
    onset = NOW - 600
    ts = NOW - 3 * 3600
    k = 0
    while ts <= NOW:
        on = ts >= onset
        store.write("t1", ts, [
            Sample("sli:queue_time_seconds", m, 0.015 if on else 0.01),
            Sample("sli:gpu_throttle_reason",
                   make_labels({**dict(g), "reason": "hw_thermal_slowdown"}),
                   1.0 if on and (k // 2) % 5 != 0 else 0.0),
            Sample("sli:gpu_throttle_reason", make_labels({**dict(g), "reason": "sw_power_cap"}),
                   1.0 if (k // 2) % 2 == 0 else 0.0),
        ])
        ts += 30.0
        k += 1
    store.flush()
    moved = moved_with(store, "t1", {"model": "llm", "version": "1"},
                       recent=(onset, NOW + 60), baseline=(NOW - 3 * 3600, onset))
    texts = [mv.text for mv in moved]
    assert texts[0] == "GPU throttled: HW slowdown (thermal) 73 % of the window (0 % before)", texts
    assert texts[1] == "queue time 15 ms (+50 %)", texts
    cause = likely_cause(moved)
    assert cause.startswith("GPU throttled: HW slowdown (thermal)") and "power cap" not in cause


def test_a_config_change_is_judged_against_the_hours_before_it_even_with_a_week_ago(
        store: Store) -> None:
    # A week of history exists, and the config changed 10 minutes ago with the fill rate
    # 40 % lower since: the comparison is with the hours just before the change (not the
    # week-ago baseline, which knows nothing of it), and the alert says so.
    fill = step_at(ONSET, 0.6, 0.36)
    write(store, lambda ts: (fill(ts), 20.0, 0.01))
    write(store, lambda ts: (0.6, 20.0, 0.01), start=NOW - WEEK_S - 3 * 3600,
          end=NOW - WEEK_S + 3 * 3600, seed=5)
    store.put_model_config("t1", "llm", {"name": "llm", "max_batch_size": 4}, ONSET)
    spec = SPEC.model_copy(update={"baseline": "week_ago"})
    (f,) = detect(store, spec, NOW)
    ann = dict(f.candidate.annotations)
    assert f.baseline_kind == "trailing" and ann["deploy_event"] == "config"
    assert f"since config change at {time.strftime('%H:%M', time.gmtime(ONSET))} UTC" in (
        ann["summary"]), ann["summary"]
    # A config an hour and more old is no event: the week-ago baseline decides.
    store.put_model_config("t1", "llm", {"name": "llm", "max_batch_size": 8}, NOW - 2 * 3600)
    (f,) = detect(store, spec, NOW)
    assert f.baseline_kind == "week_ago" and "deploy_event" not in dict(f.candidate.annotations)
