"""``query_range`` over raw samples: a selector, or one function over a range, at each step.

At each output time ``t`` (``start``, ``start + step``, ... up to ``end``), over the samples
with ``t - range < ts <= t`` of each series:

=================  ============================================================================
query              value at ``t``
=================  ============================================================================
``selector``       the latest sample within the 5-minute lookback, as Prometheus
``avg_over_time``  mean of the samples (``min_over_time``, ``max_over_time`` alike)
``increase``       reset-aware sum of the rises between consecutive samples (a drop is a
                   counter reset: the new value is the rise), at least two samples
``rate``           ``increase`` / (last sample time - first sample time), per second
=================  ============================================================================

Unlike Prometheus, ``increase`` and ``rate`` are not extrapolated to the window's edges: they
are exactly what the samples show, as the store's derived SLIs are (so ``increase`` of a
counter that rose by 10 reads 10, where Prometheus may read a little more).  Results of a
function drop ``__name__``, as in Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonwatch.api.promql import Query, series_labels
from tritonwatch.store.values import SeriesColumns

F64 = npt.NDArray[np.float64]

#: How far back a plain selector looks for the latest sample (Prometheus's default).
LOOKBACK_S = 300.0


def window_s(query: Query) -> float:
    """How far before ``start`` the samples of ``query`` must be read."""
    return LOOKBACK_S if query.range_s is None else query.range_s


def grid(start: float, end: float, step: float) -> F64:
    n = int(np.floor((end - start) / step + 1e-9)) + 1
    return start + step * np.arange(n, dtype=np.float64)


def _reduce(ufunc: Any, values: F64, lo: npt.NDArray[np.int64],
            hi: npt.NDArray[np.int64]) -> F64:
    """``ufunc`` over ``values[lo[i]:hi[i]]`` for each i (windows may overlap; lo < hi)."""
    padded = np.append(values, 0.0)  # reduceat needs every index below len
    idx = np.empty(2 * len(lo), np.int64)
    idx[0::2], idx[1::2] = lo, hi
    with np.errstate(invalid="ignore", over="ignore"):
        out: F64 = ufunc.reduceat(padded, idx)[0::2]
    return out


def evaluate(query: Query, cols: SeriesColumns, times: F64
             ) -> Iterator[tuple[dict[str, str], F64, F64]]:
    """``(metric labels, output times, values)`` of each series in ``cols``."""
    span = window_s(query)
    bounds = cols.bounds.tolist()
    for i, key in enumerate(cols.keys):
        ts = cols.ts[bounds[i]:bounds[i + 1]]
        values = cols.values[bounds[i]:bounds[i + 1]]
        lo = np.searchsorted(ts, times - span, side="right")
        hi = np.searchsorted(ts, times, side="right")
        labels = series_labels(key.target, key.name, key.labels)
        if query.func is not None:
            del labels["__name__"]
        out_t, out_v = _apply(query.func, ts, values, times, lo, hi)
        yield labels, out_t, out_v


def _apply(func: str | None, ts: F64, values: F64, times: F64, lo: npt.NDArray[np.int64],
           hi: npt.NDArray[np.int64]) -> tuple[F64, F64]:
    if func is None:
        has = hi > lo
        return times[has], values[hi[has] - 1]
    if func in ("avg_over_time", "min_over_time", "max_over_time"):
        has = hi > lo
        lo, hi = lo[has], hi[has]
        if func == "avg_over_time":
            with np.errstate(invalid="ignore", over="ignore"):
                v = _reduce(np.add, values, lo, hi) / (hi - lo)
        else:
            v = _reduce(np.minimum if func == "min_over_time" else np.maximum, values, lo, hi)
        return times[has], v
    # increase, rate: the rises between consecutive samples, a drop counting as a reset.
    rises = np.diff(values)
    reset = rises < 0
    rises[reset] = values[1:][reset]
    has = hi - lo >= 2
    lo, hi = lo[has], hi[has]
    total = _reduce(np.add, rises, lo, hi - 1)
    if func == "increase":
        return times[has], total
    with np.errstate(invalid="ignore", divide="ignore"):
        return times[has], total / (ts[hi - 1] - ts[lo])
