"""Built-in alert rules: what Tritonwatch flags with no rules file at all.

=============================== ===================================================================
rule (alertname)                what it flags, thresholds, timings
=============================== ===================================================================
``batch_fill_rate_regression``  ``sli:batch_fill_rate`` down >= 15 % against what the baseline
(BatchFillRateRegression)       expects at the request rate now (median of the last 5 min;
                                baseline the same hours last week, else the 4 h before; load
                                model, robust z >= 3 and Mann-Whitney p <= 0.001 on the
                                residuals: see detect.py).  The baseline is held from onset
                                until the alert resolves.  for 0, keep firing 5 min.
                                severity=warning
``kv_cache_saturation``         ``sli:kv_cache_utilization`` (2 min mean) >= 90 %.
(KVCacheSaturation)             for 10 min, keep firing 5 min. severity=warning
``kv_cache_exhaustion_forecast`` a least-squares line through the last 30 min of
(KVCacheExhaustionForecast)     ``sli:kv_cache_utilization`` (1 min means, >= 10 of them, slope
                                t-statistic >= 3; whole buckets only) reaches 100 % within
                                30 min while below it now.
                                for 5 min, keep firing 10 min. severity=warning
``kv_cache_regression``         ``sli:kv_cache_utilization`` up >= 15 % at the same load (same test,
(KVCacheRegression)             baseline level above 5 %). for 0, keep firing 5 min.
                                severity=warning
``gpu_utilization_regression``  ``sli:gpu_utilization`` per ``gpu_uuid`` down >= 15 % (same test)
(GPUUtilizationRegression)      against the target's total request rate. for 0, keep firing
                                5 min. severity=warning
``gpu_efficiency_regression``   ``sli:gpu_utilization`` per ``gpu_uuid`` *up* >= 15 % at the same
(GPUEfficiencyRegression)       load (more GPU per unit of load), likewise.
``gpu_idle_while_queued``       ``sli:gpu_idle_while_queued`` (2 min mean) >= 0.5; for targets
(GPUIdleWhileQueued)            without that series: every GPU of the target under 10 %
                                utilization while its models have >= 1 pending request (2 min
                                means). for 5 min, keep firing 5 min. severity=warning
``ttft_regression``             ``probe:ttft_seconds`` per probe and model up >= 15 % (same test)
(TTFTRegression)                at the model's request rate. for 0, keep firing 5 min.
                                severity=warning
``itl_regression``              ``probe:itl_seconds`` likewise. severity=warning
(ITLRegression)
``failure_ratio_spike``         per model and ``reason``: failures / (successes + all failures)
(FailureRatioSpike)             over the last 5 min >= 5 % and >= 2 x the ratio of the hour
                                before + 1 point, with at least 0.2 req/s of traffic.
                                for 2 min, keep firing 5 min. severity=critical
``target_down``                 the target's latest ``up`` sample is 0, or it has not been scraped
(TargetDown)                    for 2 min (``up`` in the last hour, or the store's health), for
                                2 min, keep firing 1 min; configured targets only (serve).
                                severity=critical
=============================== ===================================================================

``DefaultsSpec`` turns all of them off (``enabled: false``), some (``disable``), or adjusts them
(``overrides``: ``threshold``, ``min_effect``, ``z_threshold``, ``baseline``, ``recent_window``,
``baseline_window``, ``load_tolerance``, ``min_traffic``, ``horizon``, ``for``,
``keep_firing_for``).  Labels are ``alertname``, ``rule``, ``target``, ``model``/``version``
(``probe`` for probe rules, ``gpu_uuid`` for GPU rules, ``reason`` for failures) and
``severity``; every number is in the annotations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tritonwatch.alerts.baseline import SharedLoads
from tritonwatch.alerts.detect import RegressionRule
from tritonwatch.alerts.formatting import (
    alertname_for,
    display,
    fmt_change,
    fmt_duration,
    fmt_value,
)
from tritonwatch.alerts.history import QUANTUM_S, RecentBuckets, ceil_to, floor_to
from tritonwatch.alerts.model import Rule
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.regressions import (
    BUILTIN_REGRESSIONS,
    DEFAULT_RULE_NAMES,
    DefaultOverride,
    DefaultsSpec,
    RegressionSpec,
)
from tritonwatch.schemas.samples import Labels, make_labels

if TYPE_CHECKING:
    from tritonwatch.store import SeriesColumns, SeriesKey, Store

_MODEL = ("model", "version")
_ALERTNAMES = {
    "batch_fill_rate_regression": "BatchFillRateRegression",
    "kv_cache_saturation": "KVCacheSaturation",
    "kv_cache_exhaustion_forecast": "KVCacheExhaustionForecast",
    "kv_cache_regression": "KVCacheRegression",
    "gpu_utilization_regression": "GPUUtilizationRegression",
    "gpu_efficiency_regression": "GPUEfficiencyRegression",
    "gpu_idle_while_queued": "GPUIdleWhileQueued",
    "ttft_regression": "TTFTRegression",
    "itl_regression": "ITLRegression",
    "failure_ratio_spike": "FailureRatioSpike",
    "target_down": "TargetDown",
}


def _labels(name: str, target: str, extra: Labels, severity: str) -> Labels:
    lbl = {
        "alertname": _ALERTNAMES.get(name, alertname_for(name)),
        "rule": name,
        "target": target,
        "severity": severity,
    }
    lbl.update(dict(extra))
    return make_labels(lbl)


def _where(labels: Labels) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels) or "all"


def _means(
    store: Store, name: str, now: float, window: float, by: tuple[str, ...]
) -> dict[tuple[str, Labels], float]:
    """Mean over ``[now - window, now]`` of each group (target, ``by`` labels)."""
    acc = _group_sums(store.range_columns(name, start=now - window, end=now), by)
    return {k: a[0] / a[1] for k, a in acc.items() if a[1]}


def _per_series(cols: SeriesColumns) -> npt.NDArray[np.float64]:
    """The sum of each series' points."""
    if not cols.keys:
        return np.empty(0)
    with np.errstate(invalid="ignore", over="ignore"):  # +inf and -inf: NaN, not a warning
        return np.add.reduceat(cols.values, cols.bounds[:-1])


