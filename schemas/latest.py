"""The latest derived values of every source, kept in memory for /metrics (api/exporter.py).

The collector fills :class:`LatestValues` as it derives; the API's exporter reads it on every
scrape of /metrics without touching the database.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt

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


class SampleWindow(Sequence[Sample]):
    """``names[i]{labels[i]} = values[i]`` for ``lo <= i < hi``, as a read-only sequence of
    samples built on demand.

    A scrape's derived series are kept until the next one (for /metrics, the GPU join and
    display): as ``Sample`` objects that was ~140 tuples and floats per target, ~20 MB at
    1,000 targets, while the same names and labels are already in the lists handed to the
    store and the values in its array.  A window over those costs nothing more.  The lists and
    the array are never mutated (the collector's convention for what it hands the store).
    """

    __slots__ = ("_hi", "_labels", "_lo", "_names", "_values")

    def __init__(self, names: Sequence[str], labels: Sequence[Labels],
                 values: npt.NDArray[np.float64], lo: int = 0, hi: int | None = None) -> None:
        hi = len(values) if hi is None else hi
        if not (0 <= lo <= hi <= len(values) and hi <= len(names) and hi <= len(labels)):
            raise ValueError(f"SampleWindow: [{lo}, {hi}) outside {len(names)} names, "
                             f"{len(labels)} label sets, {len(values)} values")
        self._names, self._labels, self._values = names, labels, values
        self._lo, self._hi = lo, hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def names(self) -> Sequence[str]:
        """The samples' names, without building the samples."""
        return self._names[self._lo:self._hi]

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...
    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("SampleWindow index out of range")
        j = self._lo + (i % n)
        return Sample(self._names[j], self._labels[j], float(self._values[j]))

    def __iter__(self) -> Iterator[Sample]:
        lo, hi = self._lo, self._hi
        return map(Sample._make, zip(self._names[lo:hi], self._labels[lo:hi],
                                     self._values[lo:hi].tolist(), strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleWindow):
            return list(self) == list(other)
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__: Any = None

    def __repr__(self) -> str:
        return f"SampleWindow({list(self)!r})"


class LatestValues:
    """The latest derived values of every source, kept in memory for /metrics.

    One entry per (target, source): a scrape, an API reading, the NVML join or a probe run
    replaces its own entry whole, and a failed scrape or reading removes it, so /metrics never
    shows a dead target's frozen values as current.  Thread-safe (scrapes derive in worker
    threads); no database read, whatever the scrape rate of /metrics.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_source: dict[tuple[str, str], tuple[float, Sequence[Sample]]] = {}

    def put(self, target: str, source: str, ts: float, samples: Iterable[Sample]) -> None:
        kept = [s for s in samples if s.name.startswith(EXPORTED_PREFIXES)]
        with self._lock:
            self._by_source[(target, source)] = (ts, kept)

    def put_window(self, target: str, source: str, ts: float, window: SampleWindow) -> None:
        """:meth:`put` of a window's samples, kept as the window (no object per sample): the
        names are filtered when read."""
        with self._lock:
            self._by_source[(target, source)] = (ts, window)

    def drop(self, target: str, source: str) -> None:
        with self._lock:
            self._by_source.pop((target, source), None)

    def sources(self) -> list[tuple[str, float, Sequence[Sample]]]:
        """``(target, ts, samples)`` of every source, in (target, source) order: the entries
        themselves, never mutated, so a reader may index them after the lock is released.
        A window's samples include names that are not exported (see :meth:`put_window`)."""
        with self._lock:
            entries = sorted(self._by_source.items())
        return [(target, ts, samples) for (target, _), (ts, samples) in entries]

    def values(self) -> list[LatestValue]:
        return [LatestValue(target, s.name, s.labels, s.value, ts)
                for target, ts, samples in self.sources() for s in samples
                if type(samples) is list or s.name.startswith(EXPORTED_PREFIXES)]
