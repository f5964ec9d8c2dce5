"""/metrics for the user's own Prometheus: derived SLIs, SLO status, alert states, build info.

One prometheus_client registry holds everything /metrics answers: the service's own counters
(scrapes, flushes, evaluations, notifications, API), the probe histograms, ``process_*`` and
``python_*``, and :class:`LiveCollector`, a custom collector that on each scrape reads only
what is already in memory:

==========================================  ====================================================
family                                      from
==========================================  ====================================================
``tritonwatch_sli_<name>``                  every derived SLI ``sli:<name>`` of the latest
                                            scrape, API reading and NVML join (labels
                                            ``target``, ``model``, ``version``... as stored)
``tritonwatch_sli_probe_<name>``            the probe series ``probe:<name>`` of the last run
``tritonwatch_triton_server_ready`` ...     readiness read through Triton's health APIs
``tritonwatch_slo_*{slo, <by labels>}``     :class:`alerts.status.SloBoard` (refreshed after an
                                            evaluation at most every minute)
``ALERTS{alertname, alertstate, ...}``      the alert engine's pending and firing instances,
``ALERTS_FOR_STATE``                        as Prometheus writes them
``tritonwatch_build_info{version, ...}``    the installed distribution
==========================================  ====================================================

No scrape of /metrics reads the database.  A stored label named like one the exporter sets
(``target``, ``slo``, ``window``...) is exported as ``exported_<name>``, as Prometheus does with
``honor_labels: false``; names that are not legal Prometheus names have their other characters
replaced by ``_``.

Cardinality is bounded: at most ``api.max_exported_series`` series leave the live collector per
scrape (alerts first, then SLOs, then SLIs in target order); the rest are counted in
``tritonwatch_exported_series_dropped_total`` and ``tritonwatch_exported_series`` says how many
were exported.
"""

from __future__ import annotations

import math
import platform
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as PromSample

from tritonwatch.schemas.latest import LatestValue, LatestValues
from tritonwatch.schemas.samples import Labels
from tritonwatch.schemas.values import format_duration

if TYPE_CHECKING:
    from tritonwatch.alerts.engine import Engine
    from tritonwatch.alerts.status import SloBoard

#: Series the live collector exports per scrape unless ``api.max_exported_series`` says
#: otherwise.
DEFAULT_MAX_EXPORTED_SERIES = 100_000

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")


def build_version() -> str:
    """The installed distribution's version ("unknown" in a source tree never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonwatch")
    except PackageNotFoundError:
        return "unknown"


def metric_name(stored: str) -> str:
    """The exported name of a stored series: ``sli:batch_fill_rate`` ->
    ``tritonwatch_sli_batch_fill_rate``, ``probe:ttft_seconds`` ->
    ``tritonwatch_sli_probe_ttft_seconds``, ``triton_model_ready`` ->
    ``tritonwatch_triton_model_ready``."""
    if stored.startswith("probe:"):
        stored = "sli:probe_" + stored.removeprefix("probe:")
    return "tritonwatch_" + _NAME_BAD.sub("_", stored.replace(":", "_"))


def label_name(name: str) -> str:
    """A legal, non-reserved Prometheus label name for a stored label name."""
    clean = _LABEL_BAD.sub("_", name) or "_"
    if clean[0].isdigit():
        clean = "_" + clean
    if clean.startswith("__"):
        clean = "exported" + clean
    return clean


def _labels(own: Mapping[str, str], stored: Labels) -> dict[str, str]:
    """``own`` plus the stored labels, which give way as ``exported_<name>`` on a clash."""
    out = dict(own)
    for name, value in stored:
        key = label_name(name)
        while key in out:
            key = "exported_" + key
        out[key] = value
    return out


@dataclass
class Live:
    """What the API reads from memory: the collector's latest values, the alert engine and the
    SLO board.  Any may be None (a process that does not run it)."""

    latest: LatestValues | None = None
    engine: Engine | None = None
    slos: SloBoard | None = None


class _Budget:
    """Counts the series of one scrape against the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.exported = 0
        self.dropped = 0

    def take(self) -> bool:
        if self.exported >= self.cap:
            self.dropped += 1
            return False
        self.exported += 1
        return True


