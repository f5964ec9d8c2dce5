"""Values returned by the store's query layer: frozen, hashable, cheap to build."""

from __future__ import annotations

from typing import NamedTuple

from schemas.samples import Labels


class SeriesKey(NamedTuple):
    """One series: the target it was scraped from, its sample name and canonical labels."""

    target: str
    name: str
    labels: Labels


class SeriesData(NamedTuple):
    """Points of one series, oldest first.  Timestamps are unix seconds."""

    target: str
    name: str
    labels: Labels
    ts: tuple[float, ...]
    values: tuple[float, ...]

    @property
    def key(self) -> SeriesKey:
        return SeriesKey(self.target, self.name, self.labels)
