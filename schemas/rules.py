"""The rules file (``rules.yaml``, ``version: 1``): SLOs, threshold alerts, regressions.  No I/O
beyond reading the file.

This is the *user-facing* spec, documented field by field (the docstrings become the JSON
Schema's descriptions, see ``rules_json_schema``).  The evaluator does not read it directly:
``alerts.slo.Slo.from_spec`` normalises an :class:`SloSpec` into the internal model (objective as
a ratio, period in seconds, burn-rate tiers with their factors), as sloth keeps its
``prometheus/v1`` spec apart from its internal SLO model.  The field reference is docs/rules.md.

Errors are :class:`schemas.config.ConfigError` with one ``key.path: message`` line each
(``slos[1].sli.queue_time.threshold: ...``), like the config file's.

Example (the test suite validates this very text)::

    version: 1
    slos:
      - name: llm-ttft
        description: First token within 800 ms for 99.5 % of probe requests
        objective: 99.5
        window: 28d
        labels: {team: ml}
        sli: {kind: ttft, probe: llm-probe, threshold: 800ms, by: [model]}
        min_traffic: 50
        alerting:
          ticket: {enabled: false}
          annotations: {runbook_url: "https://runbooks/ttft?model={labels[model]}"}
      - name: triton-availability
        objective: 99.9
        sli: {kind: availability, model: resnet, match: {region: eu}}
      - name: queue
        objective: 99
        sli: {kind: queue_time, threshold: 50ms}
    alerts:
      - name: KVCacheNearlyFull
        series: sli:kv_cache_utilization
        agg: avg
        window: 10m
        op: ">"
        threshold: 0.95
        for: 5m
        keep_firing_for: 2m
        labels: {severity: warning}
        annotations: {summary: "KV cache {value:.0%} full on {labels[model]}"}
    regressions:           # schemas/regressions.py
      - name: fill_rate_drop
        series: sli:batch_fill_rate
        direction: down
    defaults:
      disable: [target_down]
"""

from __future__ import annotations

import math
import re
import string
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tritonwatch.schemas.config import ConfigError, error_lines, read_yaml
from tritonwatch.schemas.regressions import DEFAULT_RULE_NAMES, DefaultsSpec, RegressionSpec
from tritonwatch.schemas.values import (
    Duration,
    FrozenAliased,
    PositiveDuration,
    supported_version,
)

_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:\-]*$"
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What an annotation template may refer to: str.format fields, but no attribute access or
# arbitrary names, so a rules file cannot reach into Python objects.
_TEMPLATE_FIELD = re.compile(r"^(value|threshold|labels\[[A-Za-z_][A-Za-z0-9_]*\])$")


