"""The evaluation's shortcuts give the answers of the plain path, evaluation after evaluation.

What is held equal (on both backends): the built-in rules as ``serve`` builds them (one shared
load and series history for the regression rules, the verdict screen of
``alerts.stats.regression_verdict``, ``fast_median``, the annotation figures and TargetDown's
hour of ``up`` read for the few targets that need them) against the same rules each on its
own histories, with every read whole (``FEW_TARGETS`` below zero), ``judge`` then
``is_regression`` for every verdict and ``np.median``.  Each evaluation's candidates of every
rule (labels, annotations, value) must be the same, and so the engines' states.

The data: tests/alerts/scenarios.py's fault scenarios (regressions, a deploy, the KV cache
filling, GPUs idle, failures spiking, a target down), plus a steady target with NaN and
infinite samples, one with the GPU fallback (no join series, idle GPUs, requests pending), one
whose counters reset, one that disappears, and one whose scrapes arrive late (a buffer
flushed after an outage, older than the rollup watermark), written as time goes on, with the
rollups run every 5 minutes as serve's maintenance does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from tests.alerts.scenarios import HISTORY_S, T0, Scenario, configs, samples
from tritonwatch.alerts import availability, detect, series_reads
from tritonwatch.alerts.defaults import default_rules, watch_targets
from tritonwatch.alerts.engine import Engine
from tritonwatch.alerts.model import Rule
from tritonwatch.alerts.stats import (
    Comparison,
    fast_median,
    fit_load_model,
    is_regression,
    judge,
    regression_verdict,
    sorted_median,
)
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.schemas.samples import Sample, TargetHealth, make_labels
from tritonwatch.store import Store

START = T0 + HISTORY_S
ONSET = START + 20 * 60
EVALS = [START + 15 * 60 + i * 210.0 for i in range(10)]  # every 3.5 min for 35 min
LATE_AT = EVALS[4]  # the "late" target's scrapes of the 4 minutes before are flushed later
VANISH_AT = ONSET + 5 * 60


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    return make_store()


def _scenarios() -> list[Scenario]:
    faults = [("fill_drop", 0.3), ("kv_filling", 30.0), ("gpu_util_drop", 0.3),
              ("gpu_idle", 1.0), ("failure_spike", 0.1), ("target_down", 60.0),
              ("deploy_bad", 0.3), ("ttft_increase", 0.5)]
    out = [Scenario(kind, size, 0, ONSET) for kind, size in faults]
    # Steady ones, each given a twist below by its rep number.
    out += [Scenario("steady", 0.0, rep, math.inf) for rep in range(5)]
    return out


NAN, FALLBACK, RESET, VANISH, LATE = range(5)  # the steady scenarios' reps


def _twisted(sc: Scenario, ts: float, batch: list[Sample], i: int) -> list[Sample]:
    if sc.kind != "steady":
        return batch
    out = []
    for s in batch:
        if sc.rep == NAN and s.name in ("sli:kv_cache_utilization", "sli:gpu_utilization",
                                        "sli:request_rate") and i % 7 == 3:
            s = s._replace(value=math.nan if i % 2 else math.inf)
        if sc.rep == FALLBACK:
            if s.name == "sli:gpu_idle_while_queued":
                continue  # Triton's own view only
            if s.name == "sli:gpu_utilization":
                s = s._replace(value=s.value * 0.05)
            if s.name == "sli:pending_requests":
                s = s._replace(value=s.value + 1.0)
        out.append(s)
    if sc.rep == RESET:
        # A raw counter that restarts (a server restart) with the rates going to zero.
        restarted = ts >= ONSET
        base = (ts - ONSET) if restarted else (ts - T0) + 1e6
        out.append(Sample("nv_inference_request_success",
                          make_labels({"model": "llm", "version": "1"}), base * 20.0))
        if restarted and ts < ONSET + 120:
            out = [s._replace(value=0.0) if s.name == "sli:request_rate" else s for s in out]
    return out


class Feed:
    """The scenarios' scrapes, written up to a time as the evaluations go on."""

    def __init__(self, store: Store) -> None:
        self.store = store
        rng = np.random.default_rng(7)
        self.scs = _scenarios()
        self.pending: list[tuple[float, str, list[Sample]]] = []
        for sc in self.scs:
            for i, (ts, batch) in enumerate(samples(sc, rng)):
                if sc.kind == "steady" and sc.rep == VANISH and ts >= VANISH_AT:
                    break
                self.pending.append((ts, sc.target, _twisted(sc, ts, batch, i)))
        self.pending.sort(key=lambda p: p[0])
        self.held: list[tuple[float, str, list[Sample]]] = []
        self.rolled = T0
        for sc in self.scs:
            for model, config, at in configs(sc):
                store.put_model_config(sc.target, model, config, at)

    @property
    def targets(self) -> list[str]:
        return [sc.target for sc in self.scs]

    def until(self, now: float) -> None:
        late = next(sc.target for sc in self.scs if sc.kind == "steady" and sc.rep == LATE)
        n = 0
        while n < len(self.pending) and self.pending[n][0] <= now:
            ts, target, batch = self.pending[n]
            n += 1
            if target == late and LATE_AT - 240 < ts <= LATE_AT:
                self.held.append((ts, target, batch))  # its buffer waits for the next flush
                continue
            self._write(ts, target, batch)
        del self.pending[:n]
        if now > LATE_AT and self.held:
            for ts, target, batch in self.held:
                self._write(ts, target, batch)
            self.held = []
        self.store.flush()
        while self.rolled + 300 <= now:
            self.rolled += 300
            self.store.maintenance.rollup(self.rolled)

    def _write(self, ts: float, target: str, batch: list[Sample]) -> None:
        self.store.write(target, ts, batch)
        up = next((s.value for s in batch if s.name == "up"), 1.0)
        self.store.write_health(TargetHealth(target, "metrics", ts, up >= 1, 0.01, len(batch)))