def _group_sums(
    cols: SeriesColumns, by: tuple[str, ...], after: float = -math.inf
) -> dict[tuple[str, Labels], list[float]]:
    """Per group (target, ``by`` labels) of ``cols``' series: ``[sum, count]`` of their finite
    points stamped after ``after``; a group whose series have none is there with zeros."""
    sums, counts = cols.finite_sums(after)
    acc: dict[tuple[str, Labels], list[float]] = {}
    for key, total, n in zip(cols.keys, sums.tolist(), counts.tolist(), strict=True):
        lbl = dict(key.labels)
        a = acc.setdefault((key.target, make_labels({k: lbl[k] for k in by if k in lbl})),
                           [0.0, 0.0])
        a[0] += total
        a[1] += n
    return acc


# --- regression defaults -----------------------------------------------------------------------


def _regression_spec(name: str, o: DefaultOverride | None) -> RegressionSpec:
    common: dict[str, Any] = {
        "name": name,
        "baseline": "week_ago",
        # 5 one-minute buckets: a step change moves their median after 3 to 4 minutes, and
        # the alert fires then (no "for": consecutive windows overlap, so waiting for more
        # evaluations adds delay, not evidence; the effect size, robust z and Mann-Whitney
        # on the window are what keep noise out), within 5 minutes of the start; once it
        # ends the condition clears within 3 minutes and the alert resolves 5 minutes later.
        "recent_window": 300.0,
        "baseline_window": 4 * 3600.0,
        "for": 0.0,
        "keep_firing_for": 300.0,
        # 5 buckets are few: a robust z of 3 with the min_effect of 15 % (which for most
        # series is the tighter of the two) and Mann-Whitney p <= 0.001 on top.
        "z_threshold": 3.0,
        "labels": {"alertname": _ALERTNAMES[name], "severity": "warning"},
    }
    per: dict[str, dict[str, Any]] = {
        # Elasticities (d log series / d log request rate): a batch fills at most in proportion
        # to what arrives, a GPU is busy at most in proportion to the work; KV-cache use is
        # in-flight requests (rate x latency, Little's law), and latency rises with load
        # near saturation: none of them falls when load rises.
        "batch_fill_rate_regression": {
            "series": "sli:batch_fill_rate", "direction": "down", "min_baseline": 0.01,
            "elasticity": (0.0, 1.0),
        },
        "kv_cache_regression": {
            "series": "sli:kv_cache_utilization", "direction": "up", "min_baseline": 0.05,
            "elasticity": (0.0, 2.0),
        },
        "gpu_utilization_regression": {
            "series": "sli:gpu_utilization", "direction": "down", "by": ("gpu_uuid",),
            "min_baseline": 0.05, "elasticity": (0.0, 1.0),
        },
        # The same series the other way: more GPU time per unit of load (a slower kernel,
        # a lost optimisation, a co-tenant) is an efficiency regression.
        "gpu_efficiency_regression": {
            "series": "sli:gpu_utilization", "direction": "up", "by": ("gpu_uuid",),
            "min_baseline": 0.05, "elasticity": (0.0, 1.0),
        },
        "ttft_regression": {
            "series": "probe:ttft_seconds", "direction": "up", "by": ("probe", "model"),
            "elasticity": (0.0, math.inf),
        },
        "itl_regression": {
            "series": "probe:itl_seconds", "direction": "up", "by": ("probe", "model"),
            "elasticity": (0.0, math.inf),
        },
    }
    values = {**common, "min_effect": BUILTIN_REGRESSIONS[name], **per[name]}
    if o is not None:
        for key in ("min_effect", "z_threshold", "baseline", "recent_window",
                    "baseline_window"):
            v = getattr(o, key)
            if v is not None:
                values[key] = v
        if o.for_s is not None:
            values["for"] = o.for_s
        if o.keep_firing_for_s is not None:
            values["keep_firing_for"] = o.keep_firing_for_s
    return RegressionSpec.model_validate(values)