def _label_names(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not _LABEL_NAME.match(name):
            raise ValueError(f"label name {name!r} must match [A-Za-z_][A-Za-z0-9_]*")
    return value


def check_template(text: str) -> str:
    """Validate an annotation template: ``{value}``, ``{threshold}``, ``{labels[x]}`` only."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"template {text!r}: {exc}") from None
    for _, field, spec, _ in parts:
        if field is None:
            continue
        if not _TEMPLATE_FIELD.match(field):
            raise ValueError(
                f"template {text!r}: unknown field {{{field}}}; use {{value}}, {{threshold}} or "
                "{labels[name]}"
            )
        if spec and "{" in spec:
            raise ValueError(f"template {text!r}: nested fields are not allowed")
        if spec and field != "value" and field != "threshold":
            continue
        if spec:
            try:
                format(1.0, spec)
            except ValueError as exc:
                raise ValueError(f"template {text!r}: bad format {spec!r} ({exc})") from None
    return text


def _templates(value: dict[str, str]) -> dict[str, str]:
    for text in value.values():
        check_template(text)
    return value


LabelMap = Annotated[dict[str, str], AfterValidator(_label_names)]
TemplateMap = Annotated[dict[str, str], AfterValidator(_templates)]


# --- SLIs ------------------------------------------------------------------------------------


class _ProbeFilter(FrozenAliased):
    probe: str | None = None
    """Only events of this probe (the ``probe`` label, ``probes[].name``); all probes if unset."""
    model: str | None = None
    """Only events of probes of this model."""
    target: str | None = None
    """Only events stored under this target."""
    by: tuple[str, ...] = ()
    """Labels splitting the SLO into one budget and one alert per value combination (e.g.
    ``[model]``); empty: one SLO over every matching event.  ``target`` names the target."""


class ProbeLatencySli(_ProbeFilter):
    """Probe requests answered within a latency threshold: TTFT ≤ T or ITL ≤ T.

    Without ``threshold`` the good/total events the probe itself recorded are counted
    (``probe:slo_good``/``probe:slo_total``, judged against the probe's ``ttft_slo``/``itl_slo``,
    which must then be set).  With ``threshold`` each request's row in ``probe_results`` is
    judged against it instead, so the SLO may differ from the probe's own threshold; ``by``
    may then name only ``probe``, ``model``, ``protocol`` and ``target``.
    A failed request is a bad event; a successful one without a value (one token: no ITL) is
    a good one, as in the probe sink.
    """

    kind: Literal["ttft", "itl"]
    """``ttft``: time to first token; ``itl``: inter-token latency (per-request mean gap)."""
    threshold: PositiveDuration | None = None
    """T: a request is good when its TTFT/ITL is at most this (``500ms``, ``0.05``)."""


class ProbeSuccessSli(_ProbeFilter):
    """Probe requests that succeeded (``probe:slo_good{sli="success"}`` / ``probe:slo_total``)."""

    kind: Literal["success"]
    """Successful probe requests over all probe requests."""


class _ServerFilter(FrozenAliased):
    model: str | None = None
    """Only this model (the ``model`` label); every model if unset."""
    version: str | None = None
    """Only this model version."""
    target: str | None = None
    """Only this target (``targets[].name``)."""
    match: LabelMap = Field(default_factory=dict)
    """Further label equality filters (``""`` matches an absent label)."""
    by: tuple[str, ...] = ()
    """Labels splitting the SLO into one budget and one alert per value combination (e.g.
    ``[model]``); empty: one SLO over every matching series.  ``target`` names the target."""


class AvailabilitySli(_ServerFilter):
    """Server availability from Triton's counters: Δsuccess / (Δsuccess + ΣΔfailure).

    Good events are increases of ``nv_inference_request_success``, bad ones the increases of
    ``nv_inference_request_failure`` summed over ``reason``; counter resets are handled.
    """

    kind: Literal["availability"]
    """Successful requests over all requests, as Triton counts them."""


class QueueTimeSli(_ServerFilter):
    """Time-slice SLI: a scrape interval is good when ``sli:queue_time_seconds`` ≤ T there.

    Each interval weighs as many events as it served requests (``sli:request_rate`` * the
    interval), so a quiet minute with a long queue costs little and a busy one much.
    """

    kind: Literal["queue_time"]
    """Average queue time per request at most ``threshold``."""
    threshold: PositiveDuration
    """T: the average queue time per request of a good interval (``50ms``)."""


class ReadinessSli(_ServerFilter):
    """Readiness from Triton's health APIs: each reading of ``triton_model_ready`` (or, with
    ``server: true``, ``triton_server_ready``) is one event, good when it read 1."""

    kind: Literal["readiness"]
    """Readings in which the model (or server) was ready, over all readings."""
    server: bool = False
    """Count the server's readiness (``triton_server_ready``) instead of the models'."""


Sli = Annotated[
    ProbeLatencySli | ProbeSuccessSli | AvailabilitySli | QueueTimeSli | ReadinessSli,
    Field(discriminator="kind"),
]


# --- SLOs ------------------------------------------------------------------------------------


class SeverityAlerting(FrozenAliased):
    """One severity of an SLO's burn-rate alert."""

    enabled: bool = True
    """``false``: this severity never fires (its tiers are still computed for the status)."""
    labels: LabelMap = Field(default_factory=dict)
    """Extra labels of this severity's alert (they win over the SLO's)."""
    annotations: TemplateMap = Field(default_factory=dict)
    """Extra annotations of this severity's alert (templates, see ``alerts[].annotations``)."""


