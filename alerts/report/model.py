"""The weekly report as values: frozen dataclasses built from the store by ``build.py``.

Renderers (``render.py``) only lay these out; every number they show is here, and
:func:`to_json` is the JSON document (floats rounded to 6 decimals so equal reports are equal
text).  ``None`` means "no data": a missing number is never shown as 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

SloState = Literal["held", "at_risk", "breached", "no_data"]
WeekState = Literal["met", "missed", "no_data"]

#: The report's JSON format; bump when a field changes meaning.
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TargetCompleteness:
    target: str
    interval_s: float
    expected: int  # scrapes the week should hold at the target's interval
    stored: int  # successful scrapes stored (``up`` = 1)
    ratio: float  # stored / expected
    warning: str | None  # set below ``reports.completeness_warning``


@dataclasses.dataclass(frozen=True)
class Change:
    """A number this week against the week before."""

    current: float | None
    previous: float | None
    change: float | None  # relative (+0.25 = +25 %); None when either is missing or 0


@dataclasses.dataclass(frozen=True)
class StripCell:
    week: str
    sli: float | None
    burn: float | None  # the week's error ratio / (1 - objective)
    state: WeekState


@dataclasses.dataclass(frozen=True)
class SloSection:
    name: str
    description: str
    kind: str  # the SLI kind: ttft, itl, success, availability, queue_time
    objective: float  # ratio
    window: str  # 28d / 30d
    state: SloState
    sli_week: float | None  # good / total over the week
    sli_previous_week: float | None
    sli_change: float | None  # sli_week - sli_previous_week (ratio points)
    sli_window: float | None  # over the rolling window ending at the week's end
    events_week: float
    bad_week: float
    budget_consumed: float  # share of the rolling window's budget spent (at the week's end)
    budget_remaining: float  # 1 - consumed; negative once overspent
    budget_remaining_previous: float | None  # a week earlier
    budget_spent_week: float | None  # this week's bad events / the window's budget in events
    burn_week: float | None  # the week's error ratio / (1 - objective)
    peak_burn_1h: float | None  # highest 1 h burn at an hour boundary of the week
    peak_burn_at: float | None  # unix s: the end of that hour
    exhaustion_at: float | None  # unix s: budget gone at this week's burn; None: not burning
    exhausted: bool
    strip: tuple[StripCell, ...]
    hourly_burn: tuple[float | None, ...]  # per hour of the week (the chart's data)


@dataclasses.dataclass(frozen=True)
class BudgetShare:
    slo: str
    bad_events: float
    budget_spent: float  # share of the SLO's window budget (in events)


@dataclasses.dataclass(frozen=True)
class Incident:
    alertname: str
    severity: str
    labels: dict[str, str]
    summary: str
    started_at: float  # unix s
    resolved_at: float | None  # None: still firing at the week's end
    duration_s: float  # inside the week
    budget: tuple[BudgetShare, ...]
    postmortem: bool  # some SLO lost more than ``POSTMORTEM_BUDGET`` to it


@dataclasses.dataclass(frozen=True)
class Regression:
    series: str
    what: str  # "batch fill rate"
    target: str
    labels: dict[str, str]
    direction: str  # the bad direction: up / down
    current: float  # median of this week's hourly means
    baseline: float  # the same for the week before
    change: float  # relative, signed
    p_value: float
    load_current: float | None
    load_baseline: float | None


@dataclasses.dataclass(frozen=True)
class ModelEfficiency:
    target: str
    model: str
    fill_rate: Change
    kv_cache_headroom: Change  # 1 - the highest hourly mean KV-cache utilization
    gpu_utilization: Change  # the target's GPUs
    tokens_per_s_per_gpu: Change
    energy_per_inference_j: Change  # server-wide, per target
    queue_time_s: Change
    request_rate: Change


@dataclasses.dataclass(frozen=True)
class Advice:
    rule: str  # the id of the rule that gave it (advice.py)
    target: str
    model: str
    title: str
    text: str
    numbers: dict[str, float]  # every number the text quotes


@dataclasses.dataclass(frozen=True)
class Summary:
    held: int
    at_risk: int
    breached: int
    no_data: int
    budget_health: str  # one sentence
    incidents: int
    postmortems: int
    regressions: int
    advice: int


@dataclasses.dataclass(frozen=True)
class Report:
    format_version: int
    week: str
    timezone: str
    start: float  # unix s, Monday 00:00 local
    end: float  # unix s, next Monday 00:00 local (exclusive)
    start_local: str
    end_local: str
    hours: float
    dst_note: str | None  # set when the week is not 168 hours long
    generated_at: float
    config_key: str
    warnings: tuple[str, ...]  # missing data and the like, in words
    summary: Summary
    completeness: tuple[TargetCompleteness, ...]
    slos: tuple[SloSection, ...]
    incidents: tuple[Incident, ...]
    regressions: tuple[Regression, ...]
    efficiency: tuple[ModelEfficiency, ...]
    advice: tuple[Advice, ...]


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, 6)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_json(report: Report) -> dict[str, Any]:
    """The JSON document of ``report``: plain types, floats rounded to 6 decimals."""
    data: dict[str, Any] = _plain(dataclasses.asdict(report))
    return data