# --- threshold and forecast rules --------------------------------------------------------------


@dataclass
class KvCacheSaturationRule:
    """``sli:kv_cache_utilization`` mean over ``window`` at or above ``threshold``."""

    name: str = "kv_cache_saturation"
    for_s: float = 600.0
    keep_firing_for_s: float = 300.0
    threshold: float = 0.9
    window: float = 120.0

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out: list[AlertCandidate] = []
        util = _means(store, "sli:kv_cache_utilization", now, self.window, _MODEL)
        queue = _means(store, "sli:queue_time_seconds", now, self.window, _MODEL)
        pending = _means(store, "sli:pending_requests", now, self.window, _MODEL)
        for key in sorted(util):
            u = util[key]
            if u < self.threshold:
                continue
            target, labels = key
            moved = [
                f"{display(n)[0]} {fmt_value(m[key], display(n)[1])}"
                for n, m in (("sli:queue_time_seconds", queue), ("sli:pending_requests", pending))
                if key in m
            ]
            summary = f"KV-cache utilization {fmt_value(u, 'ratio')} (>= " + (
                f"{fmt_value(self.threshold, 'ratio')})" + "".join(f"; {t}" for t in moved)
            )
            ann = {
                "summary": summary,
                "description": (
                    f"KV-cache of {_where(labels)} on {target} is {u * 100:.1f} % used "
                    f"({fmt_duration(self.window)} mean), threshold "
                    f"{self.threshold * 100:.0f} %: new requests wait or are preempted."
                ),
                "utilization": f"{u:.4g}",
                "threshold": f"{self.threshold:g}",
            }
            out.append(AlertCandidate(_labels(self.name, target, labels, "warning"),
                                      make_labels(ann), u))
        return out


