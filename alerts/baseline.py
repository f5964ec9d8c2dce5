"""The baselines of a regression rule: which windows (:func:`baseline_windows`), and what a rule
keeps of them between evaluations (:class:`BaselineCache`), so that an hours-long baseline is
read from the store once per 5-minute slice instead of on every evaluation.

**Deploy events** (:meth:`BaselineCache.event`).  For :data:`DEPLOY_WINDOW_S` after a change of
what serves a model, the model is compared with what served it before, at comparable load (the
same load model), and every alert of that hour says since when:

* a **new version** (a ``version`` label not seen before while another version of the model
  had data before it): judged against the previous version's history;
* a **config change** (the model config the collector stored, ``Store.model_config_times``,
  written within the hour, with the instance's data before it): judged against the
  instance's own history before that time;
* a **reload** (the instance's series stopped for at least :data:`RELOAD_GAP_S` and came back:
  a model unloaded and loaded again, or a server restart: Triton drops a model's series while
  it is not loaded and answers nothing while it restarts): judged against its history before
  the gap.

The latest event wins.  Without one, the baseline windows below apply as they are.  The
store keeps a config's time only when its content changes, so a collector restart, which
writes every config it reads again, is no event; a model's very first config is (with no data
before it, there is nothing to compare against and the windows apply as they are).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tritonwatch.alerts.grouping import GroupKey, load_match, load_names, matches, summed
from tritonwatch.alerts.history import BucketHistory, RecentBuckets, ceil_to, floor_to, quantum_for
from tritonwatch.alerts.stats import Buckets, LoadModel, fit_load_model
from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.store import Query

if TYPE_CHECKING:
    from tritonwatch.store import Store

WEEK_S = 7 * 86400.0
#: For this long after a new model version, a config change or a reload, the model is compared
#: with what served it before.
DEPLOY_WINDOW_S = 3600.0
#: A hole at least this long in an instance's series, with data on both sides, is a reload.
RELOAD_GAP_S = 180.0
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
class DeployEvent:
    """A change of what serves a model (see the module docstring), within the last hour."""

    what: str  # "version", "config" or "reload"
    since: float  # unix s: the new version's first bucket, the config time, the gap's end
    previous: GroupKey  # whose history the baseline is (the previous version, or the same)
    before: float  # only the baseline's buckets before this count (inf: all of them)
    old_version: str = ""
    new_version: str = ""

    def since_text(self, hhmm: str) -> str:
        """``since version 2 at 10:04 UTC``, ``since config change at ...``, ``since reload
        at ...``."""
        if self.what == "version":
            return f"since version {self.new_version} at {hhmm} UTC"
        return f"since {'config change' if self.what == 'config' else 'reload'} at {hhmm} UTC"


@dataclass(frozen=True)
class HeldBaseline:
    """The baseline an instance was judged against when it became pending, kept (with its
    window and load model) until the instance resolves: see :class:`RegressionRule`."""

    kind: str  # "trailing" or "week_ago"
    window: tuple[float, float]
    model: LoadModel = field(compare=False)
    #: After a deploy, config change or reload: what changed and when.
    deploy: DeployEvent | None = None
    #: The verdict modelled against the spec's ``load_fallback`` (its ``load_series`` had no
    #: data for the instance).
    fallback: bool = False

    @property
    def load(self) -> float | None:
        """The baseline's (smoothed) median load; None without load data."""
        return math.exp(self.model.center) if self.model.has_load else None


