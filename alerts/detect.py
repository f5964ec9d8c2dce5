"""Regression detection: a recent window against what a baseline expects at the same load.

For each alert instance (the target plus the spec's ``by`` labels; series sharing them, such as
one per ``gpu_uuid``, are averaged bucket by bucket) at evaluation time ``now``:

1. **Windows.**  Points are averaged into ``step`` buckets.  The *recent* window is
   ``[now - recent_window, now]``.  Baselines are tried in order: with ``baseline: week_ago``
   first the same hours a week earlier (the recent window's midpoint minus 7 days, ± half the
   ``baseline_window``), then the *trailing* ``baseline_window`` just before the recent window.
   Both are aligned down to the 5-minute grid (the smallest multiple of ``step`` of at least
   5 min), so a baseline changes once per 5 minutes, and :class:`BaselineCache` reads each of
   its buckets from the store once and fits its model once per 5 minutes.  The first baseline
   whose model can judge the recent load decides (step 2); no other is tried after it (the
   detector never shops for a baseline that fires).
2. **The load model.**  Most of these series follow load: the fill rate and the GPU
   utilization rise with the request rate, KV-cache use with requests in flight, latency near
   saturation.  So instead of refusing to judge when load moved (the old ±15 % guard, which
   refused for most of a ±30 % daily cycle's ramps), each baseline is a *model* of the series
   against its ``load_series`` (the same target and model's requests that arrived: successes
   plus failures, since a failed request used the server too; summed over its series; the
   whole target's for a GPU):

   ``log y = a + b * log x``, over the baseline's buckets, ``x`` smoothed over the recent
   window's length (the recent window is judged at its median load; smoothing also keeps the
   load's counting noise from flattening the slope).  ``b`` (the *elasticity*: 0 = does not
   follow load, 1 = proportional) is the Theil-Sen slope (median of pairwise slopes: robust
   to spikes) with its 99 % interval from Kendall's S (Sen 1968), both clipped to the spec's
   ``elasticity`` range (the built-in rules: a fill rate or a GPU follows load at most
   proportionally, and none of these series falls when load rises).  ``a`` makes the median
   residual zero.  The recent window is judged against ``a + b * log(x_now)``, with ``b`` the
   end of the interval *least* favourable to an alert: a load change explains as much as the
   baseline allows, never more.  When the interval is too wide for how far load moved (half
   its width times ``|log(x_now / x_baseline)|`` reaches ``log(1 + min_effect)``: the model
   cannot tell a regression of ``min_effect`` from its own error), that baseline cannot
   judge.  Without any load data (in neither window) the model is flat (``b = 0``) and the
   annotations say so; with load known in one window only, the baseline cannot judge.
3. **Effect.**  ``exp(median recent residual) - 1`` in the bad ``direction`` is at least
   ``min_effect`` (and the expected level exceeds ``min_baseline``).
4. **Significance.**  Both must hold (SLO-alerting notes §4.2), on the residuals:

   * robust z of the recent median residual: ``median_r / (1.2533 * 1.4826 * MAD_b /
     sqrt(n_r))`` (the standard error of a median of ``n_r`` values whose sigma is estimated
     from the baseline residuals' median absolute deviation; sigma floored at 1 %, so a flat
     baseline does not turn every wobble into infinity) at least ``z_threshold``;
   * one-sided Mann-Whitney U of the recent residuals against the baseline's (normal
     approximation, tie-corrected) with ``p <= alpha``; robust to spikes and skew.

:class:`RegressionRule` holds an instance's baseline (window and model) from the evaluation
it is first found until it resolves, so a lasting regression is not learnt as normal.

Annotations say what changed, by how much, against what expectation at which load, and what
moved with it, ranked (:func:`moved_with`: queue and compute time, KV cache, waiting and paused
requests, fill rate, GPUs), the largest moves as ``likely_cause``.  The labels are only
``alertname``, ``rule``, ``target``, the ``by`` labels and the spec's extra labels.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.alerts.history import BucketHistory, RecentBuckets, ceil_to, floor_to, quantum_for
from tritonwatch.alerts.model import Rule
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.schemas.samples import Labels, make_labels

if TYPE_CHECKING:
    from tritonwatch.store import SeriesData, Store

WEEK_S = 7 * 86400.0
#: For this long after a new model version appears it is compared with the previous version.
DEPLOY_WINDOW_S = 3600.0
_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE = 1.2533  # sqrt(pi/2): standard error of a median over that of a mean
_SIGMA_FLOOR = 0.01  # of the baseline level

#: How series are named in annotations, and their unit ("ratio", "s", "req/s", "").
DISPLAY: dict[str, tuple[str, str]] = {
    "sli:batch_fill_rate": ("batch fill rate", "ratio"),
    "sli:stats_batch_fill_rate": ("batch fill rate (stats)", "ratio"),
    "sli:avg_batch_size": ("average batch size", ""),
    "sli:kv_cache_utilization": ("KV-cache utilization", "ratio"),
    "sli:kv_cache_free_blocks": ("free KV-cache blocks", ""),
    "sli:gpu_utilization": ("GPU utilization", "ratio"),
    "sli:gpu_utilization_ratio": ("GPU utilization", "ratio"),
    "sli:request_rate": ("request rate", "req/s"),
    "sli:queue_time_seconds": ("queue time", "s"),
    "sli:compute_time_seconds": ("compute time", "s"),
    "sli:pending_requests": ("pending requests", ""),
    "sli:llm_waiting_requests": ("waiting requests", ""),
    "sli:llm_paused_requests": ("paused requests", ""),
    "sli:llm_active_requests": ("active requests", ""),
    "sli:success_ratio": ("success ratio", "ratio"),
    "sli:ttft_seconds": ("server TTFT", "s"),
    "sli:itl_seconds": ("server ITL", "s"),
    "probe:ttft_seconds": ("TTFT", "s"),
    "probe:itl_seconds": ("ITL", "s"),
    "probe:e2e_seconds": ("end-to-end latency", "s"),
}

#: The server-side signals ranked as "what moved with it" (the likely cause) when a spec names
#: none: where time went (queue, compute), memory (KV cache), the scheduler's backlog
#: (waiting, paused, pending), batching, the GPUs.
DEFAULT_RELATED: tuple[str, ...] = (
    "sli:queue_time_seconds",
    "sli:compute_time_seconds",
    "sli:kv_cache_utilization",
    "sli:llm_waiting_requests",
    "sli:llm_paused_requests",
    "sli:pending_requests",
    "sli:batch_fill_rate",
    "sli:gpu_utilization",
    "sli:gpu_power_ratio",
    "probe:ttft_seconds",
)
#: Series kept per GPU (no model label): a model's signals include every GPU of its target.
_GPU_PREFIX = "sli:gpu_"
#: Moves smaller than this (relative) are quoted but not named as a likely cause.
CAUSE_MIN_CHANGE = 0.1


class Comparison(NamedTuple):
    """The statistics of one recent window against one baseline."""

    current: float  # recent median
    baseline: float  # baseline median
    change: float  # relative change of the median, signed (+0.38 = +38 %)
    z: float  # robust z of the recent median, signed
    p_value: float  # one-sided Mann-Whitney p in the spec's bad direction
    n_recent: int
    n_baseline: int
    elasticity: float = 0.0  # slope of log series on log load the comparison used


@dataclass(frozen=True)
class HeldBaseline:
    """The baseline an instance was judged against when it became pending, kept (with its
    window and load model) until the instance resolves: see :class:`RegressionRule`."""

    kind: str  # "trailing" or "week_ago"
    window: tuple[float, float]
    model: LoadModel = field(compare=False)
    #: After a deploy: the previous version (judged against) and when the new one appeared.
    deploy: tuple[str, str, float] | None = None  # (previous version, new version, since)

    @property
    def load(self) -> float | None:
        """The baseline's (smoothed) median load; None without load data."""
        return math.exp(self.model.center) if self.model.has_load else None