@dataclass
class KvCacheForecastRule:
    """Linear trend of ``sli:kv_cache_utilization`` reaches ``threshold`` within ``horizon``.

    The fit takes the whole ``step`` buckets starting in ``[now - window, now]`` (the one cut
    by the window's start is left out).  Buckets before the last 5-minute grid line at least
    2 min old are kept between evaluations and read once; the fit itself is recomputed.
    """

    name: str = "kv_cache_exhaustion_forecast"
    for_s: float = 300.0
    keep_firing_for_s: float = 600.0
    threshold: float = 1.0
    window: float = 1800.0
    horizon: float = 1800.0
    step: float = 60.0
    min_points: int = 10
    min_t: float = 3.0

    # Whole buckets of the window up to a 5-minute grid line at least 2 min old are kept
    # between evaluations (each read once); only the rest is read on every evaluation.
    _recent: RecentBuckets | None = field(default=None, init=False, repr=False, compare=False)

    def _points(self, store: Store, now: float) -> dict[tuple[str, Labels], tuple[Any, Any]]:
        """Per model: bucket starts (relative to ``now``) and means, oldest first."""
        if self._recent is None or self._recent.history.step != self.step:
            self._recent = RecentBuckets("sli:kv_cache_utilization", step=self.step, by=_MODEL)
        stamps, groups = self._recent.read(store, now - self.window, now)
        out: dict[tuple[str, Labels], tuple[Any, Any]] = {}
        for key, arr in groups.items():
            ok = ~np.isnan(arr)
            out[key] = (stamps[ok] - now, arr[ok])
        return out

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out: list[AlertCandidate] = []
        for (target, labels), (t, y) in sorted(self._points(store, now).items()):
            if len(y) < self.min_points:
                continue
            t = t + self.step / 2  # bucket midpoints, seconds relative to now
            tm, ym = t.mean(), y.mean()
            sxx = float(((t - tm) ** 2).sum())
            if sxx <= 0:
                continue
            slope = float(((t - tm) * (y - ym)).sum()) / sxx
            level = ym - slope * tm  # fitted value at now
            resid = y - (ym + slope * (t - tm))
            dof = len(y) - 2
            s2 = float((resid**2).sum()) / dof if dof > 0 else 0.0
            se = math.sqrt(s2 / sxx) if s2 > 0 else 0.0
            t_stat = slope / se if se > 0 else (math.inf if slope > 0 else 0.0)
            if slope <= 0 or t_stat < self.min_t or level >= self.threshold:
                continue
            eta = (self.threshold - level) / slope
            if eta > self.horizon:
                continue
            summary = (
                f"KV-cache {fmt_value(level, 'ratio')} and rising "
                f"{slope * 6000:.1f} %/min: full in ~{eta / 60:.0f} min"
            )
            ann = {
                "summary": summary,
                "description": (
                    f"A least-squares line through the last {fmt_duration(self.window)} of "
                    f"KV-cache utilization of {_where(labels)} on {target} ({len(y)} points, "
                    f"slope t={t_stat:.1f}) reaches {self.threshold * 100:.0f} % in "
                    f"{eta / 60:.1f} min (horizon {fmt_duration(self.horizon)})."
                ),
                "utilization": f"{level:.4g}",
                "slope_per_minute": f"{slope * 60:.4g}",
                "seconds_to_exhaustion": f"{eta:.0f}",
            }
            out.append(AlertCandidate(_labels(self.name, target, labels, "warning"),
                                      make_labels(ann), eta))
        return out


@dataclass
class GpuIdleWhileQueuedRule:
    """GPUs idle while requests queue: the GPU join series, else Triton's own view."""

    name: str = "gpu_idle_while_queued"
    for_s: float = 300.0
    keep_firing_for_s: float = 300.0
    threshold: float = 0.1  # utilization under which a GPU is idle (Triton-only fallback)
    window: float = 120.0

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out: list[AlertCandidate] = []
        joined = _means(store, "sli:gpu_idle_while_queued", now, self.window, ("gpu_uuid",))
        pending_gpu = _means(store, "sli:gpu_pending_requests", now, self.window, ("gpu_uuid",))
        util_ratio = _means(store, "sli:gpu_utilization_ratio", now, self.window, ("gpu_uuid",))
        with_join = {target for target, _ in joined}
        for key in sorted(joined):
            share = joined[key]
            if share < 0.5:
                continue
            target, labels = key
            extra = []
            if key in util_ratio:
                extra.append(f"utilization {fmt_value(util_ratio[key], 'ratio')}")
            if key in pending_gpu:
                extra.append(f"{pending_gpu[key]:.3g} requests pending")
            out.append(self._candidate(target, labels, share, extra))
        # Fallback from Triton's own metrics, per target without the join series.
        util = _means(store, "sli:gpu_utilization", now, self.window, ("gpu_uuid",))
        pending = _means(store, "sli:pending_requests", now, self.window, _MODEL)
        by_target: dict[str, list[tuple[Labels, float]]] = {}
        for (target, labels), u in util.items():
            if target not in with_join:
                by_target.setdefault(target, []).append((labels, u))
        for target, gpus in sorted(by_target.items()):
            queued = sum(v for (t, _), v in pending.items() if t == target)
            if queued < 1 or any(u >= self.threshold for _, u in gpus):
                continue
            for labels, u in sorted(gpus):
                extra = [f"utilization {fmt_value(u, 'ratio')}",
                         f"{queued:.3g} requests pending on {target}"]
                out.append(self._candidate(target, labels, 1.0, extra))
        return out

    def _candidate(
        self, target: str, labels: Labels, share: float, extra: list[str]
    ) -> AlertCandidate:
        summary = (
            f"GPU idle while requests queue ({share * 100:.0f} % of the last "
            f"{fmt_duration(self.window)})" + "".join(f"; {t}" for t in extra)
        )
        ann = {
            "summary": summary,
            "description": (
                f"GPU {_where(labels)} of {target} was idle while models on it had queued "
                f"requests for {share * 100:.0f} % of the last {fmt_duration(self.window)}: "
                "check instance placement, max_queue_delay_microseconds and the input pipeline."
            ),
            "idle_share": f"{share:.3g}",
        }
        return AlertCandidate(_labels(self.name, target, labels, "warning"),
                              make_labels(ann), share)


