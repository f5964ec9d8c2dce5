"""The built-in rules (alerts/defaults.py): each fires on its fault and stays quiet on steady
noisy traffic and on a traffic drop.  Data: tests/alerts/scenarios.py's generator, in a real
SQLite store."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tritonwatch.alerts.defaults
from tests.alerts.scenarios import HISTORY_S, SPAN_S, T0, Scenario, configs, samples
from tests.alerts.test_history import CountingStore
from tritonwatch.alerts.availability import FailureRatioSpikeRule, sums_counts
from tritonwatch.alerts.capacity import KvCacheForecastRule
from tritonwatch.alerts.defaults import default_rules
from tritonwatch.alerts.model import Rule
from tritonwatch.alerts.series_reads import group_sums
from tritonwatch.schemas.regressions import DEFAULT_RULE_NAMES, DefaultsSpec
from tritonwatch.schemas.samples import Sample, TargetHealth, make_labels
from tritonwatch.store import Query, Store

START = T0 + HISTORY_S  # evaluated span begins
ONSET = START + 20 * 60
M = make_labels({"model": "llm", "version": "1"})


def load(store: Store, *scs: Scenario, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    for sc in scs:
        for ts, ss in samples(sc, rng):
            store.write(sc.target, ts, ss)
    store.flush()
    for sc in scs:
        for model, config, at in configs(sc):
            store.put_model_config(sc.target, model, config, at)


def rule(name: str, spec: DefaultsSpec | None = None) -> Rule:
    (r,) = [r for r in default_rules(spec) if r.name == name]
    return r


def failure_rule() -> FailureRatioSpikeRule:
    r = rule("failure_ratio_spike")
    assert isinstance(r, FailureRatioSpikeRule)
    return r


def forecast_rule() -> KvCacheForecastRule:
    r = rule("kv_cache_exhaustion_forecast")
    assert isinstance(r, KvCacheForecastRule)
    return r


def test_all_defaults_documented() -> None:
    rules = default_rules(None)
    assert [r.name for r in rules] == list(DEFAULT_RULE_NAMES)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Built-in alerts", 1)[1].split("\n## ", 1)[0]
    for r in rules:
        assert r.for_s >= 0 and r.keep_firing_for_s >= 0
        assert f"`{r.name}`" in section


def test_defaults_spec_disable_enable_override() -> None:
    assert default_rules(DefaultsSpec(enabled=False)) == []
    names = [r.name for r in default_rules(DefaultsSpec(disable=["target_down"]))]
    assert "target_down" not in names and len(names) == len(DEFAULT_RULE_NAMES) - 1
    spec = DefaultsSpec.model_validate({"overrides": {
        "kv_cache_saturation": {"threshold": 0.99, "for": "15m"},
        "ttft_regression": {"min_effect": 0.5, "keep_firing_for": "1h", "baseline": "trailing"},
    }})
    kv = rule("kv_cache_saturation", spec)
    assert (kv.for_s, getattr(kv, "threshold")) == (900.0, 0.99)  # noqa: B009
    ttft = rule("ttft_regression", spec)
    assert ttft.keep_firing_for_s == 3600.0
    assert getattr(ttft, "spec").min_effect == 0.5  # noqa: B009
    with pytest.raises(ValueError, match="unknown built-in rule"):
        DefaultsSpec(disable=["no_such_rule"])


# (kind, size, rule, minutes after onset when the condition must hold)
FAULTS = [
    ("fill_drop", 0.3, "batch_fill_rate_regression", 20),
    ("kv_filling", 30.0, "kv_cache_saturation", 29),
    ("kv_filling", 30.0, "kv_cache_exhaustion_forecast", 18),
    ("kv_filling", 60.0, "kv_cache_regression", 30),
    ("gpu_util_drop", 0.3, "gpu_utilization_regression", 20),
    ("gpu_idle", 1.0, "gpu_idle_while_queued", 3),
    ("ttft_increase", 0.5, "ttft_regression", 20),
    ("itl_increase", 0.5, "itl_regression", 20),
    ("failure_spike", 0.1, "failure_ratio_spike", 4),
    ("target_down", 60.0, "target_down", 1),
]


@pytest.mark.parametrize(("kind", "size", "name", "after"), FAULTS,
                         ids=[f[2] for f in FAULTS])
def test_fires_on_its_fault(store: Store, kind: str, size: float, name: str,
                            after: int) -> None:
    sc = Scenario(kind, size, 0, ONSET)
    load(store, sc)
    r = rule(name)
    assert r.evaluate(store, ONSET - 60) == []
    cands = r.evaluate(store, ONSET + after * 60)
    assert len(cands) == 1, cands
    labels = dict(cands[0].labels)
    assert labels["target"] == sc.target and labels["rule"] == name
    assert labels["alertname"][0].isupper()
    ann = dict(cands[0].annotations)
    assert re.search(r"\d", ann["summary"]) or name == "target_down", ann
    assert re.search(r"\d", ann["description"]), ann
    # Nothing that moves is a label.
    assert not any(re.fullmatch(r"[\d.]+", v) for k, v in labels.items() if k != "version")


@pytest.mark.parametrize(("kind", "size"), [("steady", 0.0), ("traffic_drop", 0.5)])
@pytest.mark.parametrize("seed", [1, 2])
def test_quiet_on_steady_traffic_and_traffic_drop(store: Store, kind: str, size: float,
                                                  seed: int) -> None:
    load(store, Scenario(kind, size, 0, ONSET), seed=seed)
    rules = default_rules(None)
    t = START
    while t <= START + SPAN_S:
        for r in rules:
            assert r.evaluate(store, t) == [], (r.name, t - ONSET)
        t += 600.0


@pytest.mark.parametrize("drop", [0.21, 0.24, 0.25])
def test_fill_rate_that_follows_a_traffic_drop_is_not_a_regression(store: Store,
                                                                   drop: float) -> None:
    # Fill rate proportional to load, traffic down 21-25 %: the fill rate falls by as much, so
    # a load guard as wide as min_effect (it was ±25 %) let it through as a regression.
    rng = np.random.default_rng(7)
    now = T0 + 6 * 3600.0
    ts = T0
    while ts <= now:
        rate = 100.0 * ((1 - drop) if ts >= now - 900 else 1.0) * rng.uniform(0.97, 1.03)
        fill = 0.5 * rate / 100.0 * rng.uniform(0.97, 1.03)
        store.write("t1", ts, [Sample("sli:request_rate", M, rate),
                               Sample("sli:batch_fill_rate", M, fill)])
        ts += 15.0
    store.flush()
    spec = getattr(rule("batch_fill_rate_regression"), "spec")  # noqa: B009
    assert rule("batch_fill_rate_regression").evaluate(store, now) == []
    # The same data without the load model would fire: the model is what keeps it quiet.
    from tritonwatch.alerts.detect import detect

    assert detect(store, spec.model_copy(update={"load_series": None}), now)


@pytest.mark.parametrize("name", ["batch_fill_rate_regression", "kv_cache_regression",
                                  "gpu_utilization_regression", "gpu_efficiency_regression",
                                  "ttft_regression", "itl_regression"])
def test_regression_defaults_model_load_and_accept_the_old_tolerance(name: str) -> None:
    spec = getattr(rule(name), "spec")  # noqa: B009
    # Judged at the same load (each against its driver, the request rate where none is
    # exported), none of them falling when load rises.
    arrivals = ("sli:request_rate", "sli:failure_rate")  # every arrival
    driver = {"kv_cache_regression": "sli:llm_active_requests",
              "ttft_regression": "sli:prompt_tokens_rate"}.get(name)
    if driver is None:
        assert spec.load_series == arrivals and spec.load_fallback is None
    else:
        assert spec.load_series == driver and spec.load_fallback == arrivals
    assert spec.elasticity is not None and spec.elasticity[0] == 0.0
    # Rules files written for the comparable-load guard still load; the key is ignored.
    old = DefaultsSpec.model_validate({"overrides": {name: {"load_tolerance": 0.2,
                                                            "min_effect": 0.3}}})
    assert getattr(rule(name, old), "spec").min_effect == 0.3  # noqa: B009


def test_annotation_numbers(store: Store) -> None:
    load(store, Scenario("ttft_increase", 0.5, 0, ONSET))
    (c,) = rule("ttft_regression").evaluate(store, ONSET + 25 * 60)
    ann = dict(c.annotations)
    assert re.match(r"TTFT \+\d+ % vs last 4h", ann["summary"]), ann["summary"]
    # Every signal is quoted in the description, the ones that moved 10 % or more (the
    # likely cause) in the summary too.
    assert "KV-cache utilization" in ann["description"] and "queue time" in ann["description"]
    assert ann["likely_cause"] in ann["summary"] or ann["likely_cause"].startswith("none")
    assert 35 <= float(ann["change_percent"]) <= 65
    assert dict(c.labels)["probe"] == "p-ttft_increase-0.5-0"


def test_failure_spike_needs_traffic(store: Store) -> None:
    fail = make_labels({**dict(M), "reason": "timeout"})
    for i in range(200):
        ts = START + i * 30.0
        store.write("quiet", ts, [Sample("sli:request_rate", M, 0.05),
                                  Sample("sli:failure_rate", fail, 0.05 if i > 150 else 0.0)])
    store.flush()
    now = START + 199 * 30.0
    assert rule("failure_ratio_spike").evaluate(store, now) == []
    spec = DefaultsSpec.model_validate({"overrides": {"failure_ratio_spike": {"min_traffic": 0}}})
    (c,) = rule("failure_ratio_spike", spec).evaluate(store, now)
    assert dict(c.labels)["reason"] == "timeout"
    assert float(dict(c.annotations)["failure_ratio"]) == pytest.approx(0.5)


def test_target_down_when_scrapes_stop(store: Store) -> None:
    for i in range(20):
        store.write("gone", START + i * 30.0, [Sample("up", (), 1.0)])
    store.flush()
    last = START + 19 * 30.0
    r = rule("target_down")
    assert r.evaluate(store, last + 60) == []
    (c,) = r.evaluate(store, last + 300)
    assert "not been scraped" in dict(c.annotations)["description"]
    assert dict(c.labels) == {"alertname": "TargetDown", "rule": "target_down",
                              "target": "gone", "severity": "critical"}


def test_target_down_from_health(store: Store) -> None:
    store.write_health(TargetHealth("h1", "metrics", START, False, 0.1, 0, "connection refused"))
    store.flush()
    (c,) = rule("target_down").evaluate(store, START + 10)
    assert "connection refused" in dict(c.annotations)["description"]


def test_gpu_idle_from_triton_metrics_only(store: Store) -> None:
    g = make_labels({"gpu_uuid": "GPU-0"})
    for i in range(10):
        store.write("t", START + i * 30.0, [Sample("sli:gpu_utilization", g, 0.02),
                                            Sample("sli:pending_requests", M, 6.0)])
    store.flush()
    now = START + 9 * 30.0
    (c,) = rule("gpu_idle_while_queued").evaluate(store, now)
    assert dict(c.labels)["gpu_uuid"] == "GPU-0"
    assert "pending" in dict(c.annotations)["summary"]


def test_gpu_idle_fallback_sums_pending_per_target(store: Store) -> None:
    """Each target's queue is the sum over its own models only (summed in one pass)."""
    g = make_labels({"gpu_uuid": "GPU-0"})
    m2 = make_labels({"model": "other", "version": "1"})
    for i in range(10):
        ts = START + i * 30.0
        # t1: 0.6 + 0.6 pending over two models; t2: 0.6 on one (under one request).
        store.write("t1", ts, [Sample("sli:gpu_utilization", g, 0.02),
                               Sample("sli:pending_requests", M, 0.6),
                               Sample("sli:pending_requests", m2, 0.6)])
        store.write("t2", ts, [Sample("sli:gpu_utilization", g, 0.02),
                               Sample("sli:pending_requests", M, 0.6)])
    store.flush()
    (c,) = rule("gpu_idle_while_queued").evaluate(store, START + 9 * 30.0)
    assert dict(c.labels)["target"] == "t1"
    assert "1.2 requests pending on t1" in dict(c.annotations)["summary"]


