"""Regression detection: a recent window against a baseline, robustly, at comparable load.

For each alert instance (the target plus the spec's ``by`` labels; series sharing them, such as
one per ``gpu_uuid``, are averaged bucket by bucket) at evaluation time ``now``:

1. **Windows.**  Points are averaged into ``step`` buckets.  The *recent* window is
   ``[now - recent_window, now]``.  Baselines are tried in order: with ``baseline: week_ago``
   first the same hours a week earlier (the recent window's midpoint minus 7 days, ± half the
   ``baseline_window``), then the *trailing* ``baseline_window`` just before the recent window.
   Both baselines are aligned down to the 5-minute grid (the smallest multiple of ``step`` of
   at least 5 min): the trailing one ends on the grid line at or before the recent window's
   start (up to 5 min before it), the week-ago one starts on the grid line at or before its
   unaligned start.  So a baseline changes once per 5 minutes, and :class:`BaselineCache`
   reads each of its buckets from the store once and computes its statistics once per
   5 minutes, instead of re-reading hours of raw samples on every 30 s evaluation.
   A baseline is skipped when it has fewer than ``min_points`` buckets, or when load was not
   comparable in it (step 2); the first usable one decides, and no other is tried after it
   (the detector never shops for a baseline that fires).
2. **Comparable load.**  The medians of ``load_series`` (default ``sli:request_rate``) of the
   same target and model (summed over versions and models when the instance has no such
   labels, e.g. a GPU) must differ by at most ``load_tolerance`` (relative) between the windows.
   A fill rate that falls because traffic fell is not a regression.  Without any load data (in
   neither window) the guard cannot be applied and the annotations say so; with load known in
   one window only, the baseline is skipped (the windows cannot be shown comparable).
3. **Effect.**  The relative change of the median, in the bad ``direction``, is at least
   ``min_effect`` (and the baseline median exceeds ``min_baseline``).
4. **Significance.**  Both must hold (SLO-alerting notes §4.2):

   * robust z of the recent median: ``(med_r - med_b) / (1.2533 * 1.4826 * MAD_b / sqrt(n_r))``
     (the standard error of a median of ``n_r`` values whose sigma is estimated from the
     baseline's median absolute deviation; sigma is floored at 1 % of the baseline level, so a
     flat baseline does not turn every wobble into infinity) at least ``z_threshold``;
   * one-sided Mann-Whitney U of the recent buckets against the baseline buckets (normal
     approximation, tie-corrected) with ``p <= alpha``; robust to spikes and skew.

Annotations say what changed, by how much, against which baseline, with which load, and what
moved with it (other SLIs of the same model: queue time, KV-cache, fill rate, ...).  The labels
are only ``alertname``, ``rule``, ``target``, the ``by`` labels and the spec's extra labels.
"""

from __future__ import annotations

import math
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
    "sli:success_ratio": ("success ratio", "ratio"),
    "sli:ttft_seconds": ("server TTFT", "s"),
    "sli:itl_seconds": ("server ITL", "s"),
    "probe:ttft_seconds": ("TTFT", "s"),
    "probe:itl_seconds": ("ITL", "s"),
    "probe:e2e_seconds": ("end-to-end latency", "s"),
}

#: Series of the same model quoted as "what moved with it" when a spec names none.
DEFAULT_RELATED: tuple[str, ...] = (
    "sli:kv_cache_utilization",
    "sli:queue_time_seconds",
    "sli:pending_requests",
    "sli:batch_fill_rate",
    "sli:gpu_utilization",
    "probe:ttft_seconds",
)


class Comparison(NamedTuple):
    """The statistics of one recent window against one baseline."""

    current: float  # recent median
    baseline: float  # baseline median
    change: float  # relative change of the median, signed (+0.38 = +38 %)
    z: float  # robust z of the recent median, signed
    p_value: float  # one-sided Mann-Whitney p in the spec's bad direction
    n_recent: int
    n_baseline: int


class HeldBaseline(NamedTuple):
    """The baseline an instance was judged against when it became pending, kept (with its
    window) until the instance resolves: see :class:`RegressionRule`."""

    kind: str  # "trailing" or "week_ago"
    window: tuple[float, float]
    values: tuple[float, ...]  # the baseline's bucket values, sorted
    load: float | None  # the baseline's load median


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


class _Baseline(NamedTuple):
    n: int  # buckets with a value
    median: float


#: Per row of a window: how many buckets have a value, and their median.
RowStats = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