def _sums_counts(
    store: Store, name: str, lo: float, hi: float, by: tuple[str, ...]
) -> dict[tuple[str, Labels], list[float]]:
    """Per group (target, ``by`` labels): ``[sum, count]`` of the finite samples with
    ``lo <= ts <= hi``, from 5-minute ``sum`` and ``count`` buckets.

    For a window on the 5-minute grid these come from the 5-minute rollup up to its watermark
    (raw after it) instead of every raw sample of the window.  A series with a non-finite
    bucket sum (a NaN or infinite sample: the bucket cannot tell its finite samples apart) is
    read raw instead.
    """
    acc: dict[tuple[str, Labels], list[float]] = {}

    def add(key: SeriesKey, total: float, n: float) -> None:
        lbl = dict(key.labels)
        a = acc.setdefault((key.target, make_labels({k: lbl[k] for k in by if k in lbl})),
                           [0.0, 0.0])
        a[0] += total
        a[1] += n

    count_cols = store.bucket_columns(name, start=lo, end=hi, step=QUANTUM_S, agg="count")
    counts = dict(zip(count_cols.keys, _per_series(count_cols).tolist(), strict=True))
    sum_cols = store.bucket_columns(name, start=lo, end=hi, step=QUANTUM_S, agg="sum")
    for key, total in zip(sum_cols.keys, _per_series(sum_cols).tolist(), strict=True):
        if math.isfinite(total):
            add(key, total, counts.get(key, 0.0))
            continue
        for raw in store.range(name, start=lo, end=hi, target=key.target, match=dict(key.labels)):
            if raw.labels == key.labels:
                finite = [v for v in raw.values if math.isfinite(v)]
                add(key, math.fsum(finite), float(len(finite)))
    return acc


