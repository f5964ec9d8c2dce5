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
were exported.  The answer is streamed (:func:`exposition`): a scrape never holds all of its
series at once (:class:`_Plan`).
"""

from __future__ import annotations

import math
import platform
import re
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as PromSample

from tritonwatch.schemas.latest import EXPORTED_PREFIXES, LatestValues, SampleWindow
from tritonwatch.schemas.samples import Labels, Sample
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


#: Sample lines rendered at a time when /metrics is streamed (:meth:`LiveCollector.chunks`).
CHUNK_LINES = 2_000

#: A reference to a series of the latest values: ``entry << _REF_SHIFT | index``.
_REF_SHIFT = 32


class _Plan:
    """Which series one scrape of /metrics exports, grouped by family, without building them.

    The first pass (the ``add`` methods, in the cap's order: alerts, SLOs, SLIs) keeps for
    each series only a reference, 8 bytes in an ``array``: a latest value by its source and
    index, or the index of an alert's or SLO's labels and value (those are few).  A scrape at
    the default cap used to build 100,000 label dicts, sample tuples and 10 MB of text at once,
    an 80 MiB peak at 1,000 targets; :meth:`samples` builds one family's series when it is
    written.  The cap counts series as they are offered, so a series offered twice (two
    sources, or two stored label sets that export alike) takes two places under it; only the
    first is exported.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.offered = 0
        self.dropped = 0
        self.families: dict[str, tuple[str, array[int]]] = {}
        self._extras: list[tuple[dict[str, str], float]] = []
        self._sources: list[tuple[str, float, Sequence[Sample]]] = []

    def _ref(self, name: str, doc: str, ref: int) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = (doc, array("q"))
        family[1].append(ref)

    def add(self, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        """One series built by the caller (an alert's or an SLO's)."""
        self.offered += 1
        if self.offered > self.cap:
            self.dropped += 1
            return
        self._extras.append((labels, value))
        self._ref(name, doc, -len(self._extras))

    def add_latest(self, latest: LatestValues) -> None:
        """Every exported latest value, by reference, in target order."""
        self._sources = latest.sources()
        # stored name -> (metric name, help), one regex per name, not per series
        exported: dict[str, tuple[str, str]] = {}
        for e, (_, _, samples) in enumerate(self._sources):
            names = samples.names() if isinstance(samples, SampleWindow) else [
                s.name for s in samples]
            for i, stored in enumerate(names):
                if not stored.startswith(EXPORTED_PREFIXES):
                    continue
                self.offered += 1
                if self.offered > self.cap:
                    self.dropped += 1
                    continue
                family = exported.get(stored)
                if family is None:
                    family = exported[stored] = (
                        metric_name(stored), f"Latest value of Tritonwatch's series {stored}")
                self._ref(*family, e << _REF_SHIFT | i)

    def samples(self, name: str) -> Iterator[tuple[dict[str, str], float]]:
        """The family's series in the order offered, each once (the first one counts)."""
        seen: set[tuple[tuple[str, str], ...]] = set()
        mask = (1 << _REF_SHIFT) - 1
        for ref in self.families[name][1]:
            if ref < 0:
                labels, value = self._extras[-ref - 1]
            else:
                target, _, samples = self._sources[ref >> _REF_SHIFT]
                sample = samples[ref & mask]
                labels, value = _labels({"target": target}, sample.labels), sample.value
            key = tuple(sorted(labels.items()))
            if key not in seen:
                seen.add(key)
                yield labels, value


class _One:
    """What ``generate_latest`` renders: the given families (it only calls ``collect``)."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class LiveCollector(Collector):
    """The custom collector of the module docstring.

    It is not registered: /metrics writes it first with :meth:`chunks`, a family at a time
    and at most :data:`CHUNK_LINES` series at once, then the registry (:func:`exposition`).
    :meth:`collect` gives the same families whole, for ``generate_latest(collector)``.
    """

    def __init__(self, live: Live, *, max_series: int, registry: CollectorRegistry) -> None:
        self.live = live
        self.max_series = max_series
        # In the registry, written after this collector's families, so a scrape shows the
        # drops of its own plan.
        self.dropped = Counter(
            "tritonwatch_exported_series_dropped", "Series left out of /metrics because the "
            "scrape reached api.max_exported_series", registry=registry)

    def plan(self) -> _Plan:
        """This scrape's series, by reference; counts its drops."""
        plan = _Plan(self.max_series)
        self._alerts(plan)
        self._slos(plan)
        if self.live.latest is not None:
            plan.add_latest(self.live.latest)
        if plan.dropped:
            self.dropped.inc(plan.dropped)
        return plan

    def collect(self) -> Iterable[Metric]:
        families = [_family(name, doc, batch) for name, doc, batch, _ in self._batches(None)]
        return [*families, _exported(sum(len(f.samples) for f in families))]

    def chunks(self, lines: int = CHUNK_LINES) -> Iterator[bytes]:
        """:meth:`collect`'s text, as ``generate_latest`` writes it, ``lines`` series at a time.

        A family cut into pieces is written by ``generate_latest`` piece by piece; the pieces
        after the first lose their ``# HELP`` and ``# TYPE`` lines (two lines: the help text
        is escaped onto one), so the text is the same byte for byte (``tests/api``'s
        differential test holds it to that)."""
        exported = 0
        for name, doc, batch, first in self._batches(lines):
            text = generate_latest(_One(_family(name, doc, batch)))
            yield text if first else text.split(b"\n", 2)[2]
            exported += len(batch)
        yield generate_latest(_One(_exported(exported)))

    def _batches(self, lines: int | None) -> Iterator[tuple[str, str, list[PromSample], bool]]:
        """This scrape's series as ``(family, help, samples, first of the family)``, at most
        ``lines`` samples each (None: a family whole)."""
        plan = self.plan()
        for name, (doc, _) in plan.families.items():
            first = True
            batch: list[PromSample] = []
            for labels, value in plan.samples(name):
                batch.append(PromSample(name, labels, value, None, None))
                if len(batch) == lines:
                    yield name, doc, batch, first
                    first, batch = False, []
            if batch:
                yield name, doc, batch, first

    def _alerts(self, out: _Plan) -> None:
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

    def _slos(self, out: _Plan) -> None:
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



def _exported(n: int) -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "tritonwatch_exported_series", "Series the live collector exported in this scrape "
        "(SLIs, SLO status, alerts), at most api.max_exported_series", value=n)


def _family(name: str, doc: str, samples: list[PromSample]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[])
    family.samples = samples
    return family


def exposition(registry: CollectorRegistry, live: LiveCollector) -> Iterator[bytes]:
    """The text of /metrics in pieces: the live families (:meth:`LiveCollector.chunks`), then
    the registry (the service's own metrics, process and GC), small enough to write whole."""
    yield from live.chunks()
    yield generate_latest(registry)


def install_exporter(
    registry: CollectorRegistry,
    live: Live,
    *,
    max_series: int = DEFAULT_MAX_EXPORTED_SERIES,
    process: bool = True,
) -> LiveCollector:
    """The live collector (written before ``registry`` by :func:`exposition`), with build
    info and (``process``) the process, platform and GC collectors registered in ``registry``
    (a registry of its own: prometheus_client's global one already holds the last three)."""
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