class SloAlerting(FrozenAliased):
    """The multiwindow, multi-burn-rate alerts of an SLO (tiers in alerts/windows.yaml)."""

    name: str = Field(default="SLOBurnRate", pattern=_NAME_PATTERN)
    """The ``alertname``; the ``slo`` and ``severity`` labels tell the SLOs apart."""
    labels: LabelMap = Field(default_factory=dict)
    """Extra labels on both severities."""
    annotations: TemplateMap = Field(default_factory=dict)
    """Extra annotations on both severities; ``{value}`` is the burn rate that fired."""
    page: SeverityAlerting = SeverityAlerting()
    """Fast burn: 14.4x over 1 h and 5 m, or 6x over 6 h and 30 m (at 30 days)."""
    ticket: SeverityAlerting = SeverityAlerting()
    """Slow burn: 3x over 1 d and 2 h, or 1x over 3 d and 6 h (at 30 days)."""
    for_s: Duration = Field(default=0.0, alias="for")
    """Pending time before firing; the short windows already debounce, so 0 by default."""
    keep_firing_for_s: Duration = Field(default=0.0, alias="keep_firing_for")
    """Firing time after the condition was last true."""


class SloSpec(FrozenAliased):
    """A service level objective with its error budget and burn-rate alerts."""

    name: str = Field(min_length=1, max_length=200, pattern=_NAME_PATTERN)
    """Unique name; the ``slo`` label of its alerts and the rule name."""
    description: str = ""
    """What the SLO promises, in words (shown in alerts, dashboard and reports)."""
    objective: float = Field(gt=0, lt=100)
    """Target percentage of good events, e.g. ``99.9`` (below 100: a 100 % SLO has no budget)."""
    window: Literal["28d", "30d"] = "30d"
    """The rolling SLO period the error budget is counted over."""
    labels: LabelMap = Field(default_factory=dict)
    """Labels added to the SLO's alerts (team, tier, ...)."""
    sli: Sli
    """How good and total events are counted; ``kind`` picks one of ``ttft``, ``itl``,
    ``success`` (probes), ``availability``, ``queue_time`` (server counters)."""
    min_traffic: float = Field(default=0.0, ge=0)
    """Minimum-traffic guard: a burn-rate tier stays silent while its long window holds fewer
    events than this (one failure among three requests is not a 14x burn worth a page)."""
    alerting: SloAlerting = SloAlerting()
    """Burn-rate alerts: name, labels, annotations, page/ticket switches."""

    @model_validator(mode="after")
    def _check(self) -> SloSpec:
        if isinstance(self.sli, ProbeLatencySli) and self.sli.threshold is not None:
            bad = set(self.sli.by) - {"probe", "model", "protocol", "target"}
            if bad:
                raise ValueError(
                    f"sli.by {sorted(bad)}: with a threshold, events come from probe_results "
                    "rows, which know only probe, model, protocol and target"
                )
        if "slo" in self.labels or "severity" in self.labels:
            raise ValueError("labels: `slo` and `severity` are set by the SLO alert itself")
        return self


# --- threshold alerts ------------------------------------------------------------------------

Op = Literal[">", ">=", "<", "<=", "==", "!="]
ThresholdAgg = Literal["avg", "min", "max", "last", "sum"]


