"""The Deriver: one target's SLIs, interval by interval, from its two sources.

``derive_columns`` is the engine's entry point (the collector's ``/metrics`` scrape, a payload
as a :class:`~collector.shape.Shape` and a value array); ``derive`` is a thin adapter onto it for
snapshots (the statistics API job, inspect, replay).  Per source, a
:class:`~collector.derive.accumulate.SourceEngine` keeps the counter baselines; this module
decides which source a model's SLIs come from and hands the deltas to the formulas.

* **Sources.**  A payload may come from ``/metrics``, from the statistics API (families named
  ``triton_stats_*``), or hold both.  A payload replaces the state of each source it contains,
  while the other source's state survives for the next alternate payload.  A source absent for
  longer than ``max_gap_s`` is forgotten.  When both sources describe the same model, the
  ``/metrics`` counters win for the request-level SLIs (one value per name, labels and ts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from tritonwatch.collector.derive.accumulate import Acc, Gathered, SourceEngine
from tritonwatch.collector.derive.catalog import (
    CORE_FIELDS,
    DERIVED_FROM,
    METRICS,
    SOURCES,
    STATS,
    ModelKey,
)
from tritonwatch.collector.derive.formulas import (
    KvGauges,
    SeriesOut,
    cache_slis,
    core_slis,
    gpu_slis,
    is_ensemble,
    llm_latency_slis,
    llm_request_slis,
    model_labels,
    ratio,
    stats_slis,
)
from tritonwatch.collector.shape import Shape, Values
from tritonwatch.schemas.samples import MetricFamily, Sample, Snapshot
from tritonwatch.schemas.triton import ModelConfigInfo

# The package's name: the KV warning has always been logged under it.
logger = logging.getLogger(__name__.rpartition(".")[0])


class Deriver:
    """Turns consecutive payloads of one target into ``sli:*`` samples.

    Not thread-safe: feed one target's payloads from one job (or under one lock), in time
    order.  A payload that is not newer than a series' last sample yields nothing for that
    series and keeps its state.
    """

    def __init__(self, target: str, *, max_gap_s: float = 300.0) -> None:
        if not max_gap_s > 0:
            raise ValueError(f"max_gap_s must be > 0, got {max_gap_s!r}")
        self.target = target
        self.max_gap_s = max_gap_s
        self._engines = (SourceEngine(METRICS, max_gap_s), SourceEngine(STATS, max_gap_s))
        self._kv_bad: set[ModelKey] = set()  # models whose KV gauges were inconsistent last time
        # Models whose request counters (and response-cache counters) /metrics has shown: from
        # then on their request-level SLIs come only from /metrics, never from the stats API.
        self._core_from_metrics: set[ModelKey] = set()
        self._cache_from_metrics: set[ModelKey] = set()
        # derive(): the shape of the last snapshot, reused while the structure stays the same.
        self._snap_shape: Shape | None = None

    def tracked_series(self) -> int:
        """How many counter series the state holds (for tests and self-metrics)."""
        return sum(engine.tracked() for engine in self._engines)

    def derive(self, snap: Snapshot, configs: Mapping[str, ModelConfigInfo]) -> list[Sample]:
        """The derived samples for the interval ending at ``snap.ts`` (a snapshot adapter onto
        :meth:`derive_columns`)."""
        # Families the engine does not read keep only their name (a source is present with
        # any family): their samples would be copied into the value array for nothing.
        families = [f if f.name in DERIVED_FROM else f._replace(samples=())
                    for f in snap.families]
        shape = self._shape_of(families)
        values = np.fromiter((s.value for f in families for s in f.samples), np.float64)
        return self.derive_columns(shape, values, snap.ts, configs)

    def _shape_of(self, families: Sequence[MetricFamily]) -> Shape:
        """A shape of ``families``: the last one when the structure is the same, so the engines
        keep their plans (the statistics API lists the same series every time)."""
        shape = Shape(list(families))
        last = self._snap_shape
        if (last is not None and last.names == shape.names and last.labels == shape.labels
                and last.spans == shape.spans):
            return last
        self._snap_shape = shape
        return shape

    def derive_columns(
        self,
        shape: Shape,
        values: Values,
        ts: float,
        configs: Mapping[str, ModelConfigInfo],
    ) -> list[Sample]:
        """The derived samples for the interval ending at ``ts``, from ``values`` read against
        ``shape`` (a payload's structure, worked out once per shape by the engines)."""
        gathered: list[Gathered | None] = [None, None]
        for engine in self._engines:
            plan = engine.plan_for(shape)
            if plan.present:
                gathered[engine.source] = engine.accumulate(plan, values, ts)
        out = self._outputs(gathered[METRICS], gathered[STATS], ts, configs)
        self._end_pass(gathered, ts)
        return out

    def _end_pass(self, gathered: Sequence[Gathered | None], ts: float) -> None:
        """Present sources take ``ts``; absent ones are forgotten once older than max_gap_s."""
        metrics = gathered[METRICS]
        if metrics is not None:
            self._kv_bad.intersection_update(metrics.accs)  # forget models that went away
        for src in SOURCES:
            engine = self._engines[src]
            if gathered[src] is not None:
                engine.last_ts = ts
            elif engine.last_ts is not None and ts - engine.last_ts > self.max_gap_s:
                engine.forget()

    def _outputs(
        self,
        metrics: Gathered | None,
        stats: Gathered | None,
        ts: float,
        configs: Mapping[str, ModelConfigInfo],
    ) -> list[Sample]:
        """The samples of one interval from what the sources gathered."""
        out: list[Sample] = []
        energy_delta: float | None = None
        metrics_accs: dict[ModelKey, Acc] = {}
        if metrics is not None:
            failed_gpus = gpu_slis(metrics.gpus, out)
            energy_delta = self._engines[METRICS].energy_delta(metrics.energy, failed_gpus, ts)
            metrics_accs = metrics.accs
        stats_accs: dict[ModelKey, Acc] = stats.accs if stats is not None else {}

        inference_delta: float | None = None
        # Exposition order, not set order: the same input always gives the same output list.
        model_keys = [*metrics_accs, *(k for k in stats_accs if k not in metrics_accs)]
        for mkey in model_keys:
            m_acc = metrics_accs.get(mkey)
            config = configs.get(mkey[0])
            self._model_slis(mkey, m_acc, stats_accs.get(mkey), config, out)
            if m_acc is not None and "count" in m_acc.d and not is_ensemble(config):
                inference_delta = (inference_delta or 0.0) + m_acc.d["count"]

        energy_per = ratio(energy_delta, inference_delta)
        if energy_per is not None and energy_delta:
            out.append(Sample("sli:energy_per_inference_joules", (), energy_per))
        return out

    def _model_slis(
        self,
        mkey: ModelKey,
        m_acc: Acc | None,
        s_acc: Acc | None,
        config: ModelConfigInfo | None,
        out: list[Sample],
    ) -> None:
        series = SeriesOut(model_labels(mkey), out)
        # Request-level SLIs: /metrics wins when it has the model's counters.  The stats API
        # stands in only for a model /metrics has never shown with them: a target read through
        # both must not interleave two sources (and two intervals) in one series.
        from_metrics = m_acc is not None and not m_acc.seen.isdisjoint(CORE_FIELDS)
        if from_metrics:
            self._core_from_metrics.add(mkey)
        stand_in = s_acc if mkey not in self._core_from_metrics else None
        core = m_acc if from_metrics else stand_in
        if core is not None:
            core_slis(core, config, series)

        if m_acc is not None and "cache_hit" in m_acc.seen:
            self._cache_from_metrics.add(mkey)
        cache = (
            m_acc if mkey in self._cache_from_metrics and m_acc is not None
            else s_acc if mkey not in self._cache_from_metrics else None
        )
        if cache is not None:
            cache_slis(cache, series)

        if m_acc is not None:
            series.emit("sli:pending_requests", m_acc.g.get("pending"))
            llm_latency_slis(m_acc, series)
            if m_acc.g:
                self._kv_slis(mkey, KvGauges(m_acc.g), series)
                llm_request_slis(m_acc.g, series)

        if s_acc is not None:
            stats_slis(s_acc, config, series)

    def _kv_slis(self, mkey: ModelKey, kv: KvGauges, series: SeriesOut) -> None:
        if not kv.present:
            return
        if not kv.consistent():
            # Garbage that looks like a plausible KV percentage is worse than a gap, so nothing
            # KV-related is emitted for this model; the warning once per bad spell.
            if mkey not in self._kv_bad:
                logger.warning(
                    "target %s model %s: inconsistent TRT-LLM KV-cache gauges "
                    "(used=%s free=%s max=%s fraction=%s); KV SLIs skipped",
                    self.target,
                    mkey[0],
                    kv.used,
                    kv.free,
                    kv.max_blocks,
                    kv.fraction,
                )
                self._kv_bad.add(mkey)
            return
        self._kv_bad.discard(mkey)
        kv.emit(series)