def _row_stats(values: npt.NDArray[np.float64], rows_at_once: int = 2048) -> RowStats:
    """Per row of ``values`` (NaN: no bucket): how many values, and their median (NaN for
    none), as ``np.median`` of the row's values gives it: the middle one, or the mean of the
    middle two.  Sorted ``rows_at_once`` rows at a time: a whole 4-hour window of 7,000
    instances would be a 13 MB sorted copy."""
    n = (~np.isnan(values)).sum(axis=1)
    median = np.full(len(values), np.nan)
    if not values.size:
        return n, median
    for a in range(0, len(values), rows_at_once):
        part, k = values[a:a + rows_at_once], n[a:a + rows_at_once]
        ordered = np.sort(part, axis=1)  # NaN last
        rows = np.arange(len(part))
        with np.errstate(invalid="ignore"):
            median[a:a + len(part)] = (ordered[rows, np.maximum(k - 1, 0) // 2]
                                       + ordered[rows, k // 2]) / 2
    median[n == 0] = np.nan
    return n, median


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
SharedLoads = dict[tuple[Any, ...], BucketHistory]


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
        self.recent_load = (
            RecentBuckets(spec.load_series, step=spec.step, by=_LOAD_BY, how="sum")
            if spec.load_series is not None else None
        )
        # Per kind, computed on first use after the histories changed (``_held``: the window
        # and both histories' generations they were computed for): every instance's baseline
        # count and median, instances' load medians, and the load history's rows per target.
        self._held: dict[str, tuple[tuple[float, float], int, int]] = {}
        self._stats: dict[str, RowStats | None] = {}
        self._loads: dict[str, dict[GroupKey, float | None]] = {}
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
                key = (spec.load_series, spec.step, kind, spec.recent_window,
                       spec.baseline_window, baseline_quantum(spec))
                load = self._shared_loads.get(key)
                if load is None:
                    load = self._shared_loads[key] = BucketHistory(
                        spec.load_series, step=spec.step, by=_LOAD_BY, how="sum")
                self._load[kind] = load
            load.advance(store, lo, hi)
            load_gen = load.generation
        # Generations, not "did my advance move it": another rule may have moved (or re-read)
        # the shared load history since this cache last looked at it.
        held = (window, hist.generation, load_gen)
        if self._held.get(kind) != held:
            self._held[kind] = held
            self._stats[kind] = None
            self._loads[kind] = {}
            self._by_target.pop(kind, None)

    def baseline(self, kind: str, key: GroupKey) -> _Baseline | None:
        """The instance's baseline count and median (``None``: no bucket in the window)."""
        stats = self._stats[kind]
        hist = self._series[kind]
        if stats is None:
            stats = self._stats[kind] = _row_stats(hist.values)
        i = hist.rows.get(key)
        if i is None or not stats[0][i]:
            return None
        return _Baseline(int(stats[0][i]), float(stats[1][i]))

    def baseline_values(self, kind: str, key: GroupKey) -> npt.NDArray[np.float64]:
        """The instance's baseline bucket values, sorted."""
        row = self._series[kind].row(key)
        return np.sort(row[~np.isnan(row)]) if row is not None else np.empty(0)

    def load(self, kind: str, key: GroupKey) -> float | None:
        """Median over the window of the instance's load summed bucket by bucket."""
        loads = self._loads[kind]
        if key not in loads:
            target, labels = key
            want = _load_match(labels)
            hist = self._load[kind]
            by_target = self._by_target.get(kind)
            if by_target is None:  # rows per target, once per window (not a scan per instance)
                by_target = self._by_target[kind] = defaultdict(list)
                for i, (t, _) in enumerate(hist.keys):
                    by_target[t].append(i)
            loads[key] = _summed_median([
                hist.values[i] for i in by_target.get(target, ())
                if _matching(hist.keys[i][1], want)
            ])
        return loads[key]


def relative_change(current: float, baseline: float) -> float:
    """``(current - baseline) / |baseline|``; +inf for a rise from zero."""
    if baseline != 0:
        return (current - baseline) / abs(baseline)
    return math.inf if current > 0 else 0.0


def _has_effect(current: float, baseline: float, spec: RegressionSpec) -> bool:
    """The effect-size half of :func:`is_regression` (medians only: cheap)."""
    sign = 1.0 if spec.direction == "up" else -1.0
    return (abs(baseline) > spec.min_baseline
            and sign * relative_change(current, baseline) >= spec.min_effect)


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
    _, recent_by = cache.recent.read(store, recent_start, now)
    recent_load = _RecentLoad(store, cache, recent_start, now)

    findings: list[Finding] = []
    for key in sorted(recent_by):
        arr = recent_by[key]
        recent = arr[~np.isnan(arr)]
        if len(recent) < spec.min_points:
            continue
        current = float(np.median(recent))
        hold = held.get(key) if held is not None else None
        if hold is not None:
            load_now = recent_load.median(key)
            if spec.load_series is not None and not load_comparable(
                    load_now, hold.load, spec.load_tolerance):
                continue
            c = compare(recent, hold.values, spec.direction)
            if is_regression(c, spec):
                findings.append(_finding(loader, spec, key, hold, c, load_now, now, alertname))
            continue
        usable = [(kind, window, b) for kind, window in baselines
                  if (b := cache.baseline(kind, key)) is not None
                  and b.n >= spec.min_points]
        # Only the first usable baseline (enough points, comparable load) decides, and only
        # an effect of min_effect can fire: with no candidate showing it, nothing can fire,
        # whichever decides, so the load medians and the tests are skipped (most instances).
        if not any(_has_effect(current, b.median, spec) for _, _, b in usable):
            continue
        load_now = recent_load.median(key)
        for kind, window, _ in usable:
            load_base: float | None = None
            if spec.load_series is not None:
                load_base = cache.load(kind, key)
                if not load_comparable(load_now, load_base, spec.load_tolerance):
                    continue
            values = cache.baseline_values(kind, key)
            c = compare(recent, values, spec.direction)
            if is_regression(c, spec):
                base = HeldBaseline(kind, window, tuple(values.tolist()), load_base)
                findings.append(_finding(loader, spec, key, base, c, load_now, now, alertname))
            break
    return findings


class _RecentLoad:
    """The recent window's load of every target, read once per evaluation when first needed
    (most evaluations find no instance with an effect, and read none)."""

    def __init__(self, store: Store, cache: BaselineCache, start: float, now: float) -> None:
        self.store, self.cache, self.start, self.now = store, cache, start, now
        self._by_target: dict[str, list[tuple[Labels, npt.NDArray[np.float64]]]] | None = None

    def median(self, key: GroupKey) -> float | None:
        """Median over the window of the instance's load (summed over its series)."""
        if self.cache.recent_load is None:
            return None
        if self._by_target is None:
            self._by_target = defaultdict(list)
            read = self.cache.recent_load.read(self.store, self.start, self.now)[1]
            for (t, lbl), larr in read.items():
                self._by_target[t].append((lbl, larr))
        target, labels = key
        want = _load_match(labels)
        return _summed_median([larr for lbl, larr in self._by_target.get(target, [])
                               if _matching(lbl, want)])


def _related(
    loader: _Loader,
    spec: RegressionSpec,
    key: GroupKey,
    base_window: tuple[float, float],
    now: float,
) -> tuple[str, ...]:
    target, labels = key
    names = spec.related if spec.related is not None else DEFAULT_RELATED
    want = _load_match(labels)
    out: list[str] = []
    recent_start = now - spec.recent_window
    for name in names:
        if name == spec.series or name == spec.load_series:
            continue
        cur_data = loader.get(name, recent_start, now + spec.step, want, target)
        base_data = loader.get(name, base_window[0], base_window[1], want, target)

        def pick(data: list[SeriesData]) -> list[float]:
            kept = [sd for sd in data
                    if all(dict(sd.labels).get(k) == v for k, v in want.items())]
            merged = group_points(kept, ()).get((target, ()), {})
            return list(merged.values())

        cur, base = pick(cur_data), pick(base_data)
        if not cur:
            continue
        label, unit = display(name)
        c = float(np.median(cur))
        text = f"{label} {fmt_value(c, unit)}"
        if base:
            text += f" ({fmt_change(c, float(np.median(base)))})"
        out.append(text)
    return tuple(out)


def _finding(
    loader: _Loader,
    spec: RegressionSpec,
    key: GroupKey,
    base: HeldBaseline,
    c: Comparison,
    load_now: float | None,
    now: float,
    alertname: str | None,
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
    related = _related(loader, spec, key, base_window, now)
    where = ", ".join(f"{k}={v}" for k, v in labels) or "all"
    summary = (
        f"{label[:1].upper()}{label[1:]} {fmt_change(c.current, c.baseline)} vs {short_against}"
        + ("; " + "; ".join(related) if related else "")
    )
    if load_now is not None and load_base is not None:
        load_text = (
            f"load {fmt_value(load_now, 'req/s')} now vs {fmt_value(load_base, 'req/s')} "
            f"({fmt_change(load_now, load_base)}, within ±{spec.load_tolerance * 100:.0f} %)"
        )
    elif spec.load_series is None:
        load_text = "load not checked"
    else:
        load_text = "load unknown (no request rate)"
    description = (
        f"{label} of {where} on {target}: median {fmt_value(c.current, unit)} over the last "
        f"{fmt_duration(spec.recent_window)} against {fmt_value(c.baseline, unit)} over "
        f"{against} ({kind}); change {c.change * 100:+.1f} % (min {spec.min_effect * 100:.0f} %), "
        f"robust z {c.z:+.1f}, Mann-Whitney p {c.p_value:.1g}, "
        f"{c.n_recent} vs {c.n_baseline} points; {load_text}."
        + (" Moved with it: " + "; ".join(related) + "." if related else "")
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
    }
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
