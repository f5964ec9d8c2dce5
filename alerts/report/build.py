"""Build a :class:`model.Report` for one ISO week from the store.

Where each number comes from:

- **Completeness**: per target, the successful scrapes stored (Σ ``up`` in 5-minute buckets,
  which the store serves from its rollups) over the scrapes the week should hold at the
  target's interval (``week seconds / interval``, so a 169-hour week expects more).  Targets
  are the configured ones plus any with ``up`` series in the store.
- **SLOs** (``alerts.slo``, the alert engine's own maths and windows): the week's SLI is
  Σgood/Σtotal over ``[start, end]``; the rolling window's SLI, budget consumed and remaining
  are :func:`alerts.slo.slo_status` at the week's end (and a week earlier for the change);
  the peak burn is the highest 1-hour burn the engine's fast page tier saw at an hour
  boundary of the week (hours under the SLO's ``min_traffic`` left out); the projected
  exhaustion assumes this week's burn rate goes on.
- **Incidents**: the alert history (firing/resolved pairs per fingerprint) overlapping the
  week; each SLO's budget spent in an incident is the SLO's bad events in it over the window's
  budget in events (``(1 - objective) * total``) at the week's end.
- **Regressions**: per series, this week's hourly means against last week's (the detector's
  statistics, ``alerts.stats.compare``): at least ``REGRESSION_MIN_EFFECT`` worse, Mann-Whitney
  p ≤ ``REGRESSION_ALPHA``, at comparable load (request rate within ±15 %).
- **Efficiency**: per model, means of hourly means, each against the week before.
- **Advice**: ``advice.py``, from the efficiency numbers and the model configs.

A week without data says so (``warnings``, ``None`` numbers) instead of showing zeros.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tritonwatch.alerts.formatting import display
from tritonwatch.alerts.report import model as m
from tritonwatch.alerts.report.advice import advise
from tritonwatch.alerts.report.weeks import Week
from tritonwatch.alerts.slo import NO_EVENTS, Events, Slo, burn_rate, events, slo_status
from tritonwatch.alerts.stats import compare, load_comparable, relative_change
from tritonwatch.schemas.alerts import AlertEvent
from tritonwatch.schemas.rules import AvailabilitySli, QueueTimeSli, SloSpec
from tritonwatch.schemas.samples import Labels, label_value
from tritonwatch.store import Query
from tritonwatch.store.alerts import AlertStore

if TYPE_CHECKING:
    from tritonwatch.schemas.config import Config
    from tritonwatch.store import Agg, Store

#: An SLO is "at risk" below this much budget left, or while burning faster than 1x.
AT_RISK_REMAINING = 0.25
#: An incident that spent more than this share of an SLO's budget asks for a postmortem.
POSTMORTEM_BUDGET = 0.20
REGRESSION_MIN_EFFECT = 0.20
REGRESSION_ALPHA = 0.001
REGRESSION_LOAD_TOLERANCE = 0.15
#: Hourly points a week needs before it is compared (a day's worth).
REGRESSION_MIN_POINTS = 24
#: How far before the week the alert history is read for incidents that began earlier.
INCIDENT_LOOKBACK_S = 7 * 86400.0
#: Limits: alert events read, incidents and regressions listed.
MAX_ALERT_EVENTS = 20_000
MAX_INCIDENTS = 200
MAX_REGRESSIONS = 200

#: (series, bad direction) compared week over week.
REGRESSION_SERIES: tuple[tuple[str, str], ...] = (
    ("sli:batch_fill_rate", "down"),
    ("sli:kv_cache_utilization", "up"),
    ("sli:gpu_utilization", "down"),
    ("sli:ttft_seconds", "up"),
    ("sli:itl_seconds", "up"),
    ("probe:ttft_seconds", "up"),
    ("probe:itl_seconds", "up"),
)

Hourly = dict[tuple[str, Labels], dict[float, float]]


def _step(week: Week) -> float:
    # Hour buckets are aligned to the epoch; a zone at a half- or quarter-hour offset needs
    # 15-minute buckets for the week's edges to fall on bucket edges.
    return 3600.0 if week.start % 3600 == 0 and week.end % 3600 == 0 else 900.0


def _hourly(store: Store, name: str, week: Week, agg: Agg = "avg") -> Hourly:
    step = _step(week)
    out: Hourly = {}
    for s in store.read(Query(name, start=week.start, end=week.end - 0.001, step=step,
                              agg=agg)).series():
        pts = {ts: v for ts, v in zip(s.ts, s.values, strict=True)
               if week.start <= ts < week.end and math.isfinite(v)}
        if pts:
            out[(s.target, s.labels)] = pts
    return out


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return math.fsum(vals) / len(vals) if vals else None


def _combine(series: Iterable[dict[float, float]], how: str) -> dict[float, float]:
    """Bucket by bucket across several series: ``sum`` (rates) or ``avg`` (ratios)."""
    acc: dict[float, list[float]] = defaultdict(list)
    for pts in series:
        for ts, v in pts.items():
            acc[ts].append(v)
    if how == "sum":
        return {ts: math.fsum(v) for ts, v in sorted(acc.items())}
    return {ts: math.fsum(v) / len(v) for ts, v in sorted(acc.items())}


def _per_model(data: Hourly, how: str) -> dict[tuple[str, str], dict[float, float]]:
    groups: dict[tuple[str, str], list[dict[float, float]]] = defaultdict(list)
    for (target, labels), pts in data.items():
        model = label_value(labels, "model", "")
        if model:
            groups[(target, model)].append(pts)
    return {k: _combine(v, how) for k, v in groups.items()}


def _per_target(data: Hourly, how: str) -> dict[str, dict[float, float]]:
    groups: dict[str, list[dict[float, float]]] = defaultdict(list)
    for (target, _), pts in data.items():
        groups[target].append(pts)
    return {k: _combine(v, how) for k, v in groups.items()}


def _change(current: float | None, previous: float | None) -> m.Change:
    change = None
    if current is not None and previous is not None and previous != 0:
        change = relative_change(current, previous)
    return m.Change(current, previous, change)


# --- completeness ----------------------------------------------------------------------------


def completeness(store: Store, config: Config, week: Week,
                 now: float | None = None) -> tuple[m.TargetCompleteness, ...]:
    # A week still in progress expects only the scrapes of the hours that have passed.
    until = week.end if now is None else max(week.start, min(week.end, now))
    intervals = {t.name: config.interval_for(t) for t in config.targets}
    stored: dict[str, float] = defaultdict(float)
    for s in store.read(Query("up", start=week.start, end=week.end - 0.001, step=300.0,
                              agg="sum")).series():
        stored[s.target] += math.fsum(v for ts, v in zip(s.ts, s.values, strict=True)
                                      if week.start <= ts < week.end)
    out = []
    for target in sorted({*intervals, *stored}):
        interval = intervals.get(target, config.scrape.interval)
        expected = max(1, round((until - week.start) / interval))
        got = round(stored.get(target, 0.0))
        ratio = min(1.0, got / expected)
        warning = None
        if ratio < config.reports.completeness_warning:
            warning = (
                f"only {ratio * 100:.1f} % of the expected scrapes of {target} are stored "
                f"({got} of {expected} at {interval:g} s): numbers involving this target "
                "miss part of the week"
            )
        out.append(m.TargetCompleteness(target, interval, expected, got, ratio, warning))
    return tuple(out)


# --- SLOs ------------------------------------------------------------------------------------


def _total(found: Mapping[Labels, Events]) -> Events:
    return found.get((), NO_EVENTS)


def _span(store: Store, slo: Slo, start: float, end: float) -> Events:
    """Events of ``slo`` belonging to ``[start, end]`` as a partition of time: a counter's
    increase runs from the sample at ``start`` to the one at ``end`` (both needed), while a
    per-interval sample (a probe run's counts, a queue-time slice) is stamped at the end of
    the interval it covers, so the one at ``start`` belongs to the span before."""
    lo = start if isinstance(slo.sli, AvailabilitySli) else start + 0.001
    return _total(events(store, slo, lo, end, by=()))


def _week_events(store: Store, slo: Slo, week: Week) -> Events:
    return _span(store, slo, week.start, week.end)


def _hourly_burns(store: Store, slo: Slo, week: Week) -> list[tuple[float, float | None]]:
    out: list[tuple[float, float | None]] = []
    t = week.start
    while t + 3600.0 <= week.end + 1e-6:
        ev = _span(store, slo, t, t + 3600.0)
        burn = burn_rate(ev, slo.objective) if ev.total >= max(slo.min_traffic, 1e-12) else None
        out.append((t + 3600.0, burn))
        t += 3600.0
    return out


def _state(total: float, remaining: float, week_burn: float | None) -> m.SloState:
    if total <= 0:
        return "no_data"
    if remaining <= 0:
        return "breached"
    if remaining < AT_RISK_REMAINING or (week_burn is not None and week_burn > 1.0):
        return "at_risk"
    return "held"


def slo_section(store: Store, spec: SloSpec, week: Week, history_weeks: int) -> m.SloSection:
    slo = Slo.from_spec(spec)
    wk = _week_events(store, slo, week)
    prev = _week_events(store, slo, week.shift(-1))
    status = slo_status(store, slo, week.end)
    before = slo_status(store, slo, week.shift(-1).end)
    sli_week = None if wk.total <= 0 else wk.good / wk.total
    sli_prev = None if prev.total <= 0 else prev.good / prev.total
    week_burn = burn_rate(wk, slo.objective)
    spent = wk.bad / status.allowed_bad if status.allowed_bad > 0 else None
    exhaustion = None
    if status.total > 0 and status.remaining <= 0:
        exhaustion = week.end
    elif week_burn is not None and week_burn > 0:
        exhaustion = week.end + status.remaining * slo.period_s / week_burn
    burns = _hourly_burns(store, slo, week)
    peak = max((b for b in burns if b[1] is not None), key=lambda b: b[1] or 0.0, default=None)
    strip = []
    for back in range(history_weeks - 1, -1, -1):
        w = week.shift(-back)
        ev = wk if back == 0 else _week_events(store, slo, w)
        burn = burn_rate(ev, slo.objective)
        state: m.WeekState = (
            "no_data" if burn is None else "met" if burn <= 1.0 else "missed"
        )
        strip.append(m.StripCell(w.name, None if ev.total <= 0 else ev.good / ev.total,
                                 burn, state))
    return m.SloSection(
        name=slo.name, description=slo.description, kind=spec.sli.kind,
        objective=slo.objective, window=slo.window,
        state=_state(status.total, status.remaining, week_burn),
        sli_week=sli_week, sli_previous_week=sli_prev,
        sli_change=None if sli_week is None or sli_prev is None else sli_week - sli_prev,
        sli_window=status.compliance, events_week=wk.total, bad_week=wk.bad,
        budget_consumed=status.consumed, budget_remaining=status.remaining,
        budget_remaining_previous=before.remaining if before.total > 0 else None,
        budget_spent_week=spent, burn_week=week_burn,
        peak_burn_1h=None if peak is None else peak[1],
        peak_burn_at=None if peak is None else peak[0],
        exhaustion_at=exhaustion, exhausted=status.total > 0 and status.remaining <= 0,
        strip=tuple(strip), hourly_burn=tuple(b for _, b in burns),
    )


# --- incidents -------------------------------------------------------------------------------


def _intervals(evs: Sequence[AlertEvent]) -> list[tuple[AlertEvent, float, float | None]]:
    """(first firing event, start, end or None) per (fingerprint, starts_at)."""
    found: dict[tuple[str, float], tuple[AlertEvent, float | None]] = {}
    for e in evs:
        key = (e.fingerprint, e.starts_at)
        first, end = found.get(key, (e, None))
        if e.status == "resolved":
            end = e.ends_at if e.ends_at is not None else e.ts
        found[key] = (first, end)
    return sorted(((e, k[1], end) for k, (e, end) in found.items()), key=lambda x: x[1])


def _applies(spec: SloSpec, labels: Mapping[str, str]) -> bool:
    if "slo" in labels:
        return labels["slo"] == spec.name
    sli = spec.sli
    for name in ("model", "target"):
        want = getattr(sli, name, None)
        if want is not None and name in labels and labels[name] != want:
            return False
    return True


def incidents(
    store: Store, specs: Sequence[SloSpec], allowed_bad: Mapping[str, float], week: Week
) -> tuple[m.Incident, ...]:
    evs = AlertStore(store).events(start=week.start - INCIDENT_LOOKBACK_S, end=week.end,
                                   limit=MAX_ALERT_EVENTS)
    out = []
    for first, start, end in _intervals(evs):
        if start >= week.end or (end is not None and end < week.start):
            continue
        labels = dict(first.labels)
        lo, hi = max(start, week.start), min(end if end is not None else week.end, week.end)
        shares = []
        for spec in specs:
            budget = allowed_bad.get(spec.name, 0.0)
            if not _applies(spec, labels) or budget <= 0:
                continue
            bad = _span(store, Slo.from_spec(spec), lo, hi).bad
            if bad > 0:
                shares.append(m.BudgetShare(spec.name, bad, bad / budget))
        out.append(m.Incident(
            alertname=labels.get("alertname", ""), severity=labels.get("severity", ""),
            labels=labels, summary=dict(first.annotations).get("summary", ""),
            started_at=start, resolved_at=end, duration_s=max(0.0, hi - lo),
            budget=tuple(shares),
            postmortem=any(s.budget_spent > POSTMORTEM_BUDGET for s in shares),
        ))
        if len(out) >= MAX_INCIDENTS:
            break
    return tuple(out)


# --- regressions and efficiency ----------------------------------------------------------------


class _Weeks:
    """Hourly means of this week and the week before, read once per series name."""

    def __init__(self, store: Store, week: Week) -> None:
        self.store, self.week, self.prev = store, week, week.shift(-1)
        self._cache: dict[tuple[str, bool], Hourly] = {}

    def get(self, name: str, previous: bool = False) -> Hourly:
        key = (name, previous)
        if key not in self._cache:
            self._cache[key] = _hourly(self.store, name, self.prev if previous else self.week)
        return self._cache[key]


def _load(w: _Weeks, target: str, model: str, previous: bool) -> float | None:
    pts = [p for (t, labels), p in w.get("sli:request_rate", previous).items()
           if t == target and (not model or label_value(labels, "model", "") == model)]
    if not pts:
        return None
    return float(np.median(list(_combine(pts, "sum").values())))


def regressions(w: _Weeks) -> tuple[m.Regression, ...]:
    out = []
    for name, direction in REGRESSION_SERIES:
        now, before = w.get(name), w.get(name, previous=True)
        for key in sorted(set(now) & set(before)):
            cur, base = list(now[key].values()), list(before[key].values())
            if len(cur) < REGRESSION_MIN_POINTS or len(base) < REGRESSION_MIN_POINTS:
                continue
            c = compare(cur, base, direction)
            sign = 1.0 if direction == "up" else -1.0
            if c.baseline == 0 or sign * c.change < REGRESSION_MIN_EFFECT:
                continue
            if c.p_value > REGRESSION_ALPHA:
                continue
            target, labels = key
            model = label_value(labels, "model", "")
            load_now, load_base = _load(w, target, model, False), _load(w, target, model, True)
            if (load_now is None) != (load_base is None):
                continue  # load known in one week only: not comparable
            if not load_comparable(load_now, load_base, REGRESSION_LOAD_TOLERANCE):
                continue
            out.append(m.Regression(
                series=name, what=display(name)[0], target=target, labels=dict(labels),
                direction=direction, current=c.current, baseline=c.baseline, change=c.change,
                p_value=c.p_value, load_current=load_now, load_baseline=load_base,
            ))
    out.sort(key=lambda r: -abs(r.change))
    return tuple(out[:MAX_REGRESSIONS])


def _gpu_count(w: _Weeks, target: str, previous: bool) -> int:
    return len({label_value(labels, "gpu_uuid", "") for (t, labels) in
                w.get("sli:gpu_utilization", previous) if t == target})


def _model_mean(w: _Weeks, name: str, how: str, key: tuple[str, str],
                previous: bool) -> float | None:
    pts = _per_model(w.get(name, previous), how).get(key)
    return None if not pts else _mean(pts.values())


def _target_mean(w: _Weeks, name: str, target: str, previous: bool) -> float | None:
    pts = _per_target(w.get(name, previous), "avg").get(target)
    return None if not pts else _mean(pts.values())


def _headroom(w: _Weeks, key: tuple[str, str], previous: bool) -> float | None:
    pts = _per_model(w.get("sli:kv_cache_utilization", previous), "avg").get(key)
    return None if not pts else 1.0 - max(pts.values())


def _tokens_per_gpu(w: _Weeks, key: tuple[str, str], previous: bool) -> float | None:
    rate = _model_mean(w, "sli:generation_tokens_rate", "sum", key, previous)
    gpus = _gpu_count(w, key[0], previous)
    return None if rate is None or gpus == 0 else rate / gpus


def efficiency(w: _Weeks) -> tuple[m.ModelEfficiency, ...]:
    models: set[tuple[str, str]] = set()
    for name in ("sli:request_rate", "sli:batch_fill_rate", "sli:kv_cache_utilization"):
        models |= set(_per_model(w.get(name), "avg"))
    out = []
    for key in sorted(models):
        target = key[0]

        def both(fn: Any, *args: Any) -> m.Change:
            return _change(fn(*args, False), fn(*args, True))

        out.append(m.ModelEfficiency(
            target=target, model=key[1],
            fill_rate=both(_model_mean, w, "sli:batch_fill_rate", "avg", key),
            kv_cache_headroom=both(_headroom, w, key),
            gpu_utilization=both(_target_mean, w, "sli:gpu_utilization", target),
            tokens_per_s_per_gpu=both(_tokens_per_gpu, w, key),
            energy_per_inference_j=both(_target_mean, w, "sli:energy_per_inference_joules",
                                        target),
            queue_time_s=both(_model_mean, w, "sli:queue_time_seconds", "avg", key),
            request_rate=both(_model_mean, w, "sli:request_rate", "sum", key),
        ))
    return tuple(out)


def model_signals(w: _Weeks) -> dict[tuple[str, str], dict[str, float]]:
    """The week's means of what the advice rules read, per (target, model)."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name in ("sli:batch_fill_rate", "sli:queue_time_seconds", "sli:compute_time_seconds",
                 "sli:pending_requests", "sli:llm_waiting_requests", "sli:llm_paused_requests",
                 "sli:kv_cache_utilization"):
        how = "sum" if name.endswith("_requests") else "avg"
        for key, pts in _per_model(w.get(name), how).items():
            out[key][name] = math.fsum(pts.values()) / len(pts)
            if name == "sli:kv_cache_utilization":
                out[key]["sli:kv_cache_utilization:peak"] = max(pts.values())
    for key in list(out):
        gpu = _target_mean(w, "sli:gpu_utilization", key[0], False)
        if gpu is not None:
            out[key]["sli:gpu_utilization"] = gpu
    return dict(out)


