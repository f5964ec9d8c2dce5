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
   whole target's for a GPU).

   **Which driver.**  Each rule models its series against what drives it: the fill rate and
   the GPUs against the request rate (the default); KV-cache use against the requests in
   flight (``sli:llm_active_requests``: KV blocks are held by the requests being served, so
   longer requests, more in flight at the same request rate, fill more of it, and that is no
   regression); TTFT against the prompt-token rate (``sli:prompt_tokens_rate``).  TTFT
   follows both concurrency and prompt length; one composite driver stands for both: the
   prompt-token rate is requests x prompt length, the prefill work arriving per second, which
   rises with more requests and with longer prompts alike.  Requests in flight are not used
   for TTFT: by Little's law they are arrivals x latency, so a server that slows down has more
   of them at the same arrivals, and a model on them would explain a TTFT regression by its
   own echo (nor would a two-variable fit on 4 h of one daily ramp separate two drivers that
   rise together).  Where an instance has no data of its driver in either window (a backend
   that does not export it), the spec's ``load_fallback`` (the request rate for the built-in
   rules) is used instead; the ``load_driver`` annotation says which one a verdict used.

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

**Sparse series.**  A probe measures once per interval (30 s), so the recent window of a
probe series holds 10 or 11 samples in 5 or 6 buckets of 2 (the last one of 1).  At 10 %
noise per sample the median's standard error is about 3.7 %, and ``min_effect`` (15 %) is
about 4 of them; a 3x spike doubles its bucket's mean (the mean of 2 is not robust) and moves
the median up a rank.  One window in about 6,000 of steady ITL passes effect, z and p (the
detection benchmark's false ITL alerts, all at the lower end of the slope interval, 0: the
flat level, not a load change, and not the hysteresis, which only kept them for a minute or
two).  Judging per sample instead of per bucket lowers that by a quarter only; the window
one evaluation later, which shares 4 of its 5 buckets, passes as well in one case of five,
while a regression of 20 % passes both 86 % of the time instead of 90 %.  So the probe's
ITL rule has ``for: 1m`` (two evaluations in a row, at the full thresholds: a pending
instance is not held at the hysteresis ones), at the cost of a minute of delay.