class ThresholdRuleSpec(FrozenAliased):
    """A series aggregated over a window and compared with a threshold (like a PromQL rule
    ``avg_over_time(series[window]) > threshold``), one alert per series (or ``by`` group)."""

    name: str = Field(min_length=1, max_length=200, pattern=_NAME_PATTERN)
    """Unique rule name; the ``alertname`` unless ``labels`` sets one."""
    series: str = Field(min_length=1)
    """Stored series name, e.g. ``sli:kv_cache_utilization`` or ``nv_gpu_utilization``."""
    match: LabelMap = Field(default_factory=dict)
    """Label equality filters (``""`` matches an absent label)."""
    target: str | None = None
    """Only series of this target."""
    by: tuple[str, ...] | None = None
    """Group series by these labels (``target`` names the target) and aggregate every point of
    the group together; unset: one alert per series, labelled with all its labels."""
    agg: ThresholdAgg = "avg"
    """How the points in ``window`` become one value: avg, min, max, last or sum."""
    window: PositiveDuration = 300.0
    """How far back from the evaluation time points are aggregated (default 5 m)."""
    op: Op
    """Comparison of the aggregated value with ``threshold``: the alert holds when true."""
    threshold: float
    """The number compared with."""
    for_s: Duration = Field(default=0.0, alias="for")
    """The condition must hold this long before the alert fires (pending until then)."""
    keep_firing_for_s: Duration = Field(default=0.0, alias="keep_firing_for")
    """The alert keeps firing this long after the condition was last true."""
    labels: LabelMap = Field(default_factory=dict)
    """Extra labels (e.g. ``severity``); they win over series labels.  Keep them constant:
    values belong in annotations."""
    annotations: TemplateMap = Field(default_factory=dict)
    """Templates: ``{value}`` (the aggregated value; format specs allowed, ``{value:.1%}``),
    ``{threshold}`` and ``{labels[model]}`` (an absent label renders empty)."""

    @field_validator("threshold")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


# --- the file --------------------------------------------------------------------------------


class RulesFile(FrozenAliased):
    """The rules file: every alert Tritonwatch evaluates besides the built-in defaults."""

    version: int = 1
    """Version of this file's format."""
    slos: tuple[SloSpec, ...] = ()
    """Service level objectives with error budgets and burn-rate alerts."""
    alerts: tuple[ThresholdRuleSpec, ...] = ()
    """Threshold rules on any stored series."""
    regressions: tuple[RegressionSpec, ...] = ()
    """Regression rules: a series against its baseline at comparable load."""
    defaults: DefaultsSpec = DefaultsSpec()
    """The built-in rules: on by default, each can be disabled or tuned."""

    @field_validator("version")
    @classmethod
    def _supported_version(cls, value: int) -> int:
        return supported_version(value, "rules")

    @model_validator(mode="after")
    def _unique_names(self) -> RulesFile:
        seen: dict[str, str] = dict.fromkeys(DEFAULT_RULE_NAMES, "a built-in rule")
        named: list[tuple[str, str]] = [
            *((f"slos[{i}]", s.name) for i, s in enumerate(self.slos)),
            *((f"alerts[{i}]", a.name) for i, a in enumerate(self.alerts)),
            *((f"regressions[{i}]", r.name) for i, r in enumerate(self.regressions)),
        ]
        for where, name in named:
            if name in seen:
                raise ValueError(f"{where}: name {name!r} is already used by {seen[name]}")
            seen[name] = where
        return self


def validate_rules(data: Any, source: str = "<rules>") -> RulesFile:
    """Validate parsed YAML; raises ``ConfigError`` with one ``key.path: message`` per error."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(data).__name__}"])
    try:
        return RulesFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, error_lines(exc)) from None


def load_rules_file(path: str | Path | None) -> RulesFile:
    """Read and validate a rules file; ``None`` gives an empty one (built-in defaults only)."""
    if path is None:
        return RulesFile()
    return validate_rules(read_yaml(path), str(path))


def rules_json_schema() -> dict[str, Any]:
    """The JSON Schema of the rules file (field docstrings as descriptions, aliases as keys)."""
    schema = RulesFile.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Tritonwatch rules file"
    return schema