@dataclass
class FailureRatioSpikeRule:
    """Failures by reason / all requests spike above the ratio of the hour before.

    The recent ``window`` is read raw on every evaluation.  The hour before is the
    ``baseline_window`` of whole 5-minute intervals ending on the 5-minute grid line at or
    before the recent window's start (0 to 5 min before it; that gap is in neither window): so
    it comes from the 5-minute rollup, and changes only once per 5 minutes, when it is read
    again (``_baseline`` caches it); re-reading an hour of raw samples of every target every
    30 s made evaluation cost grow with the fleet and the stored history.
    """

    name: str = "failure_ratio_spike"
    for_s: float = 120.0
    keep_firing_for_s: float = 300.0
    threshold: float = 0.05
    window: float = 300.0
    baseline_window: float = 3600.0
    min_traffic: float = 0.2
    factor: float = 2.0
    margin: float = 0.01
    # (window, {(target, model labels): [sum, count]} of request rates, likewise failures
    # by reason); replaced when the window moves to the next 5 minutes.
    _baseline: tuple[tuple[float, float], dict[Any, list[float]], dict[Any, list[float]]] | None = (
        field(default=None, init=False, repr=False, compare=False))

    def baseline_span(self, now: float) -> tuple[float, float]:
        """The baseline's ``[start, end)`` at ``now``: whole 5-minute intervals."""
        end = floor_to(now - self.window, QUANTUM_S)
        return end - ceil_to(self.baseline_window, QUANTUM_S), end

    def _base(
        self, store: Store, now: float
    ) -> tuple[dict[Any, list[float]], dict[Any, list[float]]]:
        span = self.baseline_span(now)
        if self._baseline is None or self._baseline[0] != span:
            lo, hi = span[0], span[1] - 0.001  # [start, end): the store's end is inclusive
            ok = _sums_counts(store, "sli:request_rate", lo, hi, _MODEL)
            fail = _sums_counts(store, "sli:failure_rate", lo, hi, (*_MODEL, "reason"))
            self._baseline = (span, ok, fail)
        return self._baseline[1], self._baseline[2]

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        split = now - self.window
        ok_base, fail_base = self._base(store, now)

        # [sum, count] of the finite samples of (split, now].
        ok_now = _group_sums(store.range_columns("sli:request_rate", start=split, end=now),
                             _MODEL, after=split)
        fail_now = _group_sums(store.range_columns("sli:failure_rate", start=split, end=now),
                               (*_MODEL, "reason"), after=split)

        def mean(a: list[float] | None) -> float:
            return a[0] / a[1] if a is not None and a[1] else 0.0

        def model_key(key: tuple[str, Labels]) -> tuple[str, Labels]:
            return key[0], tuple(p for p in key[1] if p[0] != "reason")

        fail_all: dict[tuple[str, Labels], list[float]] = {}  # [recent, baseline] mean rates
        for src, i in ((fail_now, 0), (fail_base, 1)):
            for key, a in src.items():
                # Mean rates add up over reasons.
                fail_all.setdefault(model_key(key), [0.0, 0.0])[i] += mean(a)
        out: list[AlertCandidate] = []
        for (target, labels), a in sorted(fail_now.items()):
            mkey = model_key((target, labels))
            allf = fail_all[mkey]
            total_now = mean(ok_now.get(mkey)) + allf[0]
            total_base = mean(ok_base.get(mkey)) + allf[1]
            if total_now < self.min_traffic:
                continue
            ratio = mean(a) / total_now
            base = mean(fail_base.get((target, labels))) / total_base if total_base > 0 else 0.0
            if ratio < self.threshold or ratio < self.factor * base + self.margin:
                continue
            reason = dict(labels).get("reason", "ALL")
            summary = (
                f"{ratio * 100:.1f} % of requests failing ({reason}) vs "
                f"{base * 100:.2f} % in the hour before; "
                f"{fmt_value(total_now, 'req/s')} ({fmt_change(total_now, total_base)})"
            )
            ann = {
                "summary": summary,
                "description": (
                    f"{_where(labels)} on {target}: {mean(a):.3g} failures/s with reason "
                    f"{reason} out of {total_now:.3g} requests/s over the last "
                    f"{fmt_duration(self.window)} ({ratio * 100:.1f} %, threshold "
                    f"{self.threshold * 100:.0f} %); baseline {base * 100:.2f} % over the "
                    f"{fmt_duration(self.baseline_window)} before."
                ),
                "failure_ratio": f"{ratio:.4g}",
                "baseline_ratio": f"{base:.4g}",
                "request_rate": f"{total_now:.4g}",
            }
            out.append(AlertCandidate(_labels(self.name, target, labels, "critical"),
                                      make_labels(ann), ratio))
        return out


