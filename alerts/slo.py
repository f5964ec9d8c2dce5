"""SLO maths: good/total events from the store, burn rates, multiwindow multi-burn-rate tiers,
error budget remaining and projected exhaustion.

Semantics are the SRE Workbook's (../shared/reference/slo-alerting.md §1):

- error ratio over a window = Σbad / Σtotal of the events in it — *not* an average of
  per-interval ratios (a quiet interval with one failure must not weigh like a busy one);
- burn rate = error ratio ÷ (1 - objective); 1 spends exactly the budget over the period;
- a tier (alerts/windows.yaml) fires when the burn over its long AND its short window exceed
  ``factor = budget_fraction * period / long window``; page = OR of the page tiers, ticket = OR
  of the ticket tiers; a tier whose long window holds fewer than ``min_traffic`` events is
  silent;
- budget consumed over the period = period burn rate; remaining = 1 - consumed (negative once
  overspent); projected exhaustion = remaining * period ÷ current burn.

Where the events come from (see ``events``):

- windows up to ``RAW_MAX_WINDOW_S`` (3 days and a bit — every alert tier) read raw samples:
  exact reset-aware counter increases and exact sums of the probes' per-run counts.  The raw
  retention (``store.retention.raw``, 15 d by default) must therefore exceed 3 days;
- longer windows (the 28/30-day budget) read 5-minute buckets, which the store serves from its
  5 m rollups (kept 90 d): counters are differenced between the buckets' last values (a reset
  inside a bucket loses the part of that bucket before the reset), sums may include up to
  5 minutes before the window start, and queue-time slices are 5 minutes long.

The internal model :class:`Slo` is built from the user-facing ``schemas.rules.SloSpec`` by
``Slo.from_spec``; everything here works on it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tritonwatch.schemas.config import ConfigError, error_lines
from tritonwatch.schemas.rules import (
    AvailabilitySli,
    ProbeLatencySli,
    ProbeSuccessSli,
    QueueTimeSli,
    ReadinessSli,
    SloAlerting,
    SloSpec,
)
from tritonwatch.schemas.samples import Labels, label_value, make_labels
from tritonwatch.schemas.values import PositiveDuration
from tritonwatch.store import Query

if TYPE_CHECKING:
    from tritonwatch.store import SeriesData, Store

log = logging.getLogger(__name__)

WINDOWS_FILE = Path(__file__).with_name("windows.yaml")
#: Windows up to this length are computed from raw samples (exact); longer ones from buckets.
RAW_MAX_WINDOW_S = 3 * 86400.0 + 3600.0
#: Bucket size for windows longer than ``RAW_MAX_WINDOW_S`` (served from the 5 m rollups).
LONG_STEP_S = 300.0
#: How far before a window the previous point of a rate series is looked for (queue time).
RATE_LOOKBACK_S = 600.0
#: Cap on probe_results rows read for one window (a probe every 30 s makes 86 400 a month).
PROBE_ROWS_LIMIT = 5_000_000
#: The SLO periods a spec may name.
PERIOD_S = {"28d": 28 * 86400.0, "30d": 30 * 86400.0}

Severity = Literal["page", "ticket"]
SEVERITIES: tuple[Severity, ...] = ("page", "ticket")

SUCCESS_COUNTER = "nv_inference_request_success"
FAILURE_COUNTER = "nv_inference_request_failure"
QUEUE_SERIES = "sli:queue_time_seconds"
RATE_SERIES = "sli:request_rate"
PROBE_GOOD = "probe:slo_good"
PROBE_TOTAL = "probe:slo_total"


# --- burn-rate tiers (alerts/windows.yaml) ---------------------------------------------------


class _WindowSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    severity: Severity
    budget_fraction: float = Field(gt=0, le=1)
    long: PositiveDuration
    short: PositiveDuration


class _WindowsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: Literal[1]
    tiers: tuple[_WindowSpec, ...] = Field(min_length=1)


class BurnWindow(NamedTuple):
    """One multiwindow tier as data: ``budget_fraction`` of the budget spent in ``long_s``."""

    name: str
    severity: Severity
    budget_fraction: float
    long_s: float
    short_s: float

    def factor(self, period_s: float) -> float:
        """Burn rate that spends ``budget_fraction`` of the period's budget in the long window
        (sloth's getBurnRateFactor: fraction * period hours / long-window hours)."""
        return self.budget_fraction * (period_s / 3600.0) / (self.long_s / 3600.0)


def load_windows(path: str | Path | None = None) -> tuple[BurnWindow, ...]:
    """The tiers of ``path`` (default: alerts/windows.yaml); ``ConfigError`` when invalid."""
    if path is None:
        return _default_windows()
    return _read_windows(Path(path))


@lru_cache(maxsize=1)
def _default_windows() -> tuple[BurnWindow, ...]:
    return _read_windows(WINDOWS_FILE)


def _read_windows(path: Path) -> tuple[BurnWindow, ...]:
    try:
        parsed = _WindowsFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except ValidationError as exc:
        raise ConfigError(str(path), error_lines(exc)) from None
    out = []
    for i, w in enumerate(parsed.tiers):
        if w.short >= w.long:
            raise ConfigError(str(path), [f"tiers[{i}].short: must be shorter than long"])
        out.append(BurnWindow(w.name, w.severity, w.budget_fraction, w.long, w.short))
    return tuple(out)


class Tier(NamedTuple):
    """A burn window applied to one SLO: its factor for the SLO's period, and whether it can
    fire at all (a factor at or above the maximum burn 1/(1-objective) never can)."""

    window: BurnWindow
    factor: float
    enabled: bool
    disabled_reason: str | None = None


# --- the internal model ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Slo:
    """An SLO normalised for evaluation (built from ``SloSpec`` by :meth:`from_spec`)."""

    name: str
    description: str
    objective: float  # ratio, e.g. 0.999
    window: str  # "28d" | "30d"
    period_s: float
    sli: ProbeLatencySli | ProbeSuccessSli | AvailabilitySli | QueueTimeSli | ReadinessSli
    by: tuple[str, ...]
    min_traffic: float
    tiers: tuple[Tier, ...]
    labels: Mapping[str, str]
    alerting: SloAlerting
    warnings: tuple[str, ...] = ()

    @property
    def budget(self) -> float:
        """The error budget as a ratio of events: 1 - objective."""
        return 1.0 - self.objective

    @property
    def max_burn(self) -> float:
        """The highest possible burn rate (every event bad): 1 / (1 - objective)."""
        return 1.0 / self.budget

    @classmethod
    def from_spec(cls, spec: SloSpec, windows: Sequence[BurnWindow] | None = None) -> Slo:
        objective = spec.objective / 100.0
        period_s = PERIOD_S[spec.window]
        max_burn = 1.0 / (1.0 - objective)
        tiers = []
        warnings = []
        for w in load_windows() if windows is None else windows:
            factor = w.factor(period_s)
            severity_on = getattr(spec.alerting, w.severity).enabled
            reason = None
            if factor >= max_burn:
                # error ratio ≤ 1, so burn ≤ 1/(1-objective): `burn > factor` cannot happen.
                reason = (
                    f"tier {w.name} needs a burn rate above {factor:g}x but at "
                    f"{spec.objective:g} % the maximum is {max_burn:g}x; it can never fire"
                )
                warnings.append(f"slo {spec.name}: {reason} (disabled)")
            elif not severity_on:
                reason = f"alerting.{w.severity}.enabled is false"
            tiers.append(Tier(w, factor, reason is None, reason))
        return cls(
            name=spec.name,
            description=spec.description,
            objective=objective,
            window=spec.window,
            period_s=period_s,
            sli=spec.sli,
            by=spec.sli.by,
            min_traffic=spec.min_traffic,
            tiers=tuple(tiers),
            labels=dict(spec.labels),
            alerting=spec.alerting,
            warnings=tuple(warnings),
        )


# --- events ----------------------------------------------------------------------------------


class Events(NamedTuple):
    """Good and total events in a window (floats: counters and rates are not integers)."""

    good: float
    total: float

    @property
    def bad(self) -> float:
        return max(self.total - self.good, 0.0)

    @property
    def error_ratio(self) -> float | None:
        """Σbad / Σtotal; ``None`` without events."""
        return self.bad / self.total if self.total > 0 else None

    def __add__(self, other: object) -> Events:
        if not isinstance(other, Events):
            return NotImplemented
        return Events(self.good + other.good, self.total + other.total)


NO_EVENTS = Events(0.0, 0.0)


def burn_rate(events: Events, objective: float) -> float | None:
    """Error ratio ÷ (1 - objective); ``None`` without events."""
    ratio = events.error_ratio
    return None if ratio is None else ratio / (1.0 - objective)


def _group(labels: Labels, target: str, by: Sequence[str]) -> Labels:
    return make_labels(
        (name, target if name == "target" else label_value(labels, name)) for name in by
    )


def _match(sli: AvailabilitySli | QueueTimeSli | ReadinessSli) -> dict[str, str]:
    match = dict(sli.match)
    if sli.model is not None:
        match["model"] = sli.model
    if sli.version is not None:
        match["version"] = sli.version
    return match


def _probe_match(sli: ProbeLatencySli | ProbeSuccessSli) -> dict[str, str]:
    match: dict[str, str] = {"sli": sli.kind}
    if sli.probe is not None:
        match["probe"] = sli.probe
    if sli.model is not None:
        match["model"] = sli.model
    return match


def _sums(
    store: Store, name: str, start: float, end: float, target: str | None,
    match: Mapping[str, str], by: Sequence[str],
) -> dict[Labels, float]:
    """Σ of the samples of every matching series in the window, per group."""
    data: list[SeriesData]
    if end - start <= RAW_MAX_WINDOW_S:
        data = store.read(Query(name, start=start, end=end, target=target, match=match)).series()
    else:
        data = store.read(Query(name, start=start, end=end, step=LONG_STEP_S, agg="sum",
                                target=target, match=match)).series()
    out: dict[Labels, float] = defaultdict(float)
    for s in data:
        out[_group(s.labels, s.target, by)] += math.fsum(s.values)
    return out


def _counter_increase(
    store: Store, name: str, start: float, end: float, target: str | None,
    match: Mapping[str, str], by: Sequence[str],
) -> dict[Labels, float]:
    """Reset-aware increase of every matching counter in the window, per group."""
    out: dict[Labels, float] = defaultdict(float)
    if end - start <= RAW_MAX_WINDOW_S:
        for key, inc in store.increase(Query(name, start=start, end=end, target=target,
                                             match=match)):
            out[_group(key.labels, key.target, by)] += inc
        return out
    for s in store.read(Query(name, start=start, end=end, step=LONG_STEP_S, agg="last",
                              target=target, match=match)).series():
        out[_group(s.labels, s.target, by)] += _reset_aware(s.values)
    return out


def _reset_aware(values: Iterable[float]) -> float:
    total = 0.0
    prev: float | None = None
    for v in values:
        if prev is not None:
            total += v - prev if v >= prev else v
        prev = v
    return total


def _availability(
    store: Store, sli: AvailabilitySli, start: float, end: float, by: Sequence[str]
) -> dict[Labels, Events]:
    match = _match(sli)
    good = _counter_increase(store, SUCCESS_COUNTER, start, end, sli.target, match, by)
    bad = _counter_increase(store, FAILURE_COUNTER, start, end, sli.target, match, by)
    return {g: Events(good.get(g, 0.0), good.get(g, 0.0) + bad.get(g, 0.0))
            for g in {*good, *bad}}


def _queue_time(
    store: Store, sli: QueueTimeSli, start: float, end: float, by: Sequence[str]
) -> dict[Labels, Events]:
    match = _match(sli)
    out: dict[Labels, Events] = defaultdict(lambda: NO_EVENTS)
    if end - start > RAW_MAX_WINDOW_S:
        queue = {s.key[0::2]: dict(zip(s.ts, s.values, strict=True)) for s in store.read(Query(
            QUEUE_SERIES, start=start, end=end, step=LONG_STEP_S, agg="avg",
            target=sli.target, match=match)).series()}
        for s in store.read(Query(RATE_SERIES, start=start, end=end, step=LONG_STEP_S, agg="avg",
                                  target=sli.target, match=match)).series():
            q = queue.get(s.key[0::2], {})
            group = _group(s.labels, s.target, by)
            for ts, rate in zip(s.ts, s.values, strict=True):
                if ts in q:
                    requests = rate * LONG_STEP_S
                    out[group] += Events(requests if q[ts] <= sli.threshold else 0.0, requests)
        return dict(out)
    lo = start - RATE_LOOKBACK_S
    queue = {s.key[0::2]: dict(zip(s.ts, s.values, strict=True)) for s in store.read(Query(
        QUEUE_SERIES, start=lo, end=end, target=sli.target, match=match)).series()}
    for s in store.read(Query(RATE_SERIES, start=lo, end=end, target=sli.target,
                              match=match)).series():
        q = queue.get(s.key[0::2], {})
        group = _group(s.labels, s.target, by)
        for i in range(1, len(s.ts)):
            ts = s.ts[i]
            if ts < start or ts not in q:
                continue
            # The rate covers the interval since the previous scrape: rate * Δt = requests.
            requests = s.values[i] * (ts - s.ts[i - 1])
            out[group] += Events(requests if q[ts] <= sli.threshold else 0.0, requests)
    return dict(out)


def _readiness(
    store: Store, sli: ReadinessSli, start: float, end: float, by: Sequence[str]
) -> dict[Labels, Events]:
    """Each readiness reading is an event, good when it read 1 (ready)."""
    name = "triton_server_ready" if sli.server else "triton_model_ready"
    match = _match(sli)
    out: dict[Labels, Events] = defaultdict(lambda: NO_EVENTS)
    if end - start <= RAW_MAX_WINDOW_S:
        for s in store.read(Query(name, start=start, end=end, target=sli.target,
                                  match=match)).series():
            out[_group(s.labels, s.target, by)] += Events(math.fsum(s.values), len(s.values))
        return dict(out)
    sums = {s.key: s for s in store.read(Query(name, start=start, end=end, step=LONG_STEP_S,
                                               agg="sum", target=sli.target, match=match)).series()}
    for s in store.read(Query(name, start=start, end=end, step=LONG_STEP_S, agg="count",
                              target=sli.target, match=match)).series():
        good = sums.get(s.key)
        out[_group(s.labels, s.target, by)] += Events(
            math.fsum(good.values) if good is not None else 0.0, math.fsum(s.values))
    return dict(out)


def _probe_series(
    store: Store, sli: ProbeLatencySli | ProbeSuccessSli, start: float, end: float,
    by: Sequence[str],
) -> dict[Labels, Events]:
    match = _probe_match(sli)
    good = _sums(store, PROBE_GOOD, start, end, sli.target, match, by)
    total = _sums(store, PROBE_TOTAL, start, end, sli.target, match, by)
    return {g: Events(good.get(g, 0.0), total[g]) for g in total}


def _probe_rows(
    store: Store, sli: ProbeLatencySli, start: float, end: float, by: Sequence[str]
) -> dict[Labels, Events]:
    assert sli.threshold is not None
    attr = "ttft_s" if sli.kind == "ttft" else "itl_s"
    out: dict[Labels, Events] = defaultdict(lambda: NO_EVENTS)
    rows = store.probe_results(probe=sli.probe, start=start, end=end, limit=PROBE_ROWS_LIMIT)
    if len(rows) >= PROBE_ROWS_LIMIT:
        log.warning("slo %s: more than %d probe results in the window; counted the first",
                    sli.kind, PROBE_ROWS_LIMIT)
    for r in rows:
        if (sli.model is not None and r.model != sli.model) or (
            sli.target is not None and r.target != sli.target
        ):
            continue
        labels = make_labels({"probe": r.probe, "model": r.model, "protocol": r.protocol})
        group = _group(labels, r.target, by)
        value = getattr(r, attr)
        # As in the probe sink: failed requests are bad, a success without a value is good.
        good = r.ok and (value is None or value <= sli.threshold)
        out[group] += Events(1.0 if good else 0.0, 1.0)
    return dict(out)


def events(
    store: Store, slo: Slo, start: float, end: float, *, by: Sequence[str] | None = None
) -> dict[Labels, Events]:
    """Good and total events of ``slo`` in ``[start, end]``, per ``by`` group (default: the
    SLO's own; ``()`` gives one entry, keyed ``()``, over everything).  Groups without events
    are absent."""
    group_by = slo.by if by is None else tuple(by)
    sli = slo.sli
    if isinstance(sli, AvailabilitySli):
        found = _availability(store, sli, start, end, group_by)
    elif isinstance(sli, QueueTimeSli):
        found = _queue_time(store, sli, start, end, group_by)
    elif isinstance(sli, ReadinessSli):
        found = _readiness(store, sli, start, end, group_by)
    elif isinstance(sli, ProbeLatencySli) and sli.threshold is not None:
        found = _probe_rows(store, sli, start, end, group_by)
    else:
        found = _probe_series(store, sli, start, end, group_by)
    return {g: e for g, e in found.items() if e.total > 0}


# --- multiwindow, multi-burn-rate ------------------------------------------------------------


class TierStatus(NamedTuple):
    """One tier of one SLO (group) at one instant."""

    name: str
    severity: Severity
    long_s: float
    short_s: float
    factor: float
    long_burn: float | None
    short_burn: float | None
    long_total: float  # events in the long window (what min_traffic guards)
    enough_traffic: bool
    enabled: bool
    firing: bool


def _windows(slo: Slo) -> list[float]:
    return sorted({s for t in slo.tiers for s in (t.window.long_s, t.window.short_s)})


def evaluate_tiers(
    store: Store, slo: Slo, now: float, *, by: Sequence[str] | None = None
) -> dict[Labels, tuple[TierStatus, ...]]:
    """Every tier of every group with events in the longest window, at ``now``."""
    per_window = {w: events(store, slo, now - w, now, by=by) for w in _windows(slo)}
    groups = {g for found in per_window.values() for g in found}
    out = {}
    for group in sorted(groups):
        statuses = []
        for tier in slo.tiers:
            long_ev = per_window[tier.window.long_s].get(group, NO_EVENTS)
            short_ev = per_window[tier.window.short_s].get(group, NO_EVENTS)
            long_burn = burn_rate(long_ev, slo.objective)
            short_burn = burn_rate(short_ev, slo.objective)
            enough = long_ev.total > 0 and long_ev.total >= slo.min_traffic
            firing = (
                tier.enabled and enough and long_burn is not None and short_burn is not None
                and long_burn > tier.factor and short_burn > tier.factor
            )
            statuses.append(TierStatus(
                tier.window.name, tier.window.severity, tier.window.long_s, tier.window.short_s,
                tier.factor, long_burn, short_burn, long_ev.total, enough, tier.enabled, firing,
            ))
        out[group] = tuple(statuses)
    return out


# --- status ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SloStatus:
    """Everything the dashboard and the weekly report show about one SLO (group) at ``now``."""

    name: str
    group: Labels  # the ``by`` labels of this instance; () for the whole SLO
    now: float
    objective: float  # ratio
    window: str
    period_s: float
    good: float  # events over the period
    total: float
    error_ratio: float | None  # Σbad/Σtotal over the period; None without events
    compliance: float | None  # Σgood/Σtotal over the period (the SLI)
    allowed_bad: float  # the budget in events: (1 - objective) * total
    consumed: float  # fraction of the period's budget spent (= period burn rate)
    remaining: float  # 1 - consumed; negative once overspent
    burn_window_s: float  # the window of ``current_burn``
    current_burn: float | None
    exhaustion_in_s: float | None  # at the current burn; 0 when spent; None: not burning
    exhausts_at: float | None
    tiers: tuple[TierStatus, ...]
    page: bool
    ticket: bool
    warnings: tuple[str, ...]

    @property
    def bad(self) -> float:
        return max(self.total - self.good, 0.0)

    @property
    def met(self) -> bool | None:
        """Whether the objective holds over the period; None without events."""
        return None if self.compliance is None else self.compliance >= self.objective


def _status(
    slo: Slo, group: Labels, now: float, period: Events, current: Events,
    tiers: tuple[TierStatus, ...], burn_window_s: float,
) -> SloStatus:
    ratio = period.error_ratio
    consumed = 0.0 if ratio is None else ratio / slo.budget
    remaining = 1.0 - consumed
    burn = burn_rate(current, slo.objective)
    exhaustion: float | None
    if ratio is not None and remaining <= 0:
        exhaustion = 0.0
    elif burn is not None and burn > 0:
        # Spending ``burn`` periods' worth of budget per period: what is left lasts
        # remaining / burn periods (errors leaving the rolling window are not credited).
        exhaustion = remaining * slo.period_s / burn
    else:
        exhaustion = None
    return SloStatus(
        name=slo.name, group=group, now=now, objective=slo.objective, window=slo.window,
        period_s=slo.period_s, good=period.good, total=period.total, error_ratio=ratio,
        compliance=None if ratio is None else 1.0 - ratio, allowed_bad=slo.budget * period.total,
        consumed=consumed, remaining=remaining, burn_window_s=burn_window_s,
        current_burn=burn, exhaustion_in_s=exhaustion,
        exhausts_at=None if exhaustion is None else now + exhaustion, tiers=tiers,
        page=any(t.firing for t in tiers if t.severity == "page"),
        ticket=any(t.firing for t in tiers if t.severity == "ticket"), warnings=slo.warnings,
    )


def slo_statuses(
    store: Store, slo: Slo | SloSpec, now: float, *, burn_window_s: float = 3600.0,
    by: Sequence[str] | None = None,
) -> list[SloStatus]:
    """One status per ``by`` group (default: the SLO's ``sli.by``) that had events in the
    period or in a tier window, sorted by group."""
    model = Slo.from_spec(slo) if isinstance(slo, SloSpec) else slo
    period = events(store, model, now - model.period_s, now, by=by)
    current = events(store, model, now - burn_window_s, now, by=by)
    tiers = evaluate_tiers(store, model, now, by=by)
    groups = sorted({*period, *tiers})
    return [
        _status(model, g, now, period.get(g, NO_EVENTS), current.get(g, NO_EVENTS),
                tiers.get(g, ()), burn_window_s)
        for g in groups
    ]


def slo_status(
    store: Store, slo: Slo | SloSpec, now: float, *, burn_window_s: float = 3600.0
) -> SloStatus:
    """The whole SLO at ``now`` (every event counted together, ``by`` ignored); an SLO
    without events has ``total`` 0, ``error_ratio`` None and its whole budget remaining."""
    found = slo_statuses(store, slo, now, burn_window_s=burn_window_s, by=())
    if found:
        return found[0]
    model = Slo.from_spec(slo) if isinstance(slo, SloSpec) else slo
    return _status(model, (), now, NO_EVENTS, NO_EVENTS, (), burn_window_s)