**Deploys.**  For an hour after a new version, a config change or a reload of the model (see
``alerts/baseline.py``), its baseline is what served it before the change, at comparable load
(the same load model), and the alert says "since version N at HH:MM UTC" (or "since config
change at", "since reload at").

Annotations say what changed, by how much, against what expectation at which load (and which
load driver), and what moved with it, ranked (:func:`moved_with`: queue and compute time, KV
cache, waiting and paused requests, fill rate, GPUs and their throttle reasons), the largest
moves as ``likely_cause``.  The labels are only
``alertname``, ``rule``, ``target``, the ``by`` labels and the spec's extra labels.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.alerts.baseline import BaselineCache, HeldBaseline, SharedLoads, baseline_windows
from tritonwatch.alerts.formatting import display, fmt_change, fmt_value, where
from tritonwatch.alerts.grouping import (
    GroupKey,
    SeriesLoader,
    load_match,
    load_names,
    matches,
    summed,
)
from tritonwatch.alerts.model import Rule
from tritonwatch.alerts.moved import likely_cause, related_moves
from tritonwatch.alerts.stats import (
    Comparison,
    fast_median,
    is_regression,
    judge,
    regression_verdict,
)
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.schemas.samples import Labels, make_labels
from tritonwatch.schemas.values import format_duration

if TYPE_CHECKING:
    from tritonwatch.store import Store

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


# --- the detector ----------------------------------------------------------------------------


def detect(
    store: Store,
    spec: RegressionSpec,
    now: float,
    *,
    alertname: str | None = None,
    cache: BaselineCache | None = None,
    held: Mapping[GroupKey, HeldBaseline] | None = None,
    firing: Mapping[GroupKey, float] | None = None,
) -> list[Finding]:
    """Every instance of ``spec`` that has regressed at ``now``.

    ``cache`` (one per rule, kept across evaluations: :class:`RegressionRule` does) makes the
    baselines cost one store read per new 5-minute slice instead of a read of the whole window
    on every call; without it the baselines are read whole.  ``held``: instances that are
    pending or firing, judged against the baseline they had at onset instead of the current
    one (a trailing baseline would otherwise learn a lasting regression as normal);
    ``firing``: those of them that fired (and since when), held at the hysteresis thresholds
    (:func:`alerts.stats.is_regression`) and, where the onset baseline cannot judge the
    load now, until the series is back (see :class:`RegressionRule`)."""
    if firing is None:
        firing = {}
    if cache is None or cache.spec is not spec:
        cache = BaselineCache(spec)
    recent_start = now - spec.recent_window
    baselines = baseline_windows(spec, now)
    for kind, window in baselines:
        cache.refresh(store, kind, window)
    # The recent window: whole buckets starting in [recent_start, now].
    stamps, recent_by = cache.recent.read(store, recent_start, now)
    recent_load = _RecentLoad(store, cache, recent_start, now)
    fb = cache.fallback
    fb_load = _RecentLoad(store, fb, recent_start, now) if fb is not None else None
    ev = _Evaluation(SeriesLoader(store, spec.step), spec, now, alertname, recent_load, fb_load)

    findings: list[Finding] = []
    for key in sorted(recent_by):
        arr = recent_by[key]
        present = ~np.isnan(arr)
        recent = arr[present]
        if len(recent) < spec.min_points:
            continue
        first_recent = float(stamps[present][0])
        load_now = recent_load.median(key)
        # The load driver: the spec's load series, or its fallback where the instance has
        # none of it in either window (a backend without the gauge).
        use, use_load, fallback = cache, load_now, False
        if fb is not None and fb_load is not None and load_now is None and not any(
                cache.has_load(kind, key) for kind, _ in baselines):
            use, use_load, fallback = fb, fb_load.median(key), True
        hold = held.get(key) if held is not None else None
        if hold is not None:
            if hold.fallback != fallback:  # judged against the other driver's load
                use_load = (fb_load.median(key) if hold.fallback and fb_load is not None
                            else load_now)
            on = firing.get(key)
            c = judge(hold.model, recent, use_load, spec)
            if on is None or (c is not None and is_regression(c, spec, held=True)):
                if c is not None and is_regression(c, spec, held=on is not None):
                    findings.append(ev.finding(key, hold, c, use_load))
                continue
            # A firing instance the onset baseline no longer finds regressed (or cannot judge
            # at this load): over hours the daily cycle takes the load far from the onset
            # baseline's, where its load response is a guess.  The regression itself (the
            # trailing buckets since it fired) says whether the series is back: better than
            # it at this load.  Without that model yet, the onset baseline decides.
            regressed = use.regressed_model(key, on)
            rc = (judge(regressed, recent, use_load, use.reverse_spec)
                  if regressed is not None else None)
            if rc is not None:
                if is_regression(rc, use.reverse_spec, held=True):
                    continue  # back
            elif c is not None:
                continue  # judged not regressed by the onset baseline
            shown = judge(hold.model, recent, use_load, spec, held=True)
            if shown is not None:
                findings.append(ev.finding(key, hold, shown, use_load))
            continue
        # The first baseline whose load model can judge the recent load decides; no other is
        # tried after it (the detector never shops for a baseline that fires).  After a
        # deploy, config change or reload, its baseline is what served the model before.
        for kind, window in baselines:
            event = use.event(store, kind, key, now, first_recent)
            if event is not None and event.what != "version" and kind != "trailing":
                continue  # a config change or reload: against the hours just before it
            model = use.event_model(kind, event) if event is not None else use.model(kind, key)
            if model is None:
                continue
            judged, c = regression_verdict(model, recent, use_load, spec)
            if not judged:
                continue
            if c is not None:  # a regression
                base = HeldBaseline(kind, window, model.detached(), event, fallback)
                findings.append(ev.finding(key, base, c, use_load))
            break
    return findings


def load_driver(spec: RegressionSpec, fallback: bool = False) -> str:
    """The load a verdict was modelled against, in words: ``requests in flight
    (sli:llm_active_requests)``, or with ``fallback`` the fallback's and why."""
    names = load_names(spec)
    if fallback and spec.load_fallback is not None:
        fb = load_names(spec.model_copy(update={"load_series": spec.load_fallback}))
        return f"{_driver_words(fb)} ({_driver_words(names)} absent)"
    return _driver_words(names)


_DRIVER_WORDS = {
    "sli:request_rate": "request rate",
    "sli:llm_active_requests": "requests in flight",
    "sli:prompt_tokens_rate": "prompt-token rate",
}


def _driver_words(names: tuple[str, ...]) -> str:
    if not names:
        return "none"
    head = _DRIVER_WORDS.get(names[0], names[0])
    return f"{head} ({' + '.join(names)})"


class _RecentLoad:
    """The recent window's load of every target, read once per evaluation when first needed
    (most evaluations find no instance with an effect, and read none).

    What it works out from a read (the rows per target, each instance's median) is kept in
    the read's :attr:`RecentBuckets.memo`, so the rules sharing the read (the built-in ones
    all weigh load by request rate) work it out once per evaluation, not once per rule:
    the same arithmetic on the same arrays, so the same numbers."""

    def __init__(self, store: Store, cache: BaselineCache, start: float, now: float) -> None:
        self.store, self.cache, self.start, self.now = store, cache, start, now
        self._by_target: dict[str, list[tuple[Labels, npt.NDArray[np.float64]]]] | None = None
        self._memo: dict[object, object] = {}

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
            recent_load = self.cache.recent_load
            assert recent_load is not None
            read = recent_load.read(self.store, self.start, self.now)[1]
            memo = self._memo = recent_load.memo  # this read's: replaced with the next one
            found = memo.get("by_target")
            if found is None:
                by_target: dict[str, list[tuple[Labels, npt.NDArray[np.float64]]]] = (
                    defaultdict(list))
                for (t, lbl), larr in read.items():
                    by_target[t].append((lbl, larr))
                found = memo["by_target"] = by_target
            self._by_target = found  # type: ignore[assignment]

    def median(self, key: GroupKey) -> float | None:
        """Median over the window of the instance's load (summed over its series); None
        when fewer than ``min_points`` buckets have load (a model unloaded for most of the
        window: the median of the one bucket before it is no measure of the load its GPU's
        buckets saw)."""
        if self.cache.recent_load is None:
            return None
        self._read()
        assert self._by_target is not None
        target, labels = key
        want = load_match(labels)
        min_points = self.cache.spec.min_points
        memo_key = ("median", target, tuple(want.items()), min_points)
        if memo_key in self._memo:
            return self._memo[memo_key]  # type: ignore[return-value]
        total = summed([larr for lbl, larr in self._by_target.get(target, [])
                        if matches(lbl, want)])
        out = None
        if total is not None and int((~np.isnan(total)).sum()) >= min_points:
            out = fast_median(total[~np.isnan(total)])
        self._memo[memo_key] = out
        return out


@dataclass(frozen=True)
class _Evaluation:
    """What every finding of one :func:`detect` call shares: its reads, spec and time."""

    loader: SeriesLoader
    spec: RegressionSpec
    now: float
    alertname: str | None
    recent_load: _RecentLoad
    fallback_load: _RecentLoad | None = None

    def finding(
        self, key: GroupKey, base: HeldBaseline, c: Comparison, load_now: float | None
    ) -> Finding:
        """The finding (with its alert's labels and annotations) of instance ``key``, judged
        ``c`` against ``base`` at the recent load ``load_now``."""
        spec, now, alertname = self.spec, self.now, self.alertname
        kind, base_window, load_base = base.kind, base.window, base.load
        target, labels = key
        label, unit = display(spec.series)
        against = (
            "the same hours last week" if kind == "week_ago"
            else f"the {format_duration(spec.baseline_window)} before"
        )
        short_against = (
            "last week" if kind == "week_ago" else f"last {format_duration(spec.baseline_window)}"
        )
        moved = related_moves(self.loader, spec, key, base_window, now)
        related = tuple(m.text for m in moved)
        cause = likely_cause(moved)
        at_load = " at this load" if load_now is not None and load_base is not None else ""
        dep = base.deploy
        if dep is not None:
            hhmm = time.strftime("%H:%M", time.gmtime(dep.since))
            if dep.what == "version":
                short_against = f"version {dep.old_version}, {dep.since_text(hhmm)}"
                against = (f"version {dep.old_version} over the "
                           f"{format_duration(spec.baseline_window)} before version "
                           f"{dep.new_version} appeared at {hhmm} UTC")
            else:
                what = "the config change" if dep.what == "config" else "the reload"
                short_against = f"before, {dep.since_text(hhmm)}"
                against = f"the hours before {what} at {hhmm} UTC"
        driver_spec = (self.fallback_load.cache.spec
                       if base.fallback and self.fallback_load is not None else spec)
        driver = load_driver(spec, base.fallback)
        load_label, load_unit = _load_display(driver_spec)
        summary = (
            f"{label[:1].upper()}{label[1:]} {fmt_change(c.current, c.baseline)} vs "
            f"{short_against}{at_load}" + ("; " + cause if cause else "")
        )
        if load_now is not None and load_base is not None:
            load_text = (
                f"expected at the load now ({load_label} {fmt_value(load_now, load_unit)}, "
                f"{fmt_change(load_now, load_base)} vs {fmt_value(load_base, load_unit)} in "
                f"the baseline) by the baseline's load response (elasticity "
                f"{c.elasticity:.2f}, the least favourable to an alert within its 99 % interval "
                f"{base.model.slopes[0]:.2f} to {base.model.slopes[2]:.2f})"
            )
        elif spec.load_series is None:
            load_text = "load not modelled"
        else:
            load_text = f"load unknown (no {load_label})"
        description = (
            f"{label} of {where(labels)} on {target}: median {fmt_value(c.current, unit)} over "
            "the last "
            f"{format_duration(spec.recent_window)} against {fmt_value(c.baseline, unit)} "
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
            "baseline_window": format_duration(spec.baseline_window),
            "current_value": f"{c.current:.6g}",
            "baseline_value": f"{c.baseline:.6g}",
            "change_percent": f"{c.change * 100:.1f}",
            "robust_z": f"{c.z:.2f}",
            "p_value": f"{c.p_value:.2g}",
            "elasticity": f"{c.elasticity:.3g}",
            "likely_cause": cause or "none of the server-side signals moved by 10 % or more",
        }
        if spec.load_series is not None:
            ann["load_driver"] = driver
        if dep is not None:
            ann["deploy_event"] = dep.what
            ann["deployed_at"] = f"{dep.since:.0f}"
            if dep.what == "version":
                ann["since_version"] = dep.new_version
                ann["previous_version"] = dep.old_version
        if "model" not in dict(labels):
            # A GPU (or target-wide) instance: name the models it serves, as labels cannot (they
            # would change whenever a model is loaded or unloaded).
            models = self.recent_load.models(target)
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


def _load_display(spec: RegressionSpec) -> tuple[str, str]:
    """How the load of ``spec`` is named and shown: ``("request rate", "req/s")``."""
    names = load_names(spec)
    if not names:
        return "load", ""
    return display(names[0])


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

    **A firing instance** holds while its effect against the onset baseline is at least half
    of ``min_effect`` and of ``z_threshold`` (hysteresis: an effect near the threshold, or
    one the least favourable load response shrinks on a ramp, no longer resolves and fires
    again with noise).  Below that, or where the onset baseline cannot judge the load now,
    it still fires until the series is back: better, by half of ``min_effect`` and
    significantly, than a model of the regression itself (the trailing window's buckets
    since it fired) expects at this load.  Over a 6 h regression the daily cycle takes the
    load far from the onset baseline's, where that baseline's load response is a guess: a
    slope fitted at a flat daily peak (0.24, interval 0 to 0.47, true 0.7) explained the
    regression away 50 % higher and resolved the alert 75 minutes early (the onset baseline
    refusing to judge did the same); extrapolating its fitted slope the other way kept one
    firing an hour past the end.  The regression's own model sees the load it ran at.  Once
    the regression is over it resolves ``keep_firing_for`` later.
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
        firing = {key: h.since for key, h in self.held.items()
                  if h.last_true - h.since >= self.for_s}
        found = detect(store, self.spec, now, alertname=self.alertname, cache=self.cache,
                       held=held, firing=firing)
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