@dataclass
class TargetDownRule:
    """A target whose latest ``up`` is 0, or that has not been scraped for ``stale_after``.

    ``targets``: the targets configured now (``serve`` sets it, see :func:`watch_targets`);
    the store keeps the history of removed ones, which are not down but gone, so their alerts
    resolve.  ``None`` (replay, backtests over a store alone) judges every target it finds.
    """

    name: str = "target_down"
    for_s: float = 120.0
    keep_firing_for_s: float = 60.0
    stale_after: float = 120.0
    lookback: float = 3600.0
    targets: frozenset[str] | None = None

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        last: dict[str, tuple[float, float]] = {}  # target -> (ts, value) of latest ``up``
        for sd in store.buckets("up", start=now - self.lookback, end=now, step=60.0,
                                agg="min"):
            if sd.ts and (sd.target not in last or sd.ts[-1] > last[sd.target][0]):
                last[sd.target] = (sd.ts[-1], sd.values[-1])
        # The latest raw samples decide (a bucket's min hides a recovery inside it).
        recent = store.range("up", start=now - 2 * self.stale_after, end=now)
        for sd in recent:
            if sd.ts and sd.ts[-1] >= last.get(sd.target, (-math.inf, 0.0))[0]:
                last[sd.target] = (sd.ts[-1], sd.values[-1])
        errors: dict[str, str] = {}
        for h in store.health():
            if h.source != "metrics":
                continue
            if h.error:
                errors[h.target] = h.error
            if h.target not in last or h.ts > last[h.target][0]:
                last[h.target] = (h.ts, 1.0 if h.up else 0.0)
        out: list[AlertCandidate] = []
        for target, (ts, value) in sorted(last.items()):
            if self.targets is not None and target not in self.targets:
                continue
            age = now - ts
            if value >= 1 and age <= self.stale_after:
                continue
            if value < 1:
                why = f"its last scrape failed ({fmt_duration(max(age, 0))} ago)"
            else:
                why = f"it has not been scraped for {fmt_duration(round(age))}"
            if target in errors:
                why += f": {errors[target]}"
            ann = {
                "summary": f"Target {target} is not answering",
                "description": f"Tritonwatch cannot read {target}: {why}.",
                "last_scrape_age_seconds": f"{age:.0f}",
            }
            out.append(AlertCandidate(_labels(self.name, target, (), "critical"),
                                      make_labels(ann), age))
        return out


# --- assembly ----------------------------------------------------------------------------------


def watch_targets(rules: Iterable[Rule], targets: Iterable[str]) -> None:
    """Limit every :class:`TargetDownRule` of ``rules`` to the configured ``targets``."""
    names = frozenset(targets)
    for rule in rules:
        if isinstance(rule, TargetDownRule):
            rule.targets = names


def _apply(rule: Any, o: DefaultOverride | None, mapping: Mapping[str, str]) -> Any:
    if o is None:
        return rule
    for src, dst in {"for_s": "for_s", "keep_firing_for_s": "keep_firing_for_s",
                     **mapping}.items():
        v = getattr(o, src)
        if v is not None:
            setattr(rule, dst, v)
    return rule


def default_rules(
    spec: DefaultsSpec | None = None, loads: SharedLoads | None = None
) -> list[Rule]:
    """The built-in rules (all of them for ``None``), minus those ``spec`` disables.

    The regression rules share their load histories through ``loads`` (one per rules file,
    so a file's own regressions share them too; a new one when ``None``): all five weigh load
    by request rate over the same windows, and five copies of it held about 13 MB each at
    1,000 targets of 7 models."""
    spec = spec or DefaultsSpec()
    if not spec.enabled:
        return []
    if loads is None:
        loads = {}
    rules: list[Rule] = []
    for name in DEFAULT_RULE_NAMES:
        if name in spec.disable:
            continue
        o = spec.overrides.get(name)
        if name in BUILTIN_REGRESSIONS:
            rs = _regression_spec(name, o)
            rules.append(RegressionRule(rs, alertname=_ALERTNAMES[name], shared_loads=loads))
        elif name == "kv_cache_saturation":
            rules.append(_apply(KvCacheSaturationRule(), o, {"threshold": "threshold"}))
        elif name == "kv_cache_exhaustion_forecast":
            rules.append(_apply(KvCacheForecastRule(), o, {
                "threshold": "threshold", "horizon": "horizon", "recent_window": "window"}))
        elif name == "gpu_idle_while_queued":
            rules.append(_apply(GpuIdleWhileQueuedRule(), o, {"threshold": "threshold"}))
        elif name == "failure_ratio_spike":
            rules.append(_apply(FailureRatioSpikeRule(), o, {
                "threshold": "threshold", "min_traffic": "min_traffic",
                "recent_window": "window", "baseline_window": "baseline_window"}))
        elif name == "target_down":
            rules.append(_apply(TargetDownRule(), o, {}))
    return rules
