"""Long windows of step buckets kept between evaluations, read from the store once per slice.

The built-in rules run every 30 s, but the long windows they look at (a regression's 4 h or
week-ago baseline, a forecast's 30 min) move by one 5-minute *quantum* at a time (see
:func:`quantum_for`) and hold buckets that have long stopped changing.  Reading them from the
store on every evaluation made evaluation cost grow with the stored history and the fleet
(raw chunks of every series decoded again each time).  :class:`BucketHistory` keeps the
buckets of ``[lo, hi)`` per group in one float array each; when the window moves it reads only
the new slice (``[old hi, new hi)``) and drops what fell off the front, so each bucket is read
once, and memory is bounded by the window (groups whose series vanished are dropped once they
have no bucket left in it).

What it does not see: samples written into a slice after that slice was read (a buffer flushed
after an outage).  The windows it serves end at least one quantum plus a grace before ``now``,
so such late samples are rare; they show up after a restart, or when the window jumps (time
going backwards, or a window whose old and new range do not overlap), which reads it whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from tritonwatch.alerts.grouping import by_labels
from tritonwatch.schemas.samples import Labels
from tritonwatch.store import Query
from tritonwatch.store.values import SeriesColumns

if TYPE_CHECKING:
    from tritonwatch.store import Store

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
Grid = F64 | F32
_G = TypeVar("_G", F64, F32)

#: What a history keeps its buckets as.  They are means of rates, ratios and utilizations
#: (six significant digits and more are noise in them), read into float64 for every
#: statistic (``alerts.stats``).  At 1,000 targets of 7 models, the histories of the built-in
#: rules' 4-hour windows of 1-minute buckets were 37 MB as float64.
STORED = np.float32
_STORED_MAX = float(np.finfo(STORED).max)


def _fits(grid: Grid) -> bool:
    """Whether every value of ``grid`` is within :data:`STORED`'s range (a broken exporter's
    1e300 would become an infinity there)."""
    return not grid.size or float(np.fmax.reduce(np.abs(grid), axis=None, initial=0.0)) <= (
        _STORED_MAX)
#: A history reads its window this much at a time (:meth:`BucketHistory._read`).
READ_SLICE_S = 3600.0
GroupKey = tuple[str, Labels]  # target, by-labels

#: Long windows move in steps of (at least) this: rollups are 5-minute buckets, and a baseline
#: that changes every 5 minutes instead of every 30 s is as good for detection.
QUANTUM_S = 300.0


def quantum_for(step: float, limit: float | None = None) -> float:
    """The smallest multiple of ``step`` that is at least :data:`QUANTUM_S` (or ``limit``, if
    smaller: a rule with windows of seconds must not be aligned to 5 minutes).

    Window edges on this grid are also bucket edges, so every step bucket lies wholly inside
    one slice read (its value is the same as a read of the whole window would give)."""
    least = QUANTUM_S if limit is None else min(QUANTUM_S, limit)
    return step * max(1, math.ceil(least / step - 1e-9))


def floor_to(t: float, q: float) -> float:
    return math.floor(t / q + 1e-9) * q


def ceil_to(t: float, q: float) -> float:
    return math.ceil(t / q - 1e-9) * q


def group_grid(
    data: SeriesColumns | Iterable[SeriesColumns],
    by: tuple[str, ...],
    *,
    lo: float,
    n: int,
    step: float,
    how: Literal["mean", "sum"] = "mean",
) -> tuple[list[GroupKey], F64]:
    """Bucket points of ``[lo, lo + n * step)`` grouped by target and ``by`` labels.

    The groups (in first-seen order) and one row of ``n`` slots per group, NaN where no
    series of the group has a finite point; points of one bucket are averaged (``mean``) or
    summed (``sum``) over the group's series, as :func:`alerts.grouping.group_points` does.
    Groups with no finite point in the range have no row.

    ``data`` may come in batches of series (``Store.read_batches``): each is added into the
    groups' sums and counts and let go, so only one batch's points are held beside the grid.
    The points are added in the order of the series and batches, as one ``bincount`` over
    the batches joined would add them: the same sums to the last bit."""
    parts = [data] if isinstance(data, SeriesColumns) else data
    rows: dict[GroupKey, int] = {}
    sums = np.zeros(0)
    counts = np.zeros(0, np.int64)
    for part in parts:
        if not part.keys:
            continue
        idx = np.rint((part.ts - lo) / step).astype(np.int64)
        keep = (idx >= 0) & (idx < n) & np.isfinite(part.values)
        has = np.add.reduceat(keep, part.bounds[:-1]) > 0
        row_of = np.full(len(part.keys), -1, np.int64)
        for i in np.flatnonzero(has).tolist():
            key = part.keys[i]
            row_of[i] = rows.setdefault((key.target, by_labels(key.labels, by)), len(rows))
        if len(rows) * n > len(sums):  # room for the new groups, doubling
            size = max(len(rows), 2 * len(sums) // max(n, 1)) * n
            sums = np.concatenate([sums, np.zeros(size - len(sums))])
            counts = np.concatenate([counts, np.zeros(size - len(counts), np.int64)])
        at = (idx + np.repeat(row_of, np.diff(part.bounds)) * n)[keep]
        # Unbuffered, in order: what bincount(at, weights) adds, onto the earlier batches'.
        np.add.at(sums, at, part.values[keep])
        counts += np.bincount(at, minlength=len(counts))
    if not rows:
        return [], np.empty((0, n))
    size = len(rows) * n
    out: F64 = sums[:size]
    hits = counts[:size]
    if how == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            out = out / hits
    else:
        out = out.copy()
    out[hits == 0] = np.nan
    return list(rows), out.reshape(len(rows), n)


def join_columns(
    keys: list[GroupKey], rows: Mapping[GroupKey, int], old: Grid, new_keys: list[GroupKey],
    new: Grid, *, dtype: type[np.floating[Any]] = np.float64,
) -> tuple[list[GroupKey], Any]:
    """``old``'s columns (a row per group of ``keys``; ``rows``: each one's row) then
    ``new``'s (a row per group of ``new_keys``): one row per group of either, NaN where a
    group has no value; ``keys``' groups first, in their order, as ``dtype``."""
    joined = keys + [k for k in new_keys if k not in rows]
    out = np.full((len(joined), old.shape[1] + new.shape[1]), np.nan, dtype)
    out[:len(keys), :old.shape[1]] = old
    if new_keys:
        added = {k: i for i, k in enumerate(joined[len(keys):], len(keys))}
        out[[rows.get(k, added.get(k, -1)) for k in new_keys], old.shape[1]:] = new
    return joined, out