def _queue_budgets(specs: Sequence[SloSpec]) -> list[tuple[QueueTimeSli, float]]:
    return [(s.sli, s.sli.threshold) for s in specs if isinstance(s.sli, QueueTimeSli)]


# --- the report ------------------------------------------------------------------------------


def _summary(report_slos: Sequence[m.SloSection], incs: Sequence[m.Incident],
             regs: Sequence[m.Regression], advice: Sequence[m.Advice]) -> m.Summary:
    count = {s: sum(1 for x in report_slos if x.state == s)
             for s in ("held", "at_risk", "breached", "no_data")}
    with_data = [s for s in report_slos if s.state != "no_data"]
    if not report_slos:
        health = "No SLOs are defined (alerting.rules_file)."
    elif not with_data:
        health = "No SLO had events this week."
    else:
        worst = min(with_data, key=lambda s: s.budget_remaining)
        health = (f"Lowest budget left: {worst.name} with {worst.budget_remaining * 100:.1f} % "
                  f"of its {worst.window} budget.")
    return m.Summary(
        held=count["held"], at_risk=count["at_risk"], breached=count["breached"],
        no_data=count["no_data"], budget_health=health, incidents=len(incs),
        postmortems=sum(1 for i in incs if i.postmortem), regressions=len(regs),
        advice=len(advice),
    )


