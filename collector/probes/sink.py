"""Where probe results go: Prometheus histograms, SLI series and SLO events for the store.

Per run, the store gets one sample per series (its time is the run's start):

- ``probe:ttft_seconds``, ``probe:itl_seconds``, ``probe:tpot_seconds``, ``probe:e2e_seconds``,
  ``probe:tokens_per_second``: the mean over the run's successful requests;
- ``probe:requests`` and ``probe:errors`` (label ``kind``) counted in the run;
- ``probe:slo_total`` and ``probe:slo_good`` (label ``sli``: ttft, itl, success) — good/total
  events against ``ttft_slo``/``itl_slo``; a failed request is a bad event for every SLI.

Every series carries ``probe``, ``model`` and ``protocol`` plus the probe's ``labels``.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from tritonwatch.schemas.probes import ProbeConfig, ProbeResult
from tritonwatch.schemas.samples import Sample, make_labels

#: Bucket bounds (s) fit for TTFT/e2e (ms to minutes) and ITL (sub-ms to seconds).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)


class ProbeMetrics:
    """Probe latencies as prometheus_client histograms (exposed on Tritonwatch's /metrics)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ["probe", "model"]

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry)

        self.ttft = hist("tritonwatch_probe_ttft_seconds", "Probe time to first token")
        self.itl = hist("tritonwatch_probe_itl_seconds",
                        "Probe inter-token latency (per-request mean gap)")
        self.tpot = hist("tritonwatch_probe_tpot_seconds", "Probe time per output token")
        self.e2e = hist("tritonwatch_probe_e2e_seconds", "Probe end-to-end request latency")
        self.requests = Counter("tritonwatch_probe_requests", "Probe requests sent",
                                labels, registry=self.registry)
        self.errors = Counter("tritonwatch_probe_errors", "Failed probe requests by class",
                              [*labels, "kind"], registry=self.registry)
        self.tokens = Counter("tritonwatch_probe_output_tokens", "Tokens received by probes",
                              labels, registry=self.registry)

    def observe(self, result: ProbeResult) -> None:
        key = (result.probe, result.model)
        self.requests.labels(*key).inc()
        if not result.ok:
            self.errors.labels(*key, result.error_kind or "unknown").inc()
            return
        self.tokens.labels(*key).inc(result.tokens)
        for hist, value in ((self.ttft, result.ttft_s), (self.itl, result.itl_s),
                            (self.tpot, result.tpot_s), (self.e2e, result.e2e_s)):
            if value is not None:
                hist.labels(*key).observe(value)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def run_samples(config: ProbeConfig, results: Sequence[ProbeResult]) -> list[Sample]:
    """The SLI series and SLO events of one run (see the module docstring)."""
    if not results:
        return []
    base = {"probe": config.name, "model": config.model, "protocol": config.protocol}
    base = {**config.labels, **base}
    labels = make_labels(base)
    ok = [r for r in results if r.ok]
    out: list[Sample] = []
    for name, values in (
        ("probe:ttft_seconds", [r.ttft_s for r in ok if r.ttft_s is not None]),
        ("probe:itl_seconds", [r.itl_s for r in ok if r.itl_s is not None]),
        ("probe:tpot_seconds", [r.tpot_s for r in ok if r.tpot_s is not None]),
        ("probe:e2e_seconds", [r.e2e_s for r in ok if r.e2e_s is not None]),
        ("probe:tokens_per_second", [r.tokens_per_s for r in ok if r.tokens_per_s is not None]),
    ):
        mean = _mean(values)
        if mean is not None:
            out.append(Sample(name, labels, mean))
    out.append(Sample("probe:requests", labels, float(len(results))))
    kinds = Tally(r.error_kind or "unknown" for r in results if not r.ok)
    out.append(Sample("probe:errors", make_labels({**base, "kind": "ALL"}),
                      float(len(results) - len(ok))))
    for kind, count in sorted(kinds.items()):
        out.append(Sample("probe:errors", make_labels({**base, "kind": kind}), float(count)))
    slos: list[tuple[str, float | None, str]] = [("success", None, "")]
    if config.ttft_slo is not None:
        slos.append(("ttft", config.ttft_slo, "ttft_s"))
    if config.itl_slo is not None:
        slos.append(("itl", config.itl_slo, "itl_s"))
    for sli, threshold, attr in slos:
        good = 0
        for r in results:
            if not r.ok:
                continue
            value = getattr(r, attr) if attr else None
            if threshold is None or value is None or value <= threshold:
                good += 1
        sli_labels = make_labels({**base, "sli": sli})
        out.append(Sample("probe:slo_total", sli_labels, float(len(results))))
        out.append(Sample("probe:slo_good", sli_labels, float(good)))
    return out
