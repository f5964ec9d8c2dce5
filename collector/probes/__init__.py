"""Synthetic LLM probes: TTFT, ITL, TPOT and e2e measured from outside, like a user.

- :mod:`collector.probes.base`: the per-request recorder and the result it turns into.
- :mod:`collector.probes.grpc_stream`, :mod:`collector.probes.http_sse`,
  :mod:`collector.probes.openai`: one client session per connection and protocol.
- :mod:`collector.probes.runner`: warm-up, concurrency, repeated runs with kept-alive sessions.
- :mod:`collector.probes.stats`: GenAI-Perf-style summaries.
- :mod:`collector.probes.sink`: results to the store, SLI series, SLO events, histograms.
"""

from tritonwatch.collector.probes.base import ProbeFailure, Recorder
from tritonwatch.collector.probes.runner import ProbeRunner, make_session, resolve_url
from tritonwatch.collector.probes.stats import summarize

__all__ = ["ProbeFailure", "ProbeRunner", "Recorder", "make_session", "resolve_url", "summarize"]
