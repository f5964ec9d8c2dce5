"""The statistics of a regression verdict: robust z and Mann-Whitney on a window against a
baseline, and the load model (a log-log Theil-Sen line of a series against its load) that says
what a baseline expects at the load now.  Pure functions of arrays: no store, no formatting.
The method is described in ``alerts/detect.py``'s docstring."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.schemas.regressions import RegressionSpec

_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE = 1.2533  # sqrt(pi/2): standard error of a median over that of a mean
_SIGMA_FLOOR = 0.01  # of the baseline level


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



Values = Sequence[float] | npt.NDArray[np.float64]


def fast_median(values: npt.NDArray[np.float64]) -> float:
    """``float(np.median(values))`` for an array of up to :data:`_FAST_MEDIAN_MAX` values, bit
    for bit, in a fraction of the time (numpy's median spends some 20 us in Python whatever
    the length: a load model takes five of them per instance, and a 1,000-target fleet's
    regression rules fit thousands every 5 minutes): ``np.median`` partitions, then takes the
    mean of the middle one or two values, ``(a + b) / 2`` for two; so does this, after a
    sort.  Falls back to ``np.median`` for empty arrays and longer ones."""
    n = len(values)
    if n == 0 or n > _FAST_MEDIAN_MAX:
        return float(np.median(values))
    return sorted_median(np.sort(values))


#: Longest array :func:`fast_median` sorts (a sort is O(n log n), numpy's partition O(n)).
_FAST_MEDIAN_MAX = 4096


def sorted_median(s: npt.NDArray[np.float64]) -> float:
    """``float(np.median(s))`` of a sorted ``s`` (NaN sorts last, and makes it NaN, as in
    ``np.median``)."""
    n = len(s)
    if n == 0 or math.isnan(s[-1]):
        return float(np.median(s))
    h = n // 2
    return float(s[h]) if n % 2 else float((s[h - 1] + s[h]) / 2.0)


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


#: Hysteresis: an instance already pending or firing holds while its effect is at least this
#: share of ``min_effect`` and of ``z_threshold``, and Mann-Whitney p at most HOLD_ALPHA (or
#: the spec's alpha if larger), so that a regression near the threshold does not resolve and
#: fire again with every few per cent of noise.
HOLD_SHARE = 0.5
HOLD_ALPHA = 0.01


def is_regression(c: Comparison, spec: RegressionSpec, *, held: bool = False) -> bool:
    """Effect size, robust z and Mann-Whitney all say "worse" in the spec's direction
    (``held``: with the hysteresis thresholds of an instance already pending or firing)."""
    sign = 1.0 if spec.direction == "up" else -1.0
    if abs(c.baseline) <= spec.min_baseline:
        return False
    share = HOLD_SHARE if held else 1.0
    return (
        sign * c.change >= spec.min_effect * share
        and sign * c.z >= spec.z_threshold * share
        and c.p_value <= (max(spec.alpha, HOLD_ALPHA) if held else spec.alpha)
    )



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



def relative_change(current: float, baseline: float) -> float:
    """``(current - baseline) / |baseline|``; +inf for a rise from zero."""
    if baseline != 0:
        return (current - baseline) / abs(baseline)
    return math.inf if current > 0 else 0.0



# --- the load model --------------------------------------------------------------------------

#: Confidence of the interval of the load response (the Theil-Sen slope): within it the
#: detector takes the slope least favourable to a verdict.
SLOPE_CONFIDENCE_Z = 2.576  # 99 %, two-sided
#: Buckets as a load model is given them: float64, or a history's float32 rows.
Buckets = npt.NDArray[np.floating[Any]]
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
    med = sorted_median(slopes)
    low = float(slopes[lo]) if lo >= 0 else -math.inf
    high = float(slopes[hi]) if hi < big_n else math.inf
    return low, med, high


@dataclass(frozen=True, eq=False, slots=True)
class LoadModel:
    """How one instance's series responded to its load over a baseline window.

    ``log series = intercept + slope * log load``, the slope fitted by Theil-Sen on the
    baseline's buckets (load smoothed over the recent window's length), with its confidence
    interval clipped to the spec's ``elasticity``.  Per slope of ``(low, fit, high)``: the
    intercept (median residual zero); the baseline's residuals come from :meth:`residuals`.

    A model is kept per instance for a quantum (``alerts.baseline.BaselineCache``), and only
    instances showing an effect ever need their residuals (``regression_verdict``).  So the
    model keeps the buckets it was fitted on as they were given (``y``, ``x``: rows of the
    cache's histories, views that copy nothing) and recomputes the fitted points from them
    when asked, the same way :func:`fit_load_model` computed them.  Keeping the fitted points
    (two arrays per instance) was 41 MB of a 1,000-target collector's 4-hour baselines; the
    three sorted residual arrays before them, 55 MB.
    """

    slopes: tuple[float, float, float]
    intercepts: tuple[float, float, float]
    y: Buckets  # the series' buckets, as fitted (not to be changed)
    x: Buckets | None  # and the load's (None: no load)
    width: int  # buckets the load was smoothed over
    center: float  # median log load of the baseline (NaN: no load)
    level: float  # the baseline's median of the series
    floor: float  # values below it count as it in log space
    n: int  # buckets fitted

    @property
    def has_load(self) -> bool:
        return not math.isnan(self.center)

    @property
    def ly(self) -> npt.NDArray[np.float64]:
        """The fitted buckets' log series."""
        return _points(self.y, self.x, self.width, self.floor)[0]

    @property
    def lx(self) -> npt.NDArray[np.float64] | None:
        """The fitted buckets' log load (None: no load)."""
        return _points(self.y, self.x, self.width, self.floor)[1]

    def detached(self) -> LoadModel:
        """This model with its own copies of its buckets.  One kept past its quantum (the
        baseline a pending or firing instance holds, for hours maybe) must not keep the
        histories' arrays of that quantum alive: a row is a view of one, megabytes at 1,000
        targets, and an incident's instances go pending in different quanta."""
        return replace(self, y=np.array(self.y),
                       x=None if self.x is None else np.array(self.x))

    def residuals(self, k: int) -> npt.NDArray[np.float64]:
        """The baseline's residuals about slope ``k`` of ``(low, fit, high)`` and its
        intercept, sorted (empty where that slope is unbounded)."""
        b = self.slopes[k]
        if not math.isfinite(b):
            return np.empty(0)
        ly, lx = _points(self.y, self.x, self.width, self.floor)
        return np.sort(_residuals(ly, lx, b) - self.intercepts[k])


def _points(y: Buckets, x: Buckets | None, width: int, floor: float
            ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
    """The fitted points of buckets ``y`` against load ``x``: the log series and the log of
    the smoothed load, at the buckets where both are known."""
    y64 = np.asarray(y, np.float64)  # a history's row is float32 (``alerts.history.STORED``)
    ok = ~np.isnan(y64)
    lx: npt.NDArray[np.float64] | None = None
    if x is not None:
        xs = smooth(np.asarray(x, np.float64), width)
        ok &= ~np.isnan(xs)
        # np.nanmedian of a 1-D array is np.median of its values less the NaNs.
        lx = _log(xs[ok], max(fast_median(xs[~np.isnan(xs)]) * _LOG_FLOOR, 1e-12)
                  if ok.any() else 1e-12)
    return _log(y64[ok], floor), lx


def fit_load_model(y: Buckets, x: Buckets | None, spec: RegressionSpec) -> LoadModel | None:
    """The load model of one baseline: ``y`` the series' buckets, ``x`` the load's (the same
    slots; None: no load series, or no load data in the window).  None with fewer than
    ``min_points`` usable buckets.  The model keeps ``y`` and ``x``: neither may change
    afterwards.  Either may be float32 (a history's row); everything is computed in float64."""
    ok = ~np.isnan(y)
    level = fast_median(np.asarray(y[ok], np.float64)) if ok.any() else math.nan
    floor = max(abs(level) * _LOG_FLOOR, 1e-12) if math.isfinite(level) else 1e-12
    width = max(1, round(spec.recent_window / spec.step))
    ly, lx = _points(y, x, width, floor)
    if len(ly) < spec.min_points:
        return None
    if lx is None:
        slopes = (0.0, 0.0, 0.0)
        center = math.nan
    else:
        center = fast_median(lx)
        lo_b, hi_b = spec.elasticity if spec.elasticity is not None else (-math.inf, math.inf)
        ts = theil_sen(lx, ly)
        if ts is None:  # one load level only: the slope is anything the bounds allow
            fit = min(max(0.0, lo_b), hi_b)
            ts = (lo_b, fit, hi_b)
        low, fit, high = (min(max(v, lo_b), hi_b) for v in ts)
        slopes = (low, fit, high)
    intercepts = [fast_median(_residuals(ly, lx, b)) if math.isfinite(b) else math.nan
                  for b in slopes]
    return LoadModel(slopes, (intercepts[0], intercepts[1], intercepts[2]), y, x, width,
                     center, level, floor, len(ly))


def _residuals(ly: npt.NDArray[np.float64], lx: npt.NDArray[np.float64] | None, b: float
               ) -> npt.NDArray[np.float64]:
    """Log series less slope ``b`` times log load (the series itself without a load)."""
    return ly - b * lx if lx is not None else ly


def judge(
    model: LoadModel, recent: npt.NDArray[np.float64], load_now: float | None,
    spec: RegressionSpec, *, held: bool = False,
) -> Comparison | None:
    """The recent buckets against what ``model`` expects at the recent load: the residual
    statistics for the slope of the model's interval least favourable to a regression.
    None when the model cannot tell an effect of ``min_effect`` at this load (its slope is
    too uncertain for how far the load moved), or load is known in one window only.

    ``held``: the fitted slope and a comparison at any load: the numbers quoted for a
    firing instance whose onset model cannot judge this load (whether it still fires is
    decided against the regression's own model: ``alerts/detect.py``'s
    :class:`RegressionRule`)."""
    found = _effect(model, recent, load_now, spec, held=held)
    return None if found is None else _comparison(model, recent, spec, found)


def regression_verdict(
    model: LoadModel, recent: npt.NDArray[np.float64], load_now: float | None,
    spec: RegressionSpec,
) -> tuple[bool, Comparison | None]:
    """``(judged, comparison)``: whether ``judge(model, recent, load_now, spec)`` is not
    None, and that comparison where ``is_regression`` holds for it (None where it does not).

    The same verdicts as ``judge`` then ``is_regression``, for a fraction of the cost: most
    instances of a fleet show no effect, and an effect short of ``min_effect`` (compared as
    ``is_regression`` compares it) decides without the residuals' MAD and Mann-Whitney
    (which were two thirds of an evaluation's regression CPU at 300 targets)."""
    found = _effect(model, recent, load_now, spec, held=False)
    if found is None:
        return False, None
    sign = 1.0 if spec.direction == "up" else -1.0
    if not sign * math.expm1(found[2]) >= spec.min_effect * 1.0:  # is_regression's test
        return True, None
    c = _comparison(model, recent, spec, found)
    return True, (c if is_regression(c, spec) else None)


#: What :func:`_effect` found: the recent buckets in log space, the log load now, the effect
#: (median residual of the least favourable slope) and that slope's index.
_Effect = tuple[npt.NDArray[np.float64], float, float, int]


def _effect(
    model: LoadModel, recent: npt.NDArray[np.float64], load_now: float | None,
    spec: RegressionSpec, *, held: bool,
) -> _Effect | None:
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
    if not held and abs(shift) > _SAME_LOAD and (
            not (math.isfinite(low) and math.isfinite(high))
            or max(fit - low, high - fit) * abs(shift) >= math.log1p(spec.min_effect)):
        return None
    sign = 1.0 if spec.direction == "up" else -1.0
    best: tuple[float, int] | None = None
    median_ly = fast_median(ly)  # the same for every slope: computed once
    for k, b in enumerate(model.slopes):
        if not math.isfinite(b) or (held and k != 1):
            continue
        effect = median_ly - (model.intercepts[k] + b * lx_now)
        if best is None or sign * effect < sign * best[0]:
            best = (effect, k)
    if best is None:
        return None
    return ly, lx_now, best[0], best[1]


def _comparison(
    model: LoadModel, recent: npt.NDArray[np.float64], spec: RegressionSpec, found: _Effect,
) -> Comparison:
    ly, lx_now, effect, k = found
    b, a, base_r = model.slopes[k], model.intercepts[k], model.residuals(k)
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