def read_columns(
    store: Store, names: Sequence[str], *, start: float, end: float, step: float,
    match: Mapping[str, str] | None,
) -> Iterator[SeriesColumns]:
    """``avg`` buckets of every series of ``names``, in batches of series
    (``Store.read_batches``): a load driver made of several series (successes and failures)
    is grouped and summed like one (:func:`group_grid`)."""
    for name in names:
        yield from store.read_batches(Query(name, start=start, end=end, step=step, agg="avg",
                                            match=match or None))


def drop_empty(keys: list[GroupKey], grid: _G) -> tuple[list[GroupKey], _G]:
    """The groups (and rows) of ``grid`` with at least one value."""
    alive = np.asarray(~np.isnan(grid).all(axis=1))
    if alive.all():
        return keys, grid
    return [k for k, a in zip(keys, alive.tolist(), strict=True) if a], grid[alive]


class BucketHistory:
    """``avg`` buckets of one series (or of several, grouped together: ``name`` a tuple) over
    a sliding ``[lo, hi)``, per group, read by slices.

    ``lo`` and ``hi`` are multiples of ``step``; moving them by whole quanta (the callers'
    windows) reads only the new slice.  The buckets are one 2-D array (a row per group, a
    column per slot): at 1,000 targets of 7 models a 4-hour window of 1-minute buckets is
    7,000 rows of 240 floats, and an array per group added a tenth to that in headers and
    scattered the rest over the heap.  ``reads`` counts the ranges read (tests, and debugging
    a cost regression; each is read from the store :data:`READ_SLICE_S` at a time).
    """

    def __init__(
        self,
        name: str | tuple[str, ...],
        *,
        step: float,
        by: Sequence[str],
        how: Literal["mean", "sum"] = "mean",
        match: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.names: tuple[str, ...] = (name,) if isinstance(name, str) else name
        self.step = step
        self.by = tuple(by)
        self.how: Literal["mean", "sum"] = how
        self.match = dict(match or {})
        self.lo: float | None = None
        self.hi: float | None = None
        self.keys: list[GroupKey] = []
        self.rows: dict[GroupKey, int] = {}
        #: A row per group of :attr:`keys`, a column per slot, as :data:`STORED`; as float64
        #: from the first value read outside its range on.
        self.values: Grid = np.empty((0, 0), STORED)
        self._dtype: type[np.floating[Any]] = STORED
        self.reads = 0
        #: Changes whenever :attr:`keys` and :attr:`values` do: what caches of row numbers
        #: and row statistics (``alerts.baseline.BaselineCache``) check before they are used.
        self.generation = 0
        #: What the caches reading this history worked out from its rows, by their own keys
        #: (``alerts.baseline.BaselineCache.load_row``'s sums of a target's load rows), shared
        #: by every cache that reads it and emptied whenever the rows change.
        self.memo: dict[object, Any] = {}

    @property
    def data(self) -> dict[GroupKey, Grid]:
        """Each group's row (views into :attr:`values`)."""
        return dict(zip(self.keys, self.values, strict=True))

    def row(self, key: GroupKey) -> Grid | None:
        """The group's row (a view into :attr:`values`), or None."""
        i = self.rows.get(key)
        return None if i is None else self.values[i]

    def _slots(self, a: float, b: float) -> int:
        return max(0, round((b - a) / self.step))

    def _read(self, store: Store, a: float, b: float) -> tuple[list[GroupKey], Grid]:
        """The groups and their buckets of ``[a, b)``, read :data:`READ_SLICE_S` at a time."""
        n = self._slots(a, b)
        if n == 0:
            return [], np.empty((0, 0))
        self.reads += 1
        # A window whole was the peak of a restart: 4 hours of 1-minute buckets of every
        # instance held as the store's columns (a timestamp and a value per bucket, and
        # the partials they were merged from), then as a grid.  A slice at a time, joined
        # as the kept float32, holds one slice's columns beside the grid (bench.alerts_eval
        # at 300 targets: the load history's cold read peaked at 124 MiB traced whole).
        per = max(1, round(READ_SLICE_S / self.step))
        keys: list[GroupKey] = []
        grid: Grid = np.empty((0, 0), self._dtype)
        for first in range(0, n, per):
            lo = a + first * self.step
            m = min(per, n - first)
            # ``end`` is inclusive: stop 1 ms short so the bucket starting at the slice's end
            # is not read half-empty (it belongs to the next slice).
            data = read_columns(store, self.names, start=lo, end=lo + m * self.step - 0.001,
                                step=self.step, match=self.match)
            part = group_grid(data, self.by, lo=lo, n=m, step=self.step, how=self.how)
            if not _fits(part[1]):
                self._dtype = np.float64
            if first == 0 and m == n:
                return part
            keys, grid = join_columns(keys, {k: i for i, k in enumerate(keys)}, grid, *part,
                                      dtype=self._dtype)
        return keys, grid

    def _hold(self, keys: list[GroupKey], values: Grid) -> None:
        self.generation += 1
        self.memo = {}
        self.keys, self.values = keys, values.astype(self._dtype, copy=False)
        self.rows = {k: i for i, k in enumerate(keys)}

    def advance(self, store: Store, lo: float, hi: float) -> bool:
        """Hold ``[lo, hi)``; reads only what is not held yet.  True when the range moved."""
        if self.lo == lo and self.hi == hi:
            return False
        if self.lo is None or self.hi is None or lo < self.lo or hi < self.hi or lo >= self.hi:
            self._hold(*self._read(store, lo, hi))
            self.lo, self.hi = lo, hi
        else:
            self._slide(lo, hi, *self._read(store, self.hi, hi))  # may widen ``_dtype``: first
        return True

    def _slide(self, lo: float, hi: float, new_keys: list[GroupKey], new: Grid) -> None:
        """Hold ``[lo, hi)``: what is held from ``lo`` on, then ``new`` (the buckets of the
        old ``hi`` to ``hi``).  A group with nothing left in the window goes."""
        assert self.lo is not None
        kept = self.values[:, self._slots(self.lo, lo):]
        self._hold(*drop_empty(*join_columns(self.keys, self.rows, kept, new_keys, new,
                                             dtype=self._dtype)))
        self.lo, self.hi = lo, hi

    def advance_and_read_on(self, store: Store, lo: float, hi: float, end: float
                            ) -> tuple[list[GroupKey], F64]:
        """:meth:`advance` to ``[lo, hi)``, and the groups and buckets of ``[hi, end]`` (a
        column per step from ``hi``; groups of the whole read, some with no point there).

        Where the held range slides on, one read (one lookup of the series, not two) gives
        both what is new of it and ``[hi, end]``.  The first read, a jump, or more than
        :data:`READ_SLICE_S` to read advance as :meth:`advance` does, then read the rest."""
        step = self.step
        n_rest = self._slots(hi, floor_to(end, step) + step)
        if (self.lo is None or self.hi is None or lo < self.lo or hi < self.hi
                or lo >= self.hi or end - self.hi > READ_SLICE_S or not n_rest):
            self.advance(store, lo, hi)
            if not n_rest:
                return [], np.empty((0, 0))
            return group_grid(
                read_columns(store, self.names, start=hi, end=end, step=step, match=self.match),
                self.by, lo=hi, n=n_rest, step=step, how=self.how)
        start = self.hi
        n_new = self._slots(start, hi)
        keys, grid = group_grid(
            read_columns(store, self.names, start=start, end=end, step=step, match=self.match),
            self.by, lo=start, n=n_new + n_rest, step=step, how=self.how)
        self.reads += 1
        if (lo, hi) != (self.lo, self.hi):
            new = grid[:, :n_new]
            if not _fits(new):
                self._dtype = np.float64
            self._slide(lo, hi, keys, new)
        return keys, grid[:, n_new:]

    def timestamps(self) -> F64:
        """Start of each slot (unix s)."""
        assert self.lo is not None and self.hi is not None
        return self.lo + self.step * np.arange(self._slots(self.lo, self.hi), dtype=float)


#: Buckets that ended this long ago are complete: an evaluation flushes the store first, and
#: the rollups wait as long before summarising a bucket (``store.maintenance``).
GRACE_S = 120.0


class RecentBuckets:
    """Buckets of ``[start, now]`` for a window that ends now (a regression's recent 5 min, a
    forecast's 30 min): whole buckets up to the last step at least :data:`GRACE_S` old come
    from a :class:`BucketHistory` (each read once), only the rest (at most a step plus the
    grace) is read on every evaluation.  Only whole buckets are returned: those starting at or
    after ``start``.

    Why the kept part moves a step at a time, not a quantum (5 minutes) like the long
    baselines, and is slid on by the same read as the rest.  What is not kept is read raw on
    every evaluation: on the quantum grid that was 2 to 7 minutes (from up to 5 minutes
    before ``start``), nearly all of a 5-minute window every 30 s, plus a read of the kept
    part's new slice every 5 minutes; on the step grid it is 2 to 3 minutes, and one read
    (:meth:`BucketHistory.advance_and_read_on`: one lookup of the series, a fifth of such a
    read across a fleet, not two) gives both the kept part's new buckets and the rest.  The
    kept part is a few dozen buckets per group, so joining a step to it each minute costs
    little.  In a py-spy profile of a 1,000-target fleet's ``serve``, these reads were a third
    of the rules' evaluation CPU."""

    def __init__(
        self,
        name: str | tuple[str, ...],
        *,
        step: float,
        by: Sequence[str],
        how: Literal["mean", "sum"] = "mean",
        match: Mapping[str, str] | None = None,
    ) -> None:
        # The same parameters as BucketHistory's, deliberately: they are the kept history's,
        # passed on as they are (and the rest of the window is read with them too).
        self.history = BucketHistory(name, step=step, by=by, how=how, match=match)
        # The last read: several rules sharing this window at one ``now`` read it once.
        self._last: tuple[object, float, float, tuple[F64, dict[GroupKey, F64]]] | None = None
        #: What the rules sharing the last read computed from it (``alerts.detect``'s load
        #: medians per instance), emptied when another read replaces it: bounded by one
        #: entry per instance of one read.
        self.memo: dict[object, object] = {}

    def read(self, store: Store, start: float, now: float) -> tuple[F64, dict[GroupKey, F64]]:
        """Bucket starts and, per group, the bucket values (NaN: none) of the window; the
        same objects again for the same ``store``, ``start`` and ``now`` (not to be changed)."""
        last = self._last
        if last is not None and last[0] is store and last[1] == start and last[2] == now:
            return last[3]
        h = self.history
        step = h.step
        first = ceil_to(start, step)
        split = max(floor_to(now - GRACE_S, step), first)
        tail_keys, tail = h.advance_and_read_on(store, first, split, now)
        n = h._slots(first, split) + h._slots(split, floor_to(now, step) + step)
        keys, grid = drop_empty(*join_columns(h.keys, h.rows, h.values, tail_keys, tail))
        out = first + step * np.arange(n, dtype=float), dict(zip(keys, grid, strict=True))
        self._last = (store, start, now, out)
        self.memo = {}
        return out
