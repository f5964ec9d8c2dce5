"""The latest derived values of every source, kept in memory for /metrics (api/exporter.py).

The collector fills :class:`LatestValues` as it derives; the API's exporter reads it on every
scrape of /metrics without touching the database.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import NamedTuple

from tritonwatch.schemas.samples import Labels, Sample

#: Name prefixes of the series kept in memory for /metrics (:class:`LatestValues`): derived
#: SLIs, probe SLIs and readiness, not the raw series (the user's Prometheus scrapes those from
#: Triton itself).
EXPORTED_PREFIXES = ("sli:", "probe:", "triton_server_", "triton_model_ready")


class LatestValue(NamedTuple):
    """One series' latest value as /metrics exports it."""

    target: str
    name: str
    labels: Labels
    value: float
    ts: float


class LatestValues:
    """The latest derived values of every source, kept in memory for /metrics.

    One entry per (target, source): a scrape, an API reading, the NVML join or a probe run
    replaces its own entry whole, and a failed scrape or reading removes it, so /metrics never
    shows a dead target's frozen values as current.  Thread-safe (scrapes derive in worker
    threads); no database read, whatever the scrape rate of /metrics.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_source: dict[tuple[str, str], tuple[float, list[Sample]]] = {}

    def put(self, target: str, source: str, ts: float, samples: Iterable[Sample]) -> None:
        kept = [s for s in samples if s.name.startswith(EXPORTED_PREFIXES)]
        with self._lock:
            self._by_source[(target, source)] = (ts, kept)

    def drop(self, target: str, source: str) -> None:
        with self._lock:
            self._by_source.pop((target, source), None)

    def values(self) -> list[LatestValue]:
        with self._lock:
            entries = sorted(self._by_source.items())
        return [LatestValue(target, s.name, s.labels, s.value, ts)
                for (target, _), (ts, samples) in entries for s in samples]
