"""Tritonwatch's own health on its /metrics (prometheus_client): targets, jobs, the store."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from tritonwatch.collector.probes.sink import ProbeMetrics
from tritonwatch.schemas.samples import TargetHealth


class SelfMetrics:
    """Tritonwatch's own health on its /metrics: per target up/duration/samples, job failures."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.up = Gauge(
            "tritonwatch_target_up", "1 if the last read of the source succeeded",
            ["target", "source"], registry=self.registry,
        )
        self.duration = Gauge(
            "tritonwatch_scrape_duration_seconds", "Duration of the last read",
            ["target", "source"], registry=self.registry,
        )
        self.samples = Gauge(
            "tritonwatch_scrape_samples", "Samples from the last read",
            ["target", "source"], registry=self.registry,
        )
        self.job_failures = Counter(
            "tritonwatch_job_failures", "Scheduled jobs that raised", ["job"],
            registry=self.registry,
        )
        self.job_missed = Counter(
            "tritonwatch_job_missed", "Scheduled runs skipped because the previous one was late",
            ["job"], registry=self.registry,
        )
        self.store_errors = Counter(
            "tritonwatch_store_flush_errors", "Failed store flushes (data kept for retry)",
            registry=self.registry,
        )
        self.series_refused = Counter(
            "tritonwatch_series_limit_refused_samples",
            "Samples dropped because their new series would take the target past series_limit",
            ["target"], registry=self.registry,
        )
        #: Synthetic probe latency histograms (``tritonwatch_probe_*``), same registry.
        self.probes = ProbeMetrics(self.registry)

    def record(self, health: TargetHealth) -> None:
        self.up.labels(health.target, health.source).set(1.0 if health.up else 0.0)
        self.duration.labels(health.target, health.source).set(health.duration_s)
        self.samples.labels(health.target, health.source).set(health.samples)
