"""Series grouped into alert instances (target plus ``by`` labels), and the bucketed reads of one
evaluation, each issued once."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tritonwatch.schemas.regressions import RegressionSpec
from tritonwatch.schemas.samples import Labels, make_labels
from tritonwatch.store import Query

if TYPE_CHECKING:
    from tritonwatch.store import SeriesData, Store

GroupKey = tuple[str, Labels]  # target, by-labels


def group_points(
    data: Iterable[SeriesData], by: Sequence[str], *, how: str = "mean"
) -> dict[GroupKey, dict[float, float]]:
    """Series grouped by target and ``by`` labels; points of one bucket averaged (or summed)."""
    acc: dict[GroupKey, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for sd in data:
        key = (sd.target, by_labels(sd.labels, tuple(by)))
        points = acc[key]
        for ts, v in zip(sd.ts, sd.values, strict=True):
            if math.isfinite(v):
                points[ts].append(v)
    out: dict[GroupKey, dict[float, float]] = {}
    for key, points in acc.items():
        out[key] = {
            ts: (sum(vs) if how == "sum" else sum(vs) / len(vs)) for ts, vs in points.items()
        }
    return out



@functools.lru_cache(maxsize=4096)
def by_labels(labels: Labels, by: tuple[str, ...]) -> Labels:
    """The ``by`` labels of a series' ``labels`` (an instance's labels beside its target).

    Kept per label set: the same few sets (a model's, a GPU's) recur on every target and in
    every read, and rebuilding them per series per read was a tenth of an evaluation's CPU
    at 300 targets.  4,096 sets at most (a few hundred bytes each)."""
    lbl = dict(labels)
    return make_labels({k: lbl[k] for k in by if k in lbl})


def load_names(spec: RegressionSpec) -> tuple[str, ...]:
    """The series whose sum is ``spec``'s load (none: load not modelled)."""
    ls = spec.load_series
    return () if ls is None else (ls,) if isinstance(ls, str) else ls


def load_match(labels: Labels) -> dict[str, str]:
    return {k: v for k, v in labels if k in ("model", "version")}


class SeriesLoader:
    """Bucketed queries of one evaluation, each issued at most once."""

    def __init__(self, store: Store, step: float) -> None:
        self.store = store
        self.step = step
        self._cache: dict[tuple[Any, ...], list[SeriesData]] = {}

    def get(
        self,
        name: str,
        start: float,
        end: float,
        match: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> list[SeriesData]:
        key = (name, start, end, tuple(sorted((match or {}).items())), target)
        if key not in self._cache:
            self._cache[key] = self.store.read(Query(
                name, start=start, end=end, step=self.step, agg="avg", match=match or None,
                target=target,
            )).series()
        return self._cache[key]



def matches(labels: Labels, want: Mapping[str, str]) -> bool:
    d = dict(labels)
    return all(d.get(k) == v for k, v in want.items())


def summed(arrays: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64] | None:
    """``arrays`` (rows of the same buckets, NaN = no point) summed bucket by bucket: NaN where
    none has a point; None without any point at all."""
    if not arrays:
        return None
    stacked = np.vstack(arrays)
    present = ~np.isnan(stacked).all(axis=0)
    if not present.any():
        return None
    out: npt.NDArray[np.float64] = np.nansum(stacked, axis=0)
    out[~present] = np.nan
    return out


def summed_median(arrays: list[npt.NDArray[np.float64]]) -> float | None:
    """Median over buckets of the sum of ``arrays`` (NaN = no point), buckets with any point."""
    total = summed(arrays)
    return None if total is None else float(np.median(total[~np.isnan(total)]))