# --- bounded evaluation cost: rollups and windows kept between evaluations ---------------------

FAIL = make_labels({**dict(M), "reason": "timeout"})


def _failure_history(store: Store, start: float, end: float) -> None:
    rng = np.random.default_rng(7)
    ts = start
    while ts <= end:
        store.write("t1", ts, [Sample("sli:request_rate", M, float(rng.uniform(5, 15))),
                               Sample("sli:failure_rate", FAIL, float(rng.uniform(0, 0.5)))])
        ts += 15.0
    store.flush()


def _raw_mean(store: Store, name: str, lo: float, hi: float) -> float:
    (sd,) = store.read(Query(name, start=lo, end=hi)).series()
    vals = [v for v in sd.values if np.isfinite(v)]
    return sum(vals) / len(vals)


def test_failure_baseline_from_rollups_equals_the_raw_one(store: Store) -> None:
    now = START + 3 * 3600.0  # on the 5-minute grid
    _failure_history(store, now - 3 * 3600, now)
    # The baseline hour is below the watermark: served by the 5 m rollup.
    store.maintenance.rollup(now)
    r = failure_rule()
    b0, b1 = r.baseline_span(now + 45)
    assert (b0, b1) == (now - 3900, now - 300)  # whole 5-minute intervals before the window
    ok, fail = r._base(store, now + 45)  # kept as each instance's mean rate
    (ok_mean,) = ok.values()
    (fail_mean,) = fail.values()
    assert ok_mean == pytest.approx(
        _raw_mean(store, "sli:request_rate", b0, b1 - 0.001), rel=1e-12)
    assert fail_mean == pytest.approx(
        _raw_mean(store, "sli:failure_rate", b0, b1 - 0.001), rel=1e-12)
    (ok_sc,) = sums_counts(
        store, "sli:request_rate", b0, b1 - 0.001, ("model", "version")).values()
    assert ok_sc[1] == 240  # 12 intervals x 20 samples