class Finding(NamedTuple):
    """One regression that holds at evaluation time."""

    target: str
    labels: Labels  # the ``by`` labels of the instance
    baseline_kind: str  # "trailing" or "week_ago"
    comparison: Comparison
    load_current: float | None
    load_baseline: float | None
    related: tuple[str, ...]  # "KV-cache utilization 97 % (+25 %)", ...
    candidate: AlertCandidate
    baseline: HeldBaseline  # what decided (and what a pending instance holds from now on)


# --- statistics ------------------------------------------------------------------------------

Values = Sequence[float] | npt.NDArray[np.float64]


def robust_z(recent: Values, baseline: Values) -> float:
    """Robust z of the recent median against the baseline (median, MAD); signed."""
    r = np.asarray(recent, dtype=float)
    b = np.asarray(baseline, dtype=float)
    med_b = float(np.median(b))
    sigma = _MAD_TO_SIGMA * float(np.median(np.abs(b - med_b)))
    sigma = max(sigma, _SIGMA_FLOOR * abs(med_b), 1e-12)
    se = _MEDIAN_SE * sigma / math.sqrt(len(r))
    return (float(np.median(r)) - med_b) / se


def mann_whitney_p(recent: Values, baseline: Values, direction: str) -> float:
    """One-sided Mann-Whitney U p-value that ``recent`` is stochastically greater (``up``) or
    smaller (``down``) than ``baseline``: normal approximation with tie correction and
    continuity correction (accurate enough for the 5+ vs 20+ samples used here)."""
    r = np.asarray(recent, dtype=float)
    b = np.asarray(baseline, dtype=float)
    n1, n2 = len(r), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    both = np.concatenate([r, b])
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts
    ranks = (starts + (counts + 1) / 2.0)[inverse]
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    ties = float(((counts.astype(float) ** 3) - counts).sum())
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    mean = n1 * n2 / 2.0
    diff = (u1 - mean) if direction == "up" else (mean - u1)
    z = (diff - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def compare(recent: Values, baseline: Values, direction: str) -> Comparison:
    """Medians, relative change, robust z and Mann-Whitney p of ``recent`` vs ``baseline``."""
    cur = float(np.median(np.asarray(recent, dtype=float)))
    base = float(np.median(np.asarray(baseline, dtype=float)))
    return Comparison(
        current=cur,
        baseline=base,
        change=relative_change(cur, base),
        z=robust_z(recent, baseline),
        p_value=mann_whitney_p(recent, baseline, direction),
        n_recent=len(recent),
        n_baseline=len(baseline),
    )


def is_regression(c: Comparison, spec: RegressionSpec) -> bool:
    """Effect size, robust z and Mann-Whitney all say "worse" in the spec's direction."""
    sign = 1.0 if spec.direction == "up" else -1.0
    if abs(c.baseline) <= spec.min_baseline:
        return False
    return (
        sign * c.change >= spec.min_effect
        and sign * c.z >= spec.z_threshold
        and c.p_value <= spec.alpha
    )


# --- formatting ------------------------------------------------------------------------------


def fmt_value(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value * 100:.0f} %"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "req/s":
        return f"{value:.3g} req/s"
    return f"{value:.3g}"


def fmt_change(current: float, baseline: float) -> str:
    """``+38 %`` / ``-25 %`` for moderate changes, a factor (times sign, ``3.0``) past 2."""
    if baseline == 0:
        return "new" if current != 0 else "±0 %"
    ratio = current / baseline
    if ratio >= 2 and baseline > 0:
        return f"\u00d7{ratio:.1f}"
    return f"{(ratio - 1) * 100:+.0f} %"


def fmt_duration(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def display(series: str) -> tuple[str, str]:
    return DISPLAY.get(series, (series, ""))


def alertname_for(name: str) -> str:
    """``batch_fill_rate_regression`` → ``BatchFillRateRegression``."""
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_"))


# --- data ------------------------------------------------------------------------------------

GroupKey = tuple[str, Labels]  # target, by-labels


def group_points(
    data: Iterable[SeriesData], by: Sequence[str], *, how: str = "mean"
) -> dict[GroupKey, dict[float, float]]:
    """Series grouped by target and ``by`` labels; points of one bucket averaged (or summed)."""
    acc: dict[GroupKey, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for sd in data:
        lbl = dict(sd.labels)
        key = (sd.target, make_labels({k: lbl[k] for k in by if k in lbl}))
        points = acc[key]
        for ts, v in zip(sd.ts, sd.values, strict=True):
            if math.isfinite(v):
                points[ts].append(v)
    out: dict[GroupKey, dict[float, float]] = {}
    for key, points in acc.items():
        out[key] = {
            ts: (sum(vs) if how == "sum" else sum(vs) / len(vs)) for ts, vs in points.items()
        }
    return out


def _window(points: Mapping[float, float], start: float, end: float) -> list[float]:
    return [v for ts, v in points.items() if start <= ts < end]


def load_names(spec: RegressionSpec) -> tuple[str, ...]:
    """The series whose sum is ``spec``'s load (none: load not modelled)."""
    ls = spec.load_series
    return () if ls is None else (ls,) if isinstance(ls, str) else ls


def _load_match(labels: Labels) -> dict[str, str]:
    return {k: v for k, v in labels if k in ("model", "version")}


class _Loader:
    """Bucketed queries of one evaluation, each issued at most once."""

    def __init__(self, store: Store, step: float) -> None:
        self.store = store
        self.step = step
        self._cache: dict[tuple[Any, ...], list[SeriesData]] = {}

    def get(
        self,
        name: str,
        start: float,
        end: float,
        match: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> list[SeriesData]:
        key = (name, start, end, tuple(sorted((match or {}).items())), target)
        if key not in self._cache:
            self._cache[key] = self.store.buckets(
                name, start=start, end=end, step=self.step, agg="avg", match=match or None,
                target=target,
            )
        return self._cache[key]


def load_comparable(current: float | None, baseline: float | None, tolerance: float) -> bool:
    """True when both loads are known and within ``tolerance`` (relative), or both unknown.

    Load known in one window and missing in the other is *not* comparable: traffic may have
    stopped or started, which is exactly what the guard is there to catch."""
    if current is None and baseline is None:
        return True
    if current is None or baseline is None:
        return False
    if baseline <= 0:
        return current <= 0
    return abs(current - baseline) / baseline <= tolerance


# --- the load model --------------------------------------------------------------------------

#: Confidence of the interval of the load response (the Theil-Sen slope): within it the
#: detector takes the slope least favourable to a verdict.
SLOPE_CONFIDENCE_Z = 2.576  # 99 %, two-sided
_LOG_FLOOR = 1e-3  # of the baseline median: a zero (idle) bucket counts as this in log space
_SAME_LOAD = 0.02  # |log load change| under which the slope does not matter


def _log(values: npt.NDArray[np.float64], floor: float) -> npt.NDArray[np.float64]:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log(np.maximum(values, floor))


def smooth(values: npt.NDArray[np.float64], width: int) -> npt.NDArray[np.float64]:
    """Centred moving mean over ``width`` buckets, NaN ignored (NaN where none)."""
    if width <= 1 or len(values) == 0:
        return values.copy()
    ok = ~np.isnan(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(ok, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(ok)])
    half = width // 2
    idx = np.arange(len(values))
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx - half + width, len(values))
    n = counts[hi] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: npt.NDArray[np.float64] = (sums[hi] - sums[lo]) / n
    out[n == 0] = np.nan
    return out


def theil_sen(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64],
              z: float = SLOPE_CONFIDENCE_Z) -> tuple[float, float, float] | None:
    """Theil-Sen slope of ``y`` on ``x`` and its confidence interval from Kendall's S (Sen
    1968): the median of the pairwise slopes, and the pairwise slopes at ranks
    ``(N -/+ z * sqrt(var S)) / 2``.  None when no two points differ in ``x``."""
    n = len(x)
    if n < 3:
        return None
    if n > 240:  # 28,680 pairs at most: thin evenly (the fit is per 5 minutes per instance)
        keep = np.linspace(0, n - 1, 240).round().astype(np.int64)
        x, y, n = x[keep], y[keep], 240
    i, j = np.triu_indices(n, 1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return None
    slopes = np.sort((y[j] - y[i])[ok] / dx[ok])
    big_n = len(slopes)
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo = math.floor((big_n - c) / 2)
    hi = math.ceil((big_n + c) / 2)
    med = float(np.median(slopes))
    low = float(slopes[lo]) if lo >= 0 else -math.inf
    high = float(slopes[hi]) if hi < big_n else math.inf
    return low, med, high


@dataclass(frozen=True, eq=False)
class LoadModel:
    """How one instance's series responded to its load over a baseline window.

    ``log series = intercept + slope * log load``, the slope fitted by Theil-Sen on the
    baseline's buckets (load smoothed over the recent window's length), with its confidence
    interval clipped to the spec's ``elasticity``.  Per slope of ``(low, fit, high)``: the
    intercept (median residual zero) and the baseline's residuals, sorted."""

    slopes: tuple[float, float, float]
    intercepts: tuple[float, float, float]
    residuals: tuple[npt.NDArray[np.float64], ...]
    center: float  # median log load of the baseline (NaN: no load)
    level: float  # the baseline's median of the series
    floor: float  # values below it count as it in log space
    n: int  # buckets fitted

    @property
    def has_load(self) -> bool:
        return not math.isnan(self.center)


def fit_load_model(
    y: npt.NDArray[np.float64], x: npt.NDArray[np.float64] | None, spec: RegressionSpec,
) -> LoadModel | None:
    """The load model of one baseline: ``y`` the series' buckets, ``x`` the load's (the same
    slots; None: no load series, or no load data in the window).  None with fewer than
    ``min_points`` usable buckets."""
    ok = ~np.isnan(y)
    level = float(np.median(y[ok])) if ok.any() else math.nan
    floor = max(abs(level) * _LOG_FLOOR, 1e-12) if math.isfinite(level) else 1e-12
    width = max(1, round(spec.recent_window / spec.step))
    lx: npt.NDArray[np.float64] | None = None
    if x is not None:
        xs = smooth(x, width)
        ok &= ~np.isnan(xs)
        lx = _log(xs[ok], max(float(np.nanmedian(xs)) * _LOG_FLOOR, 1e-12)
                  if ok.any() else 1e-12)
    if int(ok.sum()) < spec.min_points:
        return None
    ly = _log(y[ok], floor)
    if lx is None:
        slopes = (0.0, 0.0, 0.0)
        center = math.nan
    else:
        center = float(np.median(lx))
        lo_b, hi_b = spec.elasticity if spec.elasticity is not None else (-math.inf, math.inf)
        ts = theil_sen(lx, ly)
        if ts is None:  # one load level only: the slope is anything the bounds allow
            fit = min(max(0.0, lo_b), hi_b)
            ts = (lo_b, fit, hi_b)
        low, fit, high = (min(max(v, lo_b), hi_b) for v in ts)
        slopes = (low, fit, high)
    intercepts: list[float] = []
    residuals: list[npt.NDArray[np.float64]] = []
    for b in slopes:
        if not math.isfinite(b):
            intercepts.append(math.nan)
            residuals.append(np.empty(0))
            continue
        r = ly - b * lx if lx is not None else ly
        a = float(np.median(r))
        intercepts.append(a)
        residuals.append(np.sort(r - a))
    return LoadModel(slopes, (intercepts[0], intercepts[1], intercepts[2]), tuple(residuals),
                     center, level, floor, int(ok.sum()))


def judge(
    model: LoadModel, recent: npt.NDArray[np.float64], load_now: float | None,
    spec: RegressionSpec,
) -> Comparison | None:
    """The recent buckets against what ``model`` expects at the recent load: the residual
    statistics for the slope of the model's interval least favourable to a regression.
    None when the model cannot tell an effect of ``min_effect`` at this load (its slope is
    too uncertain for how far the load moved), or load is known in one window only."""
    if model.has_load != (load_now is not None):
        return None
    ly = _log(recent, model.floor)
    if load_now is not None:
        lx_now = math.log(max(load_now, math.exp(model.center) * _LOG_FLOOR, 1e-12))
        shift = lx_now - model.center
    else:
        lx_now, shift = 0.0, 0.0
    low, fit, high = model.slopes
    # How far the prediction may be off at this load: the interval's wider half times how far
    # the load moved.  As large as the smallest effect that counts, the model cannot judge.
    if abs(shift) > _SAME_LOAD and (
            not (math.isfinite(low) and math.isfinite(high))
            or max(fit - low, high - fit) * abs(shift) >= math.log1p(spec.min_effect)):
        return None
    sign = 1.0 if spec.direction == "up" else -1.0
    best: tuple[float, int] | None = None
    for k, b in enumerate(model.slopes):
        if not math.isfinite(b):
            continue
        effect = float(np.median(ly)) - (model.intercepts[k] + b * lx_now)
        if best is None or sign * effect < sign * best[0]:
            best = (effect, k)
    if best is None:
        return None
    effect, k = best
    b, a, base_r = model.slopes[k], model.intercepts[k], model.residuals[k]
    expected = math.exp(a + b * lx_now)
    r = ly - (a + b * lx_now)
    current = float(np.median(recent))
    mad = float(np.median(np.abs(base_r - np.median(base_r)))) if len(base_r) else 0.0
    sigma = max(_MAD_TO_SIGMA * mad, _SIGMA_FLOOR)  # log units: 1 % of the level at least
    z = effect / (_MEDIAN_SE * sigma / math.sqrt(len(r)))
    return Comparison(
        current=current,
        baseline=expected,
        change=math.expm1(effect),
        z=z,
        p_value=mann_whitney_p(r, base_r, spec.direction),
        n_recent=len(r),
        n_baseline=model.n,
        elasticity=b,
    )


# --- windows and the baseline cache ----------------------------------------------------------

_LOAD_BY = ("model", "version")


def baseline_quantum(spec: RegressionSpec) -> float:
    """How far the baselines of ``spec`` move at a time: 5 minutes for windows of hours (the
    built-in rules), at most a third of the shorter window otherwise, so that the gap this
    alignment leaves between the recent window and the trailing baseline stays small beside
    both (a rule with a 10 s recent window and a 60 s baseline moves them every 4 s)."""
    return quantum_for(spec.step, min(spec.recent_window, spec.baseline_window) / 3)


def baseline_windows(spec: RegressionSpec, now: float) -> list[tuple[str, tuple[float, float]]]:
    """The baselines to try at ``now``, in order: ``(kind, (start, end))``, end exclusive.

    Both are aligned down to the 5-minute grid (:func:`baseline_quantum`; finer for short
    windows), so they change once per quantum and their statistics are computed once per quantum
    (:class:`BaselineCache`) instead of on every evaluation: the trailing baseline ends on the
    grid line at or before the recent window's start (0 to 5 min before it; that gap is in
    neither window), the week-ago one starts on the grid line at or before the recent window's
    midpoint a week ago minus half the baseline window."""
    q = baseline_quantum(spec)
    end = floor_to(now - spec.recent_window, q)
    out: list[tuple[str, tuple[float, float]]] = []
    if spec.baseline == "week_ago":
        mid = now - spec.recent_window / 2 - WEEK_S
        lo = floor_to(mid - spec.baseline_window / 2, q)
        out.append(("week_ago", (lo, lo + spec.baseline_window)))
    out.append(("trailing", (end - spec.baseline_window, end)))
    return out


def _matching(labels: Labels, want: Mapping[str, str]) -> bool:
    d = dict(labels)
    return all(d.get(k) == v for k, v in want.items())


def _summed_median(arrays: list[npt.NDArray[np.float64]]) -> float | None:
    """Median over buckets of the sum of ``arrays`` (NaN = no point), buckets with any point."""
    if not arrays:
        return None
    stacked = np.vstack(arrays)
    present = ~np.isnan(stacked).all(axis=0)
    if not present.any():
        return None
    return float(np.median(np.nansum(stacked[:, present], axis=0)))


#: Load histories shared by the regression rules of one rules file (see :class:`BaselineCache`).
SharedLoads = dict[tuple[Any, ...], BucketHistory | RecentBuckets]


class BaselineCache:
    """What one regression rule keeps between evaluations: per baseline kind, the window's
    step buckets (:class:`alerts.history.BucketHistory`, of the watched series and of the
    load series) and, per quantum, each instance's baseline median and count (computed for
    all instances at once; the values themselves are sorted only for the few instances whose
    median shows an effect) and load median.

    Baselines are hours long and a week old or at least 15 minutes old, so they change only
    when their window moves to the next quantum; re-reading them from the store every 30 s
    made evaluation cost grow with stored history and fleet size.  Memory is one float per
    bucket of the window per instance (about 2 KB for 4 h at 1 min) plus the load series'
    (a sorted copy per instance, kept until the window moved, doubled that).
    The load series' histories are shared through ``loads`` by the caches of every rule with
    the same load series and windows (the built-in rules all weigh load by request rate: at
    1,000 targets of 7 models, five copies of it were 60 MB).
    """

    def __init__(self, spec: RegressionSpec, loads: SharedLoads | None = None) -> None:
        self.spec = spec
        self._series: dict[str, BucketHistory] = {}
        self._load: dict[str, BucketHistory] = {}
        self._shared_loads: SharedLoads = {} if loads is None else loads
        # The recent window: its buckets older than a grace are kept too (read once).
        self.recent = RecentBuckets(spec.series, step=spec.step, by=spec.by, match=spec.match)
        self.recent_load: RecentBuckets | None = None
        if spec.load_series is not None:
            # Shared too: rules with the same load and recent window read it once per ``now``.
            key = ("recent", load_names(spec), spec.step, spec.recent_window)
            shared = self._shared_loads.get(key)
            if not isinstance(shared, RecentBuckets):
                shared = self._shared_loads[key] = RecentBuckets(
                    load_names(spec), step=spec.step, by=_LOAD_BY, how="sum")
            self.recent_load = shared
        # Per kind, computed on first use after the histories changed (``_held``: the window
        # and both histories' generations they were computed for): every instance's baseline
        # count and median, instances' load medians, and the load history's rows per target.
        self._held: dict[str, tuple[tuple[float, float], int, int]] = {}
        self._models: dict[str, dict[GroupKey, LoadModel | None]] = {}
        self._by_target: dict[str, dict[str, list[int]]] = {}

    @property
    def reads(self) -> int:
        """Store queries issued for baselines so far."""
        return sum(h.reads for h in (*self._series.values(), *self._load.values()))

    def recent_reads(self) -> int:
        """Store queries issued for the kept part of the recent windows."""
        return self.recent.history.reads + (
            self.recent_load.history.reads if self.recent_load is not None else 0)

    def _range(self, window: tuple[float, float]) -> tuple[float, float]:
        # Buckets stamped in [start, end): the same ones the window filter keeps.
        step = self.spec.step
        return ceil_to(window[0], step), ceil_to(window[1], step)

    def refresh(self, store: Store, kind: str, window: tuple[float, float]) -> None:
        """Move ``kind``'s histories to ``window`` (a no-op within one quantum)."""
        spec = self.spec
        lo, hi = self._range(window)
        hist = self._series.get(kind)
        if hist is None:
            hist = self._series[kind] = BucketHistory(
                spec.series, step=spec.step, by=spec.by, match=spec.match)
        hist.advance(store, lo, hi)
        load_gen = -1
        if spec.load_series is not None:
            load = self._load.get(kind)
            if load is None:
                # Rules sharing this key move it to the same window at the same ``now``: the
                # first reads the new slice, the others find it there.
                key = (load_names(spec), spec.step, kind, spec.recent_window,
                       spec.baseline_window, baseline_quantum(spec))
                found = self._shared_loads.get(key)
                load = found if isinstance(found, BucketHistory) else None
                if load is None:
                    load = self._shared_loads[key] = BucketHistory(
                        load_names(spec), step=spec.step, by=_LOAD_BY, how="sum")
                self._load[kind] = load
            load.advance(store, lo, hi)
            load_gen = load.generation
        # Generations, not "did my advance move it": another rule may have moved (or re-read)
        # the shared load history since this cache last looked at it.
        held = (window, hist.generation, load_gen)
        if self._held.get(kind) != held:
            self._held[kind] = held
            self._models[kind] = {}
            self._by_target.pop(kind, None)

    def load_row(self, kind: str, key: GroupKey) -> npt.NDArray[np.float64] | None:
        """The instance's load over the window, summed bucket by bucket over its series (NaN:
        no point); None without a load series or any load point of the instance."""
        hist = self._load.get(kind)
        if hist is None:
            return None
        target, labels = key
        want = _load_match(labels)
        by_target = self._by_target.get(kind)
        if by_target is None:  # rows per target, once per window (not a scan per instance)
            by_target = self._by_target[kind] = defaultdict(list)
            for i, (t, _) in enumerate(hist.keys):
                by_target[t].append(i)
        rows = [hist.values[i] for i in by_target.get(target, ())
                if _matching(hist.keys[i][1], want)]
        if not rows:
            return None
        stacked = np.vstack(rows)
        present = ~np.isnan(stacked).all(axis=0)
        if not present.any():
            return None
        out: npt.NDArray[np.float64] = np.nansum(stacked, axis=0)
        out[~present] = np.nan
        return out

    def deploy(self, kind: str, key: GroupKey, now: float, first_recent: float
               ) -> tuple[GroupKey, float] | None:
        """``(previous version's key, when this version appeared)`` when ``key`` is a model
        version that appeared within :data:`DEPLOY_WINDOW_S` of ``now`` while another
        version of the same model (same target and other ``by`` labels) had data before it
        in ``kind``'s window; else None.  The new version's own history is minutes long:
        for the hour after a deploy it is judged against the version it replaced."""
        labels = dict(key[1])
        if "version" not in labels:
            return None
        hist = self._series[kind]
        step = self.spec.step
        row = hist.row(key)
        if row is not None and (~np.isnan(row)).any():
            assert hist.lo is not None
            since = hist.lo + step * int(np.flatnonzero(~np.isnan(row))[0])
        else:
            since = first_recent  # newer than the baseline window
        if now - since > DEPLOY_WINDOW_S:
            return None
        rest = {k: v for k, v in labels.items() if k != "version"}
        best: tuple[float, GroupKey] | None = None
        for other, i in hist.rows.items():
            if other[0] != key[0] or other == key:
                continue
            olbl = dict(other[1])
            if {k: v for k, v in olbl.items() if k != "version"} != rest:
                continue
            seen = np.flatnonzero(~np.isnan(hist.values[i]))
            if not len(seen):
                continue
            assert hist.lo is not None
            first, last = (hist.lo + step * int(seen[i]) for i in (0, -1))
            if first < since and (best is None or last > best[0]):
                best = (last, other)
        return None if best is None else (best[1], since)

    def model(self, kind: str, key: GroupKey) -> LoadModel | None:
        """The instance's load model over ``kind``'s window (fitted once per quantum); None
        with fewer than ``min_points`` buckets."""
        models = self._models[kind]
        if key not in models:
            row = self._series[kind].row(key)
            models[key] = (None if row is None
                           else fit_load_model(row, self.load_row(kind, key), self.spec))
        return models[key]


def relative_change(current: float, baseline: float) -> float:
    """``(current - baseline) / |baseline|``; +inf for a rise from zero."""
    if baseline != 0:
        return (current - baseline) / abs(baseline)
    return math.inf if current > 0 else 0.0


# --- the detector ----------------------------------------------------------------------------


def detect(
    store: Store,
    spec: RegressionSpec,
    now: float,
    *,
    alertname: str | None = None,
    cache: BaselineCache | None = None,
    held: Mapping[GroupKey, HeldBaseline] | None = None,
) -> list[Finding]:
    """Every instance of ``spec`` that has regressed at ``now``.

    ``cache`` (one per rule, kept across evaluations: :class:`RegressionRule` does) makes the
    baselines cost one store read per new 5-minute slice instead of a read of the whole window
    on every call; without it the baselines are read whole.  ``held``: instances that are
    pending or firing, judged against the baseline they had at onset instead of the current
    one (a trailing baseline would otherwise learn a lasting regression as normal)."""
    if cache is None or cache.spec is not spec:
        cache = BaselineCache(spec)
    loader = _Loader(store, spec.step)
    recent_start = now - spec.recent_window
    baselines = baseline_windows(spec, now)
    for kind, window in baselines:
        cache.refresh(store, kind, window)
    # The recent window: whole buckets starting in [recent_start, now].
    stamps, recent_by = cache.recent.read(store, recent_start, now)
    recent_load = _RecentLoad(store, cache, recent_start, now)

    findings: list[Finding] = []
    for key in sorted(recent_by):
        arr = recent_by[key]
        present = ~np.isnan(arr)
        recent = arr[present]
        if len(recent) < spec.min_points:
            continue
        first_recent = float(stamps[present][0])
        load_now = recent_load.median(key)
        hold = held.get(key) if held is not None else None
        if hold is not None:
            c = judge(hold.model, recent, load_now, spec)
            if c is not None and is_regression(c, spec):
                findings.append(_finding(loader, spec, key, hold, c, load_now, now, alertname,
                                         recent_load))
            continue
        # The first baseline whose load model can judge the recent load decides; no other is
        # tried after it (the detector never shops for a baseline that fires).
        for kind, window in baselines:
            deploy = cache.deploy(kind, key, now, first_recent)
            if deploy is not None:  # a new version: against the previous one
                model = cache.model(kind, deploy[0])
            else:
                model = cache.model(kind, key)
            if model is None:
                continue
            c = judge(model, recent, load_now, spec)
            if c is None:
                continue
            if is_regression(c, spec):
                since = None
                if deploy is not None:
                    since = (dict(deploy[0][1]).get("version", ""),
                             dict(key[1]).get("version", ""), deploy[1])
                base = HeldBaseline(kind, window, model, since)
                findings.append(_finding(loader, spec, key, base, c, load_now, now, alertname,
                                         recent_load))
            break
    return findings


class _RecentLoad:
    """The recent window's load of every target, read once per evaluation when first needed
    (most evaluations find no instance with an effect, and read none)."""

    def __init__(self, store: Store, cache: BaselineCache, start: float, now: float) -> None:
        self.store, self.cache, self.start, self.now = store, cache, start, now
        self._by_target: dict[str, list[tuple[Labels, npt.NDArray[np.float64]]]] | None = None

    def models(self, target: str) -> list[str]:
        """``model`` (``version``) of every model of ``target`` with load in the window."""
        self._read()
        assert self._by_target is not None
        out = set()
        for lbl, _ in self._by_target.get(target, []):
            d = dict(lbl)
            if "model" in d:
                out.add(d["model"] + (f" (version {d['version']})" if d.get("version") else ""))
        return sorted(out)

    def _read(self) -> None:
        if self._by_target is None and self.cache.recent_load is None:
            self._by_target = {}
        if self._by_target is None:
            self._by_target = defaultdict(list)
            assert self.cache.recent_load is not None
            read = self.cache.recent_load.read(self.store, self.start, self.now)[1]
            for (t, lbl), larr in read.items():
                self._by_target[t].append((lbl, larr))

    def median(self, key: GroupKey) -> float | None:
        """Median over the window of the instance's load (summed over its series)."""
        if self.cache.recent_load is None:
            return None
        self._read()
        assert self._by_target is not None
        target, labels = key
        want = _load_match(labels)
        return _summed_median([larr for lbl, larr in self._by_target.get(target, [])
                               if _matching(lbl, want)])


class Moved(NamedTuple):
    """One signal's move between a baseline and a recent window (:func:`moved_with`)."""

    series: str
    label: str  # "queue time"
    current: float  # median over the recent window
    baseline: float | None  # median over the baseline window (None: no data there)
    text: str  # "queue time 41 ms (x4.1)"
    unit: str = ""  # "ratio", "s", "req/s" or "": how fmt_value shows current and baseline

    @property
    def change(self) -> float | None:
        """Relative change (+3.1 = +310 %); None without a baseline."""
        return None if self.baseline is None else relative_change(self.current, self.baseline)

    @property
    def size(self) -> float:
        """How far it moved, as |log ratio| (infinite from or to zero; 0 without baseline)."""
        if self.baseline is None:
            return 0.0
        if self.baseline <= 0 or self.current <= 0:
            return 0.0 if self.baseline == self.current else math.inf
        return abs(math.log(self.current / self.baseline))


def moved_with(
    store: Store,
    target: str,
    model: Mapping[str, str],
    *,
    recent: tuple[float, float],
    baseline: tuple[float, float],
    names: Sequence[str] = DEFAULT_RELATED,
    step: float = 60.0,
    skip: Sequence[str] = (),
) -> list[Moved]:
    """What moved with a regression: each of ``names`` on ``target`` (series of the model
    ``model`` names, e.g. ``{"model": "llm", "version": "2"}``; ``sli:gpu_*`` series of every
    GPU of the target), its median over ``recent`` against its median over ``baseline``
    (``step`` buckets averaged over the matching series), ranked by how far it moved (|log
    ratio|), largest first; series without data in ``recent`` are left out.

    The alert annotations' "likely cause" and the dashboard's "what moved with it" both come
    from here."""
    loader = _Loader(store, step)
    return _moved(loader, target, dict(model), recent, baseline, names, skip)


def _moved(
    loader: _Loader,
    target: str,
    model: dict[str, str],
    recent: tuple[float, float],
    baseline: tuple[float, float],
    names: Sequence[str],
    skip: Sequence[str],
) -> list[Moved]:
    out: list[Moved] = []
    for name in names:
        if name in skip:
            continue
        want = {} if name.startswith(_GPU_PREFIX) else model

        def pick(window: tuple[float, float], name: str = name,
                 want: dict[str, str] = want) -> list[float]:
            data = loader.get(name, window[0], window[1], want, target)
            kept = [sd for sd in data
                    if all(dict(sd.labels).get(k) == v for k, v in want.items())]
            return list(group_points(kept, ()).get((target, ()), {}).values())

        cur, base = pick(recent), pick(baseline)
        if not cur:
            continue
        label, unit = display(name)
        c = float(np.median(cur))
        b = float(np.median(base)) if base else None
        text = f"{label} {fmt_value(c, unit)}" + (f" ({fmt_change(c, b)})" if b is not None
                                                 else "")
        out.append(Moved(name, label, c, b, text, unit))
    out.sort(key=lambda m: -m.size)  # stable: equal moves keep the order of ``names``
    return out


def likely_cause(moved: Sequence[Moved], limit: int = 3) -> str:
    """The largest moves (at least :data:`CAUSE_MIN_CHANGE`) as one line, e.g. ``queue time
    41 ms (x4.1); KV-cache utilization 97 % (+25 %)``; "" when nothing moved that much."""
    big = [m for m in moved if m.size >= math.log1p(CAUSE_MIN_CHANGE)]
    return "; ".join(m.text for m in big[:limit])


def _related(
    loader: _Loader,
    spec: RegressionSpec,
    key: GroupKey,
    base_window: tuple[float, float],
    now: float,
) -> list[Moved]:
    target, labels = key
    names = spec.related if spec.related is not None else DEFAULT_RELATED
    skip = [spec.series, *load_names(spec)]
    return _moved(loader, target, _load_match(labels), (now - spec.recent_window,
                  now + spec.step), base_window, names, skip)


def _finding(
    loader: _Loader,
    spec: RegressionSpec,
    key: GroupKey,
    base: HeldBaseline,
    c: Comparison,
    load_now: float | None,
    now: float,
    alertname: str | None,
    recent_load: _RecentLoad,
) -> Finding:
    kind, base_window, load_base = base.kind, base.window, base.load
    target, labels = key
    label, unit = display(spec.series)
    against = (
        "the same hours last week" if kind == "week_ago"
        else f"the {fmt_duration(spec.baseline_window)} before"
    )
    short_against = (
        "last week" if kind == "week_ago" else f"last {fmt_duration(spec.baseline_window)}"
    )
    moved = _related(loader, spec, key, base_window, now)
    related = tuple(m.text for m in moved)
    cause = likely_cause(moved)
    where = ", ".join(f"{k}={v}" for k, v in labels) or "all"
    at_load = " at this load" if load_now is not None and load_base is not None else ""
    if base.deploy is not None:
        old_v, new_v, since = base.deploy
        hhmm = time.strftime("%H:%M", time.gmtime(since))
        short_against = f"version {old_v}, since version {new_v} at {hhmm} UTC"
        against = (f"version {old_v} over the {fmt_duration(spec.baseline_window)} before "
                   f"version {new_v} appeared at {hhmm} UTC")
    summary = (
        f"{label[:1].upper()}{label[1:]} {fmt_change(c.current, c.baseline)} vs "
        f"{short_against}{at_load}" + ("; " + cause if cause else "")
    )
    if load_now is not None and load_base is not None:
        load_text = (
            f"expected at the load now ({fmt_value(load_now, 'req/s')}, "
            f"{fmt_change(load_now, load_base)} vs {fmt_value(load_base, 'req/s')} in the "
            f"baseline) by the baseline's load response (elasticity {c.elasticity:.2f}, the "
            f"least favourable to an alert within its 99 % interval "
            f"{base.model.slopes[0]:.2f} to {base.model.slopes[2]:.2f})"
        )
    elif spec.load_series is None:
        load_text = "load not modelled"
    else:
        load_text = "load unknown (no request rate)"
    description = (
        f"{label} of {where} on {target}: median {fmt_value(c.current, unit)} over the last "
        f"{fmt_duration(spec.recent_window)} against {fmt_value(c.baseline, unit)} "
        f"{load_text}, from {against} ({kind}); change {c.change * 100:+.1f} % "
        f"(min {spec.min_effect * 100:.0f} %), robust z {c.z:+.1f}, Mann-Whitney p "
        f"{c.p_value:.1g}, {c.n_recent} vs {c.n_baseline} points."
        + (" Moved with it (largest move first): " + "; ".join(related) + "."
           if related else "")
    )
    ann: dict[str, str] = {
        "summary": summary,
        "description": description,
        "baseline": kind,
        "baseline_window": fmt_duration(spec.baseline_window),
        "current_value": f"{c.current:.6g}",
        "baseline_value": f"{c.baseline:.6g}",
        "change_percent": f"{c.change * 100:.1f}",
        "robust_z": f"{c.z:.2f}",
        "p_value": f"{c.p_value:.2g}",
        "elasticity": f"{c.elasticity:.3g}",
        "likely_cause": cause or "none of the server-side signals moved by 10 % or more",
    }
    if base.deploy is not None:
        ann["since_version"] = base.deploy[1]
        ann["previous_version"] = base.deploy[0]
        ann["deployed_at"] = f"{base.deploy[2]:.0f}"
    if "model" not in dict(labels):
        # A GPU (or target-wide) instance: name the models it serves, as labels cannot (they
        # would change whenever a model is loaded or unloaded).
        models = recent_load.models(target)
        if models:
            ann["models"] = ", ".join(models)
    if load_now is not None:
        ann["load_current"] = f"{load_now:.6g}"
    if load_base is not None:
        ann["load_baseline"] = f"{load_base:.6g}"
    ann.update(spec.annotations)
    lbl = {"alertname": alertname or spec.name, "rule": spec.name, "target": target}
    lbl.update(dict(labels))
    lbl.update(spec.labels)
    candidate = AlertCandidate(make_labels(lbl), make_labels(ann), c.change)
    return Finding(target, labels, kind, c, load_now, load_base, related, candidate, base)


class _Held(NamedTuple):
    baseline: HeldBaseline
    since: float  # first evaluation the condition held
    last_true: float
    absent_since: float | None  # first evaluation without it since it last held


@dataclass
class RegressionRule:
    """A :class:`alerts.model.Rule` running :func:`detect` for one :class:`RegressionSpec`.

    **Baselines are held at onset.**  From the evaluation an instance is first found (it
    becomes pending) until it would resolve, it is judged against the baseline that found it,
    not against the moving one: a trailing baseline of 4 h would otherwise have learnt a
    lasting regression as normal after about 2 h and resolved the alert while it still
    lasted.  The rule follows the engine's state machine (``for``, ``keep_firing_for``) to
    know when an instance resolves: a pending one lets go at the first evaluation without it,
    a firing one once it has been absent for ``keep_firing_for``.  Held baselines live in
    memory: after a restart an instance still regressed is found again against the current
    baseline (and held from there).
    """

    spec: RegressionSpec
    alertname: str | None = None
    name: str = field(init=False)
    for_s: float = field(init=False)
    keep_firing_for_s: float = field(init=False)

    #: Load histories shared with the other rules of the same rules file.
    shared_loads: SharedLoads | None = field(default=None, repr=False, compare=False)
    cache: BaselineCache = field(init=False, repr=False, compare=False)
    #: Instances pending or firing, with the baseline they were first found against.
    held: dict[GroupKey, _Held] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.held = {}
        self.name = self.spec.name
        self.for_s = self.spec.for_s
        self.keep_firing_for_s = self.spec.keep_firing_for_s
        if self.alertname is None:
            self.alertname = self.spec.labels.get("alertname", self.spec.name)
        # Baselines are kept between evaluations: read once per 5-minute slice (detect()).
        self.cache = BaselineCache(self.spec, self.shared_loads)

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        held = {key: h.baseline for key, h in self.held.items()}
        found = detect(store, self.spec, now, alertname=self.alertname, cache=self.cache,
                       held=held)
        seen = set()
        for f in found:
            key = (f.target, f.labels)
            seen.add(key)
            h = self.held.get(key)
            self.held[key] = (_Held(f.baseline, now, now, None) if h is None
                              else h._replace(last_true=now, absent_since=None))
        for key, h in list(self.held.items()):
            if key in seen:
                continue
            fired = h.last_true - h.since >= self.for_s
            absent = now if h.absent_since is None else h.absent_since
            if not fired or now - absent >= self.keep_firing_for_s:
                del self.held[key]  # the engine drops (pending) or resolves it now
            else:
                self.held[key] = h._replace(absent_since=absent)
        return [f.candidate for f in found]


def regression_rules(
    specs: Sequence[RegressionSpec], loads: SharedLoads | None = None
) -> list[Rule]:
    """One rule per spec (the rules file's ``regressions``), sharing their load histories
    through ``loads`` (a new dict when ``None``)."""
    if loads is None:
        loads = {}
    return [RegressionRule(spec, shared_loads=loads) for spec in specs]
