"""The baselines of a regression rule: which windows (:func:`baseline_windows`), and what a rule
keeps of them between evaluations (:class:`BaselineCache`), so that an hours-long baseline is
read from the store once per 5-minute slice instead of on every evaluation."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tritonwatch.alerts.grouping import GroupKey, load_match, load_names, matches, summed
from tritonwatch.alerts.history import BucketHistory, RecentBuckets, ceil_to, floor_to, quantum_for
from tritonwatch.alerts.stats import LoadModel, fit_load_model
from tritonwatch.schemas.regressions import RegressionSpec

if TYPE_CHECKING:
    from tritonwatch.store import Store

WEEK_S = 7 * 86400.0
#: For this long after a new model version appears it is compared with the previous version.
DEPLOY_WINDOW_S = 3600.0
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
        want = load_match(labels)
        by_target = self._by_target.get(kind)
        if by_target is None:  # rows per target, once per window (not a scan per instance)
            by_target = self._by_target[kind] = defaultdict(list)
            for i, (t, _) in enumerate(hist.keys):
                by_target[t].append(i)
        rows = [hist.values[i] for i in by_target.get(target, ())
                if matches(hist.keys[i][1], want)]
        return summed(rows)

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