def test_sums_of_groups_without_failures_are_left_out_and_the_rest_kept(store: Store) -> None:
    # By (model, reason): BACKEND fails; OTHER has one series failing and one not (an extra
    # label apart: the group's count holds both); REJECTED never fails, on t1 with +Inf
    # samples too (its buckets' sums are not finite, so it is read raw); t2 fails nowhere.
    def lbl(reason: str, x: str = "") -> tuple[tuple[str, str], ...]:
        return make_labels({"model": "llm", "reason": reason, **({"x": x} if x else {})})

    now = START + 2 * 3600.0
    for i in range(480):
        ts = now - 2 * 3600 + 15 * i
        for target in ("t1", "t2"):
            fails = target == "t1"
            store.write(target, ts, [
                Sample("sli:failure_rate", lbl("BACKEND"), 0.25 * (i % 3) if fails else 0.0),
                Sample("sli:failure_rate", lbl("OTHER", "1"), 0.0),
                Sample("sli:failure_rate", lbl("OTHER", "2"), 0.5 if fails else 0.0),
                Sample("sli:failure_rate", lbl("REJECTED"),
                       float("inf") if fails and i % 50 == 0 else 0.0)])
    store.flush()
    store.maintenance.rollup(now)
    by = ("model", "reason")
    failing = {("t1", lbl("BACKEND")), ("t1", lbl("OTHER")), ("t1", lbl("REJECTED"))}
    lo, hi = now - 3900, now - 300.001
    every = sums_counts(store, "sli:failure_rate", lo, hi, by)
    assert len(every) == 6 and every[("t1", lbl("OTHER"))] == [0.5 * 240, 2 * 240]
    assert every[("t1", lbl("REJECTED"))] == [0.0, 235]  # 5 +Inf samples left out
    kept = sums_counts(store, "sli:failure_rate", lo, hi, by, nonzero=True)
    assert kept == {k: v for k, v in every.items() if k in failing}

    window = Query("sli:failure_rate", start=now - 300, end=now)
    every = group_sums(store.finite_sums(window), by)
    assert len(every) == 6 and every[("t1", lbl("OTHER"))] == [0.5 * 20, 2 * 20]
    kept = group_sums(store.finite_sums(window), by, nonzero=True)
    assert kept == {k: v for k, v in every.items() if k in failing - {("t1", lbl("REJECTED"))}}


