"""Immutable values passed between the collector's stages and into the store.

No I/O here.  Everything is a NamedTuple so that values are cheap to build on the hot path,
hashable, and cannot be mutated by a later stage.

Labels are carried as a tuple of ``(name, value)`` pairs sorted by name: that makes them
hashable (the store's series cache is keyed on them) and gives one canonical form, so the
same series always maps to the same row whatever order the exposition listed its labels in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]

#: Metric types as the Prometheus text format names them.  ``unknown`` (OpenMetrics) and any
#: family without a ``# TYPE`` line are reported as ``untyped``.
METRIC_TYPES = frozenset({"counter", "gauge", "summary", "histogram", "untyped"})


def make_labels(labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """Canonical label tuple: pairs sorted by label name; equal ones are one shared tuple
    (up to :data:`SHARED_LABELS_MAX` distinct ones)."""
    items = labels.items() if isinstance(labels, Mapping) else labels
    made = tuple(sorted(items))
    if len(_SHARED_LABELS) < SHARED_LABELS_MAX:
        # The derived series and the alert rules make the same label sets scrape after scrape
        # and target after target (a model and a failure reason): measured at 1,000 targets,
        # 248,000 live copies (14 MiB) where a few thousand distinct ones exist.
        return _SHARED_LABELS.setdefault(made, made)
    return made


#: Most distinct label sets :func:`make_labels` shares (a bound on its table, about 10 MB).
SHARED_LABELS_MAX = 50_000
_SHARED_LABELS: dict[Labels, Labels] = {}


def labels_json(labels: Labels) -> str:
    """The canonical text form stored in ``series.labels`` (sorted, compact JSON)."""
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def label_value(labels: Labels, name: str, default: str = "") -> str:
    for key, value in labels:
        if key == name:
            return value
    return default


class Sample(NamedTuple):
    """One sample of one series.  ``name`` is the full sample name (``x_bucket``, ``x_sum``...)."""

    name: str
    labels: Labels
    value: float


class MetricFamily(NamedTuple):
    """A parsed family: its name (without ``_total``/``_bucket`` suffixes), type, help text."""

    name: str
    type: str
    help: str
    samples: tuple[Sample, ...]


class Snapshot(NamedTuple):
    """Everything one scrape of one target produced, stamped with the scrape time (unix s)."""

    target: str
    ts: float
    families: tuple[MetricFamily, ...]

    def samples(self) -> Iterable[Sample]:
        for family in self.families:
            yield from family.samples


class TargetHealth(NamedTuple):
    """Like Prometheus ``up``: the outcome of the latest scrape of one target (or source)."""

    target: str
    source: str  # "metrics", "stats", "config", "nvml", "probe:<name>"
    ts: float
    up: bool
    duration_s: float
    samples: int
    error: str | None = None
