"""Values returned by the store's query layer: frozen, hashable, cheap to build."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.schemas.samples import Labels

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


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


class SeriesSums(NamedTuple):
    """Per series ``keys[i]``: ``sums[i]``, the sum of its finite points in a window, and
    ``counts[i]``, how many there are (:meth:`SeriesColumns.finite_sums`, and
    ``Store.finite_sums``, which reads a batch of series at a time)."""

    keys: list[SeriesKey]
    sums: F64
    counts: I64


@dataclass(frozen=True, slots=True, eq=False)
class SeriesColumns:
    """Points of many series in two columns: series ``keys[i]``'s points (oldest first, unix
    seconds) are ``ts[bounds[i]:bounds[i + 1]]`` and ``values[bounds[i]:bounds[i + 1]]``;
    every series has at least one.

    What a reader of thousands of series takes instead of :class:`SeriesData`: an alert rule
    reading 5 minutes of 35,000 series (a 1,000-target fleet's failure rates by reason) got
    1.4 million Python floats in tuples, about 60 MB that lived for one evaluation and left
    CPython's allocator holding fresh arenas afterwards.
    """

    keys: list[SeriesKey]
    bounds: I64
    ts: F64
    values: F64

    @classmethod
    def of(cls, data: Iterable[SeriesData]) -> SeriesColumns:
        """The columns of ``data`` (series without points left out)."""
        kept = [sd for sd in data if sd.ts]
        bounds = np.zeros(len(kept) + 1, np.int64)
        np.cumsum([len(sd.ts) for sd in kept], out=bounds[1:])
        return cls([sd.key for sd in kept], bounds,
                   np.array([t for sd in kept for t in sd.ts], np.float64),
                   np.array([v for sd in kept for v in sd.values], np.float64))

    def series(self) -> list[SeriesData]:
        """One :class:`SeriesData` per series."""
        seconds, values, b = self.ts.tolist(), self.values.tolist(), self.bounds.tolist()
        return [
            SeriesData(k.target, k.name, k.labels, tuple(seconds[b[i]:b[i + 1]]),
                       tuple(values[b[i]:b[i + 1]]))
            for i, k in enumerate(self.keys)
        ]

    def finite_sums(self, after: float = -np.inf) -> tuple[F64, I64]:
        """Per series: the sum and the number of its finite points stamped after ``after``."""
        if not self.keys:
            return np.empty(0, np.float64), np.empty(0, np.int64)
        keep = np.isfinite(self.values) & (self.ts > after)
        starts = self.bounds[:-1]
        sums = np.add.reduceat(np.where(keep, self.values, 0.0), starts)
        return sums, np.add.reduceat(keep.astype(np.int64), starts)