def test_failure_baseline_skips_non_finite_samples_like_the_raw_read(store: Store) -> None:
    now = START + 3600.0
    _failure_history(store, now - 3600, now)
    store.write("t1", now - 1000, [Sample("sli:failure_rate", FAIL, float("nan"))])
    store.write("t1", now - 2000, [Sample("sli:failure_rate", FAIL, float("inf"))])
    store.flush()
    got = sums_counts(
        store, "sli:failure_rate", now - 3600, now - 300.001, ("model", "reason"))
    (sc,) = got.values()
    assert sc[0] / sc[1] == pytest.approx(
        _raw_mean(store, "sli:failure_rate", now - 3600, now - 300.001), rel=1e-12)


def test_failure_baseline_is_read_once_per_five_minutes(store: Store) -> None:
    now = START + 3 * 3600.0
    _failure_history(store, now - 2 * 3600, now + 600)
    counting = CountingStore(store)
    r = failure_rule()
    for i in range(10):
        r.evaluate(counting.as_store(), now + i * 30.0)
    old = [c for c in counting.calls if c[2] < now - 400]
    assert len(old) == 4  # sum and count of two series, once
    assert all(end - start <= 3600 for _, _, start, end in old)
    r.evaluate(counting.as_store(), now + 300)
    assert len([c for c in counting.calls if c[2] < now - 400]) == 8