class _Families:
    """Gauge families of one scrape, by name, with their label names fixed by first use."""

    def __init__(self, budget: _Budget) -> None:
        self.budget = budget
        self._families: dict[str, GaugeMetricFamily] = {}
        self._seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def add(self, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        if key in self._seen:
            return  # the same series from two sources: the first one counts
        if not self.budget.take():
            return
        self._seen.add(key)
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = GaugeMetricFamily(name, doc, labels=[])
        # Samples are appended one by one: label names may differ between the series of one
        # family (a model's own labels), which the exposition format allows.
        family.samples.append(PromSample(name, dict(labels), value, None, None))

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


class LiveCollector(Collector):
    """The custom collector of the module docstring."""

    def __init__(self, live: Live, *, max_series: int, registry: CollectorRegistry) -> None:
        self.live = live
        self.max_series = max_series
        registry.register(self)
        # Registered after the collector, so a scrape shows the drops of its own collect.
        self.dropped = Counter(
            "tritonwatch_exported_series_dropped", "Series left out of /metrics because the "
            "scrape reached api.max_exported_series", registry=registry)

    def collect(self) -> Iterable[Metric]:
        budget = _Budget(self.max_series)
        families = _Families(budget)
        self._alerts(families)
        self._slos(families)
        self._latest(families)
        if budget.dropped:
            self.dropped.inc(budget.dropped)
        exported = GaugeMetricFamily(
            "tritonwatch_exported_series", "Series the live collector exported in this scrape "
            "(SLIs, SLO status, alerts), at most api.max_exported_series",
            value=budget.exported)
        return [*families, exported]

    def _alerts(self, out: _Families) -> None:
        engine = self.live.engine
        if engine is None:
            return
        for state in engine.states():
            if state.status not in ("pending", "firing"):
                continue
            labels = _labels({}, state.labels)
            labels["alertstate"] = state.status
            out.add("ALERTS", "Alert instances of Tritonwatch's rules, pending or firing, "
                    "as Prometheus exports its own", labels, 1.0)
            for_state = {k: v for k, v in labels.items() if k != "alertstate"}
            out.add("ALERTS_FOR_STATE", "When each active alert's condition first held "
                    "(unix seconds)", for_state, state.active_since)

    def _slos(self, out: _Families) -> None:
        board = self.live.slos
        if board is None:
            return
        for entry in board.entries():
            slo = entry.slo
            for status in entry.statuses:
                base = _labels({"slo": slo.name}, status.group)

                def put(name: str, doc: str, value: float | None,
                        extra: Mapping[str, str] | None = None, base: dict[str, str] = base,
                        ) -> None:
                    if value is not None:
                        out.add(f"tritonwatch_slo_{name}", doc, {**base, **(extra or {})}, value)

                put("objective_ratio", "The SLO's objective (0.999 = 99.9 %)", status.objective)
                put("period_seconds", "The SLO's rolling period", status.period_s)
                # Never absent, so a dashboard panel always has a series: NaN is 0/0 (no
                # events yet), +Inf a budget that is not being spent.
                put("sli_ratio", "Good events / all events over the period (NaN without "
                    "events)", math.nan if status.compliance is None else status.compliance)
                put("error_budget_remaining_ratio", "Share of the period's error budget left "
                    "(negative once overspent)", status.remaining)
                put("error_budget_consumed_ratio", "Share of the period's error budget spent",
                    status.consumed)
                put("error_budget_exhaustion_seconds", "When the budget runs out at the "
                    "current burn rate (+Inf while not burning)",
                    math.inf if status.exhaustion_in_s is None else status.exhaustion_in_s)
                put("events", "Events over the period", status.good, {"kind": "good"})
                put("events", "Events over the period", status.total, {"kind": "total"})
                put("status_timestamp_seconds", "When this status was computed",
                    entry.refreshed_at)
                burns: dict[float, float | None] = {status.burn_window_s: status.current_burn}
                for tier in status.tiers:
                    burns.setdefault(tier.long_s, tier.long_burn)
                    burns.setdefault(tier.short_s, tier.short_burn)
                    put("tier_firing", "1 while this burn-rate tier's long and short windows "
                        "both burn faster than its threshold", 1.0 if tier.firing else 0.0,
                        {"tier": tier.name, "severity": tier.severity})
                    put("tier_burn_rate_threshold", "The burn rate a tier fires above",
                        tier.factor, {"tier": tier.name, "severity": tier.severity})
                for window, burn in sorted(burns.items()):
                    put("burn_rate", "Error ratio over the window / error budget (1 spends "
                        "exactly the budget over the period; NaN without events)",
                        math.nan if burn is None else burn,
                        {"window": format_duration(window)})

    def _latest(self, out: _Families) -> None:
        latest = self.live.latest
        if latest is None:
            return
        for v in latest.values():
            out.add(metric_name(v.name), _doc(v), _labels({"target": v.target}, v.labels),
                    v.value)


def _doc(v: LatestValue) -> str:
    return f"Latest value of Tritonwatch's series {v.name}"


def install_exporter(
    registry: CollectorRegistry,
    live: Live,
    *,
    max_series: int = DEFAULT_MAX_EXPORTED_SERIES,
    process: bool = True,
) -> LiveCollector:
    """Register the live collector, build info and (``process``) the process, platform and
    GC collectors in ``registry`` (a registry of its own: prometheus_client's global one
    already holds the last three)."""
    collector = LiveCollector(live, max_series=max_series, registry=registry)
    info = Gauge("tritonwatch_build_info", "Tritonwatch's version (value 1)",
                 ["version", "python_version", "implementation"], registry=registry)
    info.labels(build_version(), platform.python_version(),
                sys.implementation.name).set(1.0)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return collector