def build_report(
    store: Store,
    config: Config,
    specs: Sequence[SloSpec],
    week: Week,
    *,
    config_key: str,
    now: float | None = None,
) -> m.Report:
    """The report of ``week`` (boundaries in ``week.tz``) from what ``store`` holds."""
    generated = time.time() if now is None else now
    comp = completeness(store, config, week, generated)
    sections = tuple(slo_section(store, s, week, config.reports.history_weeks) for s in specs)
    allowed = {s.name: slo_status(store, s, week.end).allowed_bad for s in specs}
    incs = incidents(store, specs, allowed, week)
    w = _Weeks(store, week)
    regs = regressions(w)
    eff = efficiency(w)
    adv = advise(model_signals(w), store.model_configs(), _queue_budgets(specs))
    warnings = [c.warning for c in comp if c.warning]
    if not comp:
        warnings.append("No scrapes are stored for this week: every number below is missing, "
                        "none is estimated.")
    if generated < week.end:
        warnings.append(f"{week.name} is not over yet: this report covers it up to "
                        f"{week.local(generated).strftime('%Y-%m-%d %H:%M %Z')}.")
    for s in sections:
        if s.state == "no_data":
            warnings.append(f"SLO {s.name} had no events this week: its numbers are missing.")
    hours = week.hours
    dst = None
    if hours != 168:
        dst = (f"This week has {hours:g} hours in {week.tz} (a daylight-saving change); "
               "hourly and weekly figures cover exactly those hours.")
    fmt = "%Y-%m-%d %H:%M %Z"
    return m.Report(
        format_version=m.FORMAT_VERSION, week=week.name, timezone=week.tz,
        start=week.start, end=week.end, start_local=week.local(week.start).strftime(fmt),
        end_local=week.local(week.end).strftime(fmt), hours=hours, dst_note=dst,
        generated_at=generated, config_key=config_key, warnings=tuple(warnings),
        summary=_summary(sections, incs, regs, adv), completeness=comp, slos=sections,
        incidents=incs, regressions=regs, efficiency=eff, advice=adv,
    )