def test_failure_spike_from_rollups_fires_as_before(store: Store) -> None:
    now = START + 3 * 3600.0
    for i in range(int(2 * 3600 / 15) + 1):
        ts = now - 2 * 3600 + i * 15.0
        bad = ts > now - 300
        store.write("t1", ts, [Sample("sli:request_rate", M, 8.0 if bad else 10.0),
                               Sample("sli:failure_rate", FAIL, 2.0 if bad else 0.05)])
    store.flush()
    store.maintenance.rollup(now)
    (c,) = failure_rule().evaluate(store, now)
    ann = dict(c.annotations)
    assert float(ann["failure_ratio"]) == pytest.approx(0.2)
    assert float(ann["baseline_ratio"]) == pytest.approx(0.05 / 10.05, rel=1e-3)


def test_forecast_keeps_old_buckets_and_agrees_with_a_fresh_read(store: Store) -> None:
    load(store, Scenario("kv_exhaustion", 0.5, 0, ONSET))
    kept = forecast_rule()
    counting = CountingStore(store)
    seen = 0
    for i in range(40):
        now = ONSET + i * 30.0
        got = kept._points(counting.as_store(), now)
        fresh = forecast_rule()._points(store, now)
        assert got.keys() == fresh.keys()
        for key, (t, y) in fresh.items():
            np.testing.assert_array_equal(got[key][0], t)
            np.testing.assert_allclose(got[key][1], y, rtol=1e-12)
        seen += len(fresh)
        kept.evaluate(store, now)
        # Per evaluation one read, from where the kept part ended (the last step 2 min back at
        # the evaluation before): no more than a step, the grace and the 30 s since.
        assert len(counting.calls) == (2 if i == 0 else i + 2)
        assert counting.calls[-1][3] - counting.calls[-1][2] <= 60 + 120 + 30
    # 20 minutes: the kept part read whole at first, then slid on by every read after it (two
    # per ``now``: ``evaluate`` reads through the store itself, not the counting one).
    assert kept._recent is not None and kept._recent.history.reads == 2 * 40
    assert seen >= 40


def test_builtin_and_file_regressions_read_the_load_once(store: Store) -> None:
    # Every regression rule of a rules file (its own and the six built-in ones) weighs load
    # over the same windows: by request rate (or falls back to it: the KV-cache and TTFT
    # rules, modelled on requests in flight and the prompt-token rate), by requests in
    # flight, by prompt tokens: one history of each, read once per slice, for all.
    from tritonwatch.alerts.detect import RegressionRule
    from tritonwatch.alerts.rules import rules_from_file
    from tritonwatch.schemas.rules import validate_rules

    load(store, Scenario("steady", 0.0, 0, ONSET))
    rules = rules_from_file(validate_rules({"regressions": [
        {"name": "fill_rate_drop", "series": "sli:batch_fill_rate", "direction": "down",
         "baseline": "trailing", "baseline_window": "4h", "recent_window": "5m"},
    ]}))
    regressions = [r for r in rules if isinstance(r, RegressionRule)]
    assert len(regressions) == 7
    counting = CountingStore(store)
    for r in regressions:
        assert r.evaluate(counting.as_store(), START) == []
    caches = [c for r in regressions for c in (r.cache, r.cache.fallback) if c is not None]
    assert len(caches) == 9  # the KV-cache and TTFT rules' fallbacks too
    loads = {(c.spec.load_series, kind, id(c._load[kind])) for c in caches for kind in c._load}
    # week_ago and trailing per driver, each one history for all rules with that driver
    assert len(loads) == 6, loads
    assert len({x[:2] for x in loads}) == 6
    # Baseline reads start before the recent window: one per kind (an hour of its 4-hour
    # window at a time), not one per rule and kind.
    baseline_reads = [c for c in counting.calls
                      if c[1] == "sli:request_rate" and c[2] < START - 900.0 - 300.0]
    assert len(baseline_reads) == len(set(baseline_reads)) == 2 * 4, baseline_reads


def test_target_down_judges_only_the_configured_targets(store: Store) -> None:
    # The store keeps the history of a target taken out of the config; it is gone, not down.
    now = T0 + 3600.0
    for ts in np.arange(now - 900, now - 600, 15.0):
        for target in ("kept", "removed"):
            store.write(target, float(ts), [Sample("up", (), 1.0)])
    store.flush()
    r = rule("target_down")
    assert sorted(dict(c.labels)["target"] for c in r.evaluate(store, now)) == [
        "kept", "removed"]
    tritonwatch.alerts.defaults.watch_targets([r], ["kept", "never-scraped"])
    assert [dict(c.labels)["target"] for c in r.evaluate(store, now)] == ["kept"]