#: What the trailing window says of an instance's reloads (``BaselineCache._window_facts``):
#: its first bucket with data (None: fewer than ``min_points``), last inner hole and empty tail.
_Facts = tuple[float | None, tuple[float, float] | None, tuple[float, float] | None]

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

    def __init__(self, spec: RegressionSpec, loads: SharedLoads | None = None,
                 *, series_of: BaselineCache | None = None) -> None:
        self.spec = spec
        self._series: dict[str, BucketHistory] = (
            {} if series_of is None else series_of._series)
        #: The same rule against ``spec.load_fallback``: the series' histories are this
        #: cache's (not read twice), the load's shared like any other.
        self.fallback: BaselineCache | None = None
        if spec.load_fallback is not None and spec.load_series is not None:
            self.fallback = BaselineCache(
                spec.model_copy(update={"load_series": spec.load_fallback,
                                        "load_fallback": None}), loads, series_of=self)
        #: ``{(target, model): config time}``, read once per quantum when first needed.
        self._config_times: dict[tuple[str, str], float] | None = None
        #: Per (kind or "regressed", instance, time): event and regression models.
        self._event_models: dict[tuple[str, GroupKey, float], LoadModel | None] = {}
        self._facts: dict[GroupKey, _Facts] = {}
        self._reverse: RegressionSpec | None = None
        self._load: dict[str, BucketHistory] = {}
        self._shared_loads: SharedLoads = {} if loads is None else loads
        # The recent window: its buckets older than a grace are kept too (read once).  Shared
        # like the load's: two rules on the same series (the GPU's utilization and its
        # efficiency) read it once per ``now``.
        recent_key = ("recent-series", spec.series, spec.step, tuple(spec.by),
                      tuple(sorted(spec.match.items())), spec.recent_window)
        recent = self._shared_loads.get(recent_key)
        if not isinstance(recent, RecentBuckets):
            recent = self._shared_loads[recent_key] = RecentBuckets(
                spec.series, step=spec.step, by=spec.by, match=spec.match)
        self.recent = recent
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
            # Shared by the rules on the same series and windows, as the load's (below).
            series_key = ("series", spec.series, spec.step, tuple(spec.by),
                          tuple(sorted(spec.match.items())), kind, spec.recent_window,
                          spec.baseline_window, baseline_quantum(spec))
            shared = self._shared_loads.get(series_key)
            hist = shared if isinstance(shared, BucketHistory) else None
            if hist is None:
                hist = self._shared_loads[series_key] = BucketHistory(
                    spec.series, step=spec.step, by=spec.by, match=spec.match)
            self._series[kind] = hist
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
            self._config_times = None
            self._facts = {}
            self._event_models = {k: v for k, v in self._event_models.items()
                                  if k[0] not in (kind, "regressed")}
        if self.fallback is not None:
            self.fallback.refresh(store, kind, window)

    def load_row(self, kind: str, key: GroupKey) -> Buckets | None:
        """The instance's load over the window, summed bucket by bucket over its series (NaN:
        no point); None without a load series or any load point of the instance.  Not to be
        changed: with one series it is that series' row of the history."""
        hist = self._load.get(kind)
        if hist is None:
            return None
        target, labels = key
        want = load_match(labels)
        # Every instance of a target with the same load labels has the same load: a GPU's is
        # its whole target's (a GPU has no model label), and the rules sharing this history
        # (the GPU ones) ask for it too.  Summed once per history and window, and shared: load
        # models keep what they were fitted on, and a sum per GPU and rule was 7 MB at
        # 1,000 targets of 2 GPUs.
        memo_key = ("load_row", target, tuple(sorted(want.items())))
        if memo_key in hist.memo:
            found: Buckets | None = hist.memo[memo_key]
            return found
        by_target = self._by_target.get(kind)
        if by_target is None:  # rows per target, once per window (not a scan per instance)
            by_target = self._by_target[kind] = defaultdict(list)
            for i, (t, _) in enumerate(hist.keys):
                by_target[t].append(i)
        rows = [hist.values[i] for i in by_target.get(target, ())
                if matches(hist.keys[i][1], want)]
        if len(rows) == 1:
            # The usual case (one version of the model), and the row itself, not a sum of
            # one: a view of the history costs the load models nothing.
            found = None if np.isnan(rows[0]).all() else rows[0]
        else:
            found = summed([r.astype(np.float64) for r in rows])
        hist.memo[memo_key] = found
        return found

    def has_load(self, kind: str, key: GroupKey) -> bool:
        """Whether the instance has load data in ``kind``'s window."""
        return self.load_row(kind, key) is not None

    def event(self, store: Store, kind: str, key: GroupKey, now: float, first_recent: float
              ) -> DeployEvent | None:
        """The latest deploy event of ``key`` within :data:`DEPLOY_WINDOW_S` of ``now`` (see
        the module docstring), or None.  A config change or reload is judged on the trailing
        window only (its part before the event), whatever ``kind``: see :meth:`event_model`."""
        found: list[DeployEvent] = []
        dep = self.deploy(kind, key, now, first_recent)
        if dep is not None:
            found.append(DeployEvent("version", dep[1], dep[0], math.inf,
                                     dict(dep[0][1]).get("version", ""),
                                     dict(key[1]).get("version", "")))
        found += self._own_events(store, key, now, first_recent)
        return max(found, key=lambda e: e.since) if found else None

    def _own_events(self, store: Store, key: GroupKey, now: float, first_recent: float
                    ) -> list[DeployEvent]:
        """Config change and reload of ``key`` (the trailing window's history of it)."""
        facts = self._facts.get(key)
        if facts is None:  # once per quantum per instance: the window's data moves with it
            facts = self._facts[key] = self._window_facts(key)
        first, inner, tail = facts
        if first is None:
            return []
        out: list[DeployEvent] = []
        # A reload: a hole of RELOAD_GAP_S or more between data inside the window, or at its
        # end (the data came back in the recent window).  The minutes between the window's
        # end and the recent window's start are in neither: read (rarely: only after an
        # empty bucket at the window's end) to tell a hole from a window edge.
        reload = inner
        if tail is not None and first_recent - tail[0] >= RELOAD_GAP_S and (
                tail[1] - tail[0] >= RELOAD_GAP_S
                or self._none_between(store, key, tail[1], first_recent)):
            reload = (first_recent, tail[0])
        if reload is not None and now - reload[0] <= DEPLOY_WINDOW_S:
            out.append(DeployEvent("reload", reload[0], key, reload[1]))
        model = dict(key[1]).get("model")
        if model is not None:
            if self._config_times is None:
                self._config_times = store.model_config_times()
            at = self._config_times.get((key[0], model))
            if (at is not None and now - at <= DEPLOY_WINDOW_S and at > first
                    and int((self._stamps(key) < at).sum()) >= self.spec.min_points):
                out.append(DeployEvent("config", at, key, at))
        return out

    def _stamps(self, key: GroupKey) -> npt.NDArray[np.float64]:
        """The trailing window's bucket stamps with data of ``key`` (empty: none).  Built
        when asked, not kept per instance: at 1,000 targets with 4-hour windows they were
        18 MB, and besides the window's facts only a model's config change within the hour
        needs them."""
        hist = self._series.get("trailing")
        row = hist.row(key) if hist is not None else None
        if row is None or hist is None or hist.lo is None:
            return np.empty(0)
        seen = np.flatnonzero(~np.isnan(row))
        return (hist.lo + self.spec.step * seen).astype(np.float64)

    def _window_facts(self, key: GroupKey) -> _Facts:
        """The trailing window's first bucket with data of ``key`` (None: fewer than
        ``min_points``), its last inner hole as ``(back, before)`` (only when long enough and
        with ``min_points`` buckets before it) and its empty tail as ``(before, window
        end)`` (one empty bucket or more)."""
        hist = self._series.get("trailing")
        if hist is None or hist.hi is None:
            return None, None, None
        stamps = self._stamps(key)
        if len(stamps) < self.spec.min_points:
            return None, None, None
        step = self.spec.step
        inner: tuple[float, float] | None = None
        gaps = np.flatnonzero(np.diff(stamps) > RELOAD_GAP_S + step / 2)
        if len(gaps) and int(gaps[-1]) + 1 >= self.spec.min_points:
            g = int(gaps[-1])
            inner = (float(stamps[g + 1]), float(stamps[g]) + step)
        tail: tuple[float, float] | None = None
        if hist.hi - (float(stamps[-1]) + step) >= step:
            tail = (float(stamps[-1]) + step, hist.hi)
        return float(stamps[0]), inner, tail

    def _none_between(self, store: Store, key: GroupKey, start: float, end: float) -> bool:
        """Whether ``key``'s series has no point in ``[start, end)``."""
        want = {**self.spec.match, **dict(key[1])}
        data = store.read(Query(self.spec.series, start=start, end=end - 1e-3,
                                step=self.spec.step, agg="avg", match=want,
                                target=key[0])).series()
        return not any(sd.values for sd in data)

    def regressed_model(self, key: GroupKey, since: float) -> LoadModel | None:
        """The load model of ``key``'s trailing buckets from ``since`` on (a firing alert's
        regression itself: what it shows at each load), fitted once per quantum."""
        k = ("regressed", key, since)
        if k not in self._event_models:
            hist = self._series["trailing"]
            row = hist.row(key)
            if row is None or hist.lo is None:
                self._event_models[k] = None
            else:
                keep = hist.lo + self.spec.step * np.arange(len(row)) >= since
                x = self.load_row("trailing", key)
                self._event_models[k] = fit_load_model(
                    np.where(keep, row, np.nan),
                    None if x is None else np.where(keep, x, np.nan), self.spec)
        return self._event_models[k]

    @property
    def reverse_spec(self) -> RegressionSpec:
        """The spec with the other ``direction``: is a firing regression's series back?"""
        if self._reverse is None:
            self._reverse = self.spec.model_copy(
                update={"direction": "up" if self.spec.direction == "down" else "down"})
        return self._reverse

    def event_model(self, kind: str, ev: DeployEvent) -> LoadModel | None:
        """The load model of ``ev``'s baseline: the previous version's over ``kind``'s window,
        or the instance's own buckets before the event."""
        if ev.what == "version":
            return self.model(kind, ev.previous)
        kind = "trailing"  # where the event was seen; a week-ago one knows nothing of it
        k = (kind, ev.previous, ev.before)
        if k not in self._event_models:
            row = self._series[kind].row(ev.previous)
            hist = self._series[kind]
            if row is None or hist.lo is None:
                self._event_models[k] = None
            else:
                stamps = hist.lo + self.spec.step * np.arange(len(row))
                keep = stamps < ev.before
                y = np.where(keep, row, np.nan)
                x = self.load_row(kind, ev.previous)
                self._event_models[k] = fit_load_model(
                    y, None if x is None else np.where(keep, x, np.nan), self.spec)
        return self._event_models[k]

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

