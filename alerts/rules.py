"""Rules from the rules file: SLO burn-rate rules, threshold rules, and ``load_rules``.

Every rule implements ``alerts.model.Rule``.  Labels identify an alert instance and never move
while the condition lasts; the numbers (burn rates, budget left, the aggregated value) go in
annotations, which are rendered from templates with ``{value}``, ``{threshold}`` and
``{labels[name]}`` (checked when the file is loaded, see ``schemas.rules.check_template``).
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tritonwatch.alerts.slo import (
    SEVERITIES,
    Slo,
    SloStatus,
    TierStatus,
    evaluate_tiers,
    slo_statuses,
)
from tritonwatch.schemas.alerts import AlertCandidate
from tritonwatch.schemas.rules import RulesFile, SloSpec, ThresholdRuleSpec, load_rules_file
from tritonwatch.schemas.samples import Labels, make_labels
from tritonwatch.schemas.values import format_duration
from tritonwatch.store import Query

if TYPE_CHECKING:
    from tritonwatch.alerts.model import Rule
    from tritonwatch.store import Store

#: The error budget shown in SLO alert annotations is recomputed at most this often (it is a
#: 28/30-day figure and the costliest query of an SLO).
BUDGET_REFRESH_S = 300.0

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne,
}


class _Labels(dict[str, str]):
    # An absent label renders empty in a template instead of failing the evaluation.
    def __missing__(self, key: str) -> str:
        return ""


def render(template: str, *, value: float, threshold: float, labels: Mapping[str, str]) -> str:
    """Fill an annotation template (already validated by ``check_template``)."""
    try:
        return template.format(value=value, threshold=threshold, labels=_Labels(labels))
    except (ValueError, KeyError, IndexError):
        return template


def _render_all(
    templates: Mapping[str, str], *, value: float, threshold: float, labels: Mapping[str, str]
) -> dict[str, str]:
    return {k: render(v, value=value, threshold=threshold, labels=labels)
            for k, v in templates.items()}


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "n/a" if x is None else format(x, spec)


# --- SLO burn rate ---------------------------------------------------------------------------


class SloBurnRule:
    """Multiwindow, multi-burn-rate alerts of one SLO: for each ``by`` group, a ``page``
    instance while any page tier fires and a ``ticket`` instance while any ticket tier does.

    Labels: ``alertname`` (``alerting.name``, default ``SLOBurnRate``), ``slo``, ``severity``,
    the SLO's and alerting's labels, and the group's labels (e.g. ``model``).  Annotations carry
    the burn rates of every window of the severity's tiers (``burn_rate_1h`` ...), the firing
    tier's windows and factor, the error budget left and the projected exhaustion.
    """

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self.name = slo.name
        self.for_s = slo.alerting.for_s
        self.keep_firing_for_s = slo.alerting.keep_firing_for_s
        self._budget: dict[Labels, SloStatus] = {}
        self._budget_at: float | None = None

    @classmethod
    def from_spec(cls, spec: SloSpec) -> SloBurnRule:
        return cls(Slo.from_spec(spec))

    def _budgets(self, store: Store, now: float) -> dict[Labels, SloStatus]:
        at = self._budget_at
        if at is None or now < at or now - at >= BUDGET_REFRESH_S:
            self._budget = {s.group: s for s in slo_statuses(store, self.slo, now)}
            self._budget_at = now
        return self._budget

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        out = []
        tiers_by_group = evaluate_tiers(store, self.slo, now)
        if not any(t.firing for tiers in tiers_by_group.values() for t in tiers):
            return []
        budgets = self._budgets(store, now)
        for group, tiers in tiers_by_group.items():
            for severity in SEVERITIES:
                firing = [t for t in tiers if t.severity == severity and t.firing]
                if firing:
                    out.append(self._candidate(group, severity, tiers, firing,
                                               budgets.get(group)))
        return out

    def _candidate(
        self, group: Labels, severity: str, tiers: tuple[TierStatus, ...],
        firing: list[TierStatus], budget: SloStatus | None,
    ) -> AlertCandidate:
        slo, alerting = self.slo, self.slo.alerting
        sev = alerting.page if severity == "page" else alerting.ticket
        labels = {
            **dict(group), **slo.labels, **alerting.labels, "severity": severity,
            **sev.labels, "alertname": alerting.name, "slo": slo.name,
        }
        # The tier burning hardest relative to its threshold is the one quoted.
        top = max(firing, key=lambda t: (t.long_burn or 0.0) / t.factor)
        value = top.long_burn or 0.0
        where = ", ".join(f"{k}={v}" for k, v in group)
        annotations = {
            "summary": f"SLO {slo.name}{f' ({where})' if where else ''} is burning its error "
                       f"budget {value:.1f}x too fast ({severity})",
            "description": (
                f"{slo.description + ' ' if slo.description else ''}Error budget burn "
                f"{_fmt(top.long_burn, '.2f')}x over {format_duration(top.long_s)} and "
                f"{_fmt(top.short_burn, '.2f')}x over {format_duration(top.short_s)}, above "
                f"{top.factor:.3g}x (objective {slo.objective * 100:g} % over {slo.window})."
            ),
            "objective": f"{slo.objective * 100:g}",
            "long_window": format_duration(top.long_s),
            "short_window": format_duration(top.short_s),
            "burn_rate_threshold": f"{top.factor:.4g}",
        }
        for t in tiers:
            if t.severity == severity:
                annotations[f"burn_rate_{format_duration(t.long_s)}"] = _fmt(t.long_burn, ".4g")
                annotations[f"burn_rate_{format_duration(t.short_s)}"] = _fmt(t.short_burn, ".4g")
        if budget is not None:
            annotations["error_budget_remaining"] = f"{budget.remaining:.4f}"
            if budget.exhaustion_in_s is not None:
                annotations["error_budget_exhausted_in"] = format_duration(
                    round(budget.exhaustion_in_s / 60) * 60.0
                )
        annotations.update(_render_all({**alerting.annotations, **sev.annotations},
                                       value=value, threshold=top.factor, labels=labels))
        return AlertCandidate(make_labels(labels), make_labels(annotations), value)


# --- threshold -------------------------------------------------------------------------------


class ThresholdRule:
    """``agg(series[window]) op threshold``, one instance per series (or ``by`` group)."""

    def __init__(self, spec: ThresholdRuleSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.for_s = spec.for_s
        self.keep_firing_for_s = spec.keep_firing_for_s
        self._op = _OPS[spec.op]

    def evaluate(self, store: Store, now: float) -> list[AlertCandidate]:
        spec = self.spec
        data = store.read(Query(spec.series, start=now - spec.window, end=now, target=spec.target,
                                match=spec.match)).series()
        groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        for s in data:
            if spec.by is None:
                key = make_labels({**dict(s.labels), "target": s.target})
            else:
                full = {**dict(s.labels), "target": s.target}
                key = make_labels({n: full.get(n, "") for n in spec.by})
            groups[key].extend(zip(s.ts, s.values, strict=True))
        out = []
        for key, points in sorted(groups.items()):
            value = _aggregate(spec.agg, points)
            if value is None or not self._op(value, spec.threshold):
                continue
            labels = {**dict(key), **spec.labels}
            labels.setdefault("alertname", spec.name)
            annotations = {
                "summary": f"{spec.series} {spec.agg} over {format_duration(spec.window)} is "
                           f"{value:.4g} ({spec.op} {spec.threshold:g})",
                "value": f"{value:.6g}",
                **_render_all(spec.annotations, value=value, threshold=spec.threshold,
                              labels=labels),
            }
            out.append(AlertCandidate(make_labels(labels), make_labels(annotations), value))
        return out


def _aggregate(agg: str, points: list[tuple[float, float]]) -> float | None:
    values = [v for _, v in points if math.isfinite(v)]
    if not values:
        return None
    if agg == "avg":
        return math.fsum(values) / len(values)
    if agg == "min":
        return min(values)
    if agg == "max":
        return max(values)
    if agg == "sum":
        return math.fsum(values)
    return max((p for p in points if math.isfinite(p[1])), key=lambda p: p[0])[1]  # last


# --- loading ---------------------------------------------------------------------------------


def rules_from_file(rules: RulesFile) -> list[Rule]:
    """The SLO, threshold, regression and built-in rules of a validated file."""
    # Imported here: the regression detectors and built-in rules live in their own modules.
    from tritonwatch.alerts.baseline import SharedLoads
    from tritonwatch.alerts.defaults import default_rules
    from tritonwatch.alerts.detect import regression_rules

    loads: SharedLoads = {}  # load histories, shared by every regression rule of the file
    out: list[Rule] = [SloBurnRule.from_spec(s) for s in rules.slos]
    out += [ThresholdRule(a) for a in rules.alerts]
    out += regression_rules(rules.regressions, loads)
    out += default_rules(rules.defaults, loads)
    if rules.defaults.enabled:
        from tritonwatch.alerts.readiness import ModelNotReadyRule

        out.append(ModelNotReadyRule())  # built in beside the defaults (alerts/readiness.py)
    return out


def load_rules(path: str | Path | None) -> list[Rule]:
    """Read and validate a rules file (``None``: built-in defaults only) into rules.

    Raises ``schemas.config.ConfigError`` with every problem and its key path.
    """
    return rules_from_file(load_rules_file(path))