class Recording:
    """``rule`` with the candidates of its last evaluation kept."""

    def __init__(self, rule: Rule, out: dict[str, list[str]]) -> None:
        self.rule, self.out = rule, out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rule, name)

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        found = self.rule.evaluate(store, now)
        # repr: a NaN value equals itself as text.
        self.out[self.rule.name] = sorted(repr(c) for c in found)
        return found


def _reference_verdict(model: Any, recent: Any, load_now: float | None,
                       spec: RegressionSpec) -> tuple[bool, Comparison | None]:
    c = judge(model, recent, load_now, spec)
    return c is not None, (c if c is not None and is_regression(c, spec) else None)


def _np_median(values: Any) -> float:
    return float(np.median(values))


@contextmanager
def plain() -> Iterator[None]:
    """The rules take the plain path while in it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(series_reads, "FEW_TARGETS", -1)
        patch.setattr(availability, "FEW_TARGETS", -1)
        patch.setattr(detect, "regression_verdict", _reference_verdict)
        patch.setattr(detect, "fast_median", _np_median)
        yield


def test_shortcuts_answer_as_the_plain_path(store: Store) -> None:
    feed = Feed(store)
    configured = feed.targets  # the vanished one too: it is down, not removed
    fast_out: dict[str, list[str]] = {}
    ref_out: dict[str, list[str]] = {}
    fast_rules = default_rules(None)  # as serve builds them: one shared history
    n = len(fast_rules)
    # Each rule on its own histories: a fresh set of rules per rule.
    ref_rules = [default_rules(None, loads={})[i] for i in range(n)]
    for rules in (fast_rules, ref_rules):
        watch_targets(rules, configured)
    fast = Engine([Recording(r, fast_out) for r in fast_rules], store, eval_interval=30.0,
                  persist=False)
    ref = Engine([Recording(r, ref_out) for r in ref_rules], store, eval_interval=30.0,
                 persist=False)
    fired: set[str] = set()
    for now in EVALS:
        feed.until(now)
        fast.evaluate(now)
        with plain():
            ref.evaluate(now)
        assert fast_out == ref_out, now
        assert [(s.fingerprint, s.status, repr(s.value)) for s in fast.states()] == [
            (s.fingerprint, s.status, repr(s.value)) for s in ref.states()], now
        fired |= {name for name, found in fast_out.items() if found}
    # Not vacuous: most rules had candidates at some evaluation (their costly paths ran).
    assert {"batch_fill_rate_regression", "kv_cache_saturation", "kv_cache_exhaustion_forecast",
            "gpu_utilization_regression", "gpu_idle_while_queued", "failure_ratio_spike",
            "target_down", "ttft_regression"} <= fired, fired
    # The GPU rules share one load history: a GPU's load is its whole target's (summed over
    # the target's models), one array for every GPU of the target and both rules, where each
    # rule on its own histories sums its own (equal: the answers above).
    sums: dict[str, list[Any]] = {}
    for rule in fast_rules:
        if rule.name in ("gpu_utilization_regression", "gpu_efficiency_regression"):
            cache = rule.cache  # type: ignore[attr-defined]
            for (target, _), model in cache._models["trailing"].items():
                if model is not None and model.x is not None and model.x.base is None:
                    sums.setdefault(target, []).append(model.x)
    assert max(map(len, sums.values())) >= 2, sums  # both rules (and each GPU) share it
    assert all(x is xs[0] for xs in sums.values() for x in xs)


def test_fast_median_is_np_median_bit_for_bit() -> None:
    # Up to a 4-hour baseline of 1-minute buckets (the load models' medians), and past the
    # length where it hands over to np.median.
    rng = np.random.default_rng(3)
    for i in range(20_000):
        n = int(rng.integers(1, 80)) if i % 4 else int(rng.integers(80, 300))
        if i % 997 == 0:
            n = int(rng.integers(4000, 4200))
        x = rng.lognormal(0.0, 3.0, n) * rng.choice([1.0, -1.0], n)
        if i % 3 == 0:
            x = np.round(x, 1)  # ties
        if i % 7 == 0:
            x[0] = np.inf
        if i % 13 == 0:
            x[-1] = np.nan
        want = float(np.median(x))
        got = fast_median(x)
        assert got == want or (math.isnan(got) and math.isnan(want)), x
        assert sorted_median(np.sort(x)) == want or math.isnan(want), x
        if i % 5 == 0:  # np.nanmedian, as the load model takes it: the median less the NaNs
            x[rng.random(n) < 0.3] = np.nan
            if (~np.isnan(x)).any():
                assert fast_median(x[~np.isnan(x)]) == float(np.nanmedian(x)), x


def test_regression_verdict_is_judge_then_is_regression() -> None:
    rng = np.random.default_rng(5)
    spec = RegressionSpec.model_validate({"name": "r", "series": "s", "direction": "down",
                                          "min_baseline": 0.01, "elasticity": [0.0, 1.0]})
    seen = {True: 0, False: 0}
    for i in range(3_000):
        x = rng.lognormal(0.0, 0.3, 240)
        y = 0.6 * x ** 0.7 * rng.lognormal(0.0, 0.05, 240)
        model = fit_load_model(y, x if i % 5 else None, spec)
        assert model is not None
        drop = float(rng.choice([0.0, 0.1, 0.2, 0.5]))
        load = float(rng.lognormal(0.0, 0.3)) if i % 5 else None
        recent = 0.6 * (load or 1.0) ** 0.7 * (1 - drop) * rng.lognormal(0.0, 0.05, 5)
        c = judge(model, recent, load, spec)
        want = (c is not None, c if c is not None and is_regression(c, spec) else None)
        got = regression_verdict(model, recent, load, spec)
        assert got == want
        seen[want[1] is not None] += 1
    assert seen[True] > 100 and seen[False] > 100, seen


def test_a_load_model_keeps_its_fitted_points_and_gives_each_slopes_residuals_sorted() -> None:
    # Models are kept per instance for a quantum: they hold the buckets they were given (no
    # copy: rows of the cache's histories), not the fitted points nor three sorted residual
    # arrays, and build a slope's residuals when a comparison needs them.
    rng = np.random.default_rng(11)
    spec = RegressionSpec.model_validate({"name": "r", "series": "s", "direction": "down",
                                          "min_baseline": 0.01, "elasticity": [0.0, 1.0]})
    for i in range(200):
        x = rng.lognormal(0.0, 0.3, 240)
        y = 0.6 * x ** 0.7 * rng.lognormal(0.0, 0.05, 240)
        y[rng.integers(0, 240, 20)] = np.nan  # empty buckets are not fitted
        with_load = i % 4 != 0
        model = fit_load_model(y, x if with_load else None, spec)
        assert model is not None
        finite = int(np.isfinite(y).sum())
        assert len(model.ly) == model.n <= finite and (with_load or model.n == finite)
        assert (model.lx is not None) == with_load
        arrays = [v for f in dataclasses.fields(model)
                  if isinstance(v := getattr(model, f.name), np.ndarray)]
        assert len(arrays) == (2 if with_load else 1)
        assert model.y is y and model.x is (x if with_load else None)
        # A history keeps float32 buckets (alerts.history.STORED): fitted on such a row, a
        # model is the one fitted on its float64 copy, number for number.
        y32, x32 = y.astype(np.float32), x.astype(np.float32)
        m32 = fit_load_model(y32, x32 if with_load else None, spec)
        m64 = fit_load_model(y32.astype(np.float64),
                             x32.astype(np.float64) if with_load else None, spec)
        assert m32 is not None and m64 is not None
        assert (m32.slopes, m32.intercepts, m32.n) == (m64.slopes, m64.intercepts, m64.n)
        assert m32.ly.dtype == np.float64 and m32.ly.tobytes() == m64.ly.tobytes()
        for k in range(3):
            assert m32.residuals(k).tobytes() == m64.residuals(k).tobytes()
        for k, b in enumerate(model.slopes):
            r = model.residuals(k)
            lx = model.lx if model.lx is not None else 0.0
            want = np.sort(model.ly - b * lx - model.intercepts[k])
            assert r.tobytes() == want.tobytes()  # bit for bit the old arrays
            assert abs(float(np.median(r))) < 1e-12  # the intercept centres them
