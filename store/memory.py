"""Time series in this process's memory: the scratch backend of ``replay`` and ``backtest``.

:class:`MemorySeries` is both ends of the store's time-series seam (``Store(timeseries=...,
sink=...)``, the one the TSDB backend of ``store.tsdb`` uses): samples written to the store
are appended here at once (no buffer, no SQL, no fsync), and ``Store.read`` / ``increase`` /
``rate`` / ``series`` / ``series_page`` are answered from here, with the same answers as the
SQL ``Reader`` over raw samples (``tests/store/test_memory.py`` holds them equal):

- a series is ``(target, name, labels)`` with the labels canonical (sorted, one value per
  name, as the SQL store's JSON keeps them); of two samples of a series at one millisecond
  the one written last is kept;
- raw reads take ``lo <= ts <= hi``; buckets are epoch-aligned ``step`` buckets of the raw
  samples in the window, stamped with their start, with ``query.aggregate``'s arithmetic
  (``+inf`` and ``-inf`` in one bucket sum to NaN, as there); there are no rollups here, so
  a bucket never holds data from before ``start``;
- increase and rate: reset-aware, without extrapolation, over the samples in the window
  (``query.increase``'s arithmetic).

Layout: per target and metric name, one block of a row per timestamp and a column per series
(NaN where a series has no sample: the store never stores NaN), rows in time order as scrapes
arrive (a target's series of a name share its scrapes' timestamps).  A read of a name over a
window is two binary searches and a slice of its columns per target, already in the (series,
time) order the answer wants: it costs what the window holds, not what the store holds, and
no SQL statement is built or parsed on the way.

Nothing is durable and nothing is dropped: memory is 8 bytes per timestamp per series a
target's name ever had (a day of a 3,000-series target at 30 s is about 70 MB; series that
come and go leave NaN holes), which is what a replay of a recording asks for.  Thread-safe.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.schemas.samples import Labels, label_value, labels_json, make_labels
from tritonwatch.store.chunks import Merged
from tritonwatch.store.errors import LimitExceeded, QueryError
from tritonwatch.store.query import AGGS, ROLLUP_5M_MS, counter_increases
from tritonwatch.store.reads import Query, page_window
from tritonwatch.store.values import SeriesColumns, SeriesKey

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_EMPTY = SeriesColumns([], np.zeros(1, np.int64), np.empty(0), np.empty(0))
_ROWS = 256
_COLS = 8


class _Block:
    """Samples of one metric name: a row per timestamp (in time order), a column per series,
    NaN where a series has no sample (NaN is never stored: the store leaves it out)."""

    __slots__ = ("cols", "n", "number", "slot_of", "ts", "values")

    def __init__(self, number: int) -> None:
        self.number = number
        self.ts = np.empty(_ROWS, np.int64)
        self.values = np.full((_ROWS, _COLS), np.nan)
        self.slot_of: dict[int, int] = {}
        self.n = 0  # rows in use
        self.cols = 0  # columns in use

    def slot(self, sid: int) -> int:
        col = self.slot_of.get(sid)
        if col is None:
            col = self.slot_of[sid] = self.cols
            if col == self.values.shape[1]:
                wider = np.full((self.values.shape[0], 2 * col), np.nan)
                wider[:, :col] = self.values
                self.values = wider
            self.cols += 1
        return col

    def row(self, ts_ms: int) -> int:
        """The row of ``ts_ms``, added (in time order) if there is none."""
        n = self.n
        if n and self.ts[n - 1] == ts_ms:
            return n - 1
        at = n if not n or ts_ms > self.ts[n - 1] else int(np.searchsorted(self.ts[:n], ts_ms))
        if at < n and self.ts[at] == ts_ms:
            return at
        if n == len(self.ts):
            longer = np.full((2 * n, self.values.shape[1]), np.nan)
            longer[:n] = self.values[:n]
            self.values = longer
            self.ts = np.concatenate([self.ts, np.empty(n, np.int64)])
        if at < n:  # a late sample: the rows after it move down one
            self.ts[at + 1:n + 1] = self.ts[at:n]
            self.values[at + 1:n + 1] = self.values[at:n]
            self.values[at] = np.nan
        self.ts[at] = ts_ms
        self.n = n + 1
        return at

    def window(self, lo_ms: int, hi_ms: int) -> tuple[int, int]:
        """The rows ``[a, b)`` of the timestamps in ``[lo_ms, hi_ms]``."""
        ts = self.ts[:self.n]
        return int(np.searchsorted(ts, lo_ms, "left")), int(np.searchsorted(ts, hi_ms, "right"))


class MemorySeries:
    """Time series held in memory: a ``SampleSink`` and a time-series reader for ``Store``
    (``open_store(url, timeseries=m, sink=m)``); see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Per target, ``(name, labels as written)`` -> spelling number; every spelling
        #: seen, and where its samples go: its block's number and column.
        self._spellings: dict[str, dict[tuple[str, Labels], int]] = {}
        self._block_of: list[int] = []
        self._col_of: list[int] = []
        self._where: tuple[I64, I64] | None = None  # the two lists as arrays
        #: canonical key -> series number, and back.
        self._ids: dict[SeriesKey, int] = {}
        self._keys: list[SeriesKey] = []
        #: ``(target, name)`` -> its block: a target's series of a name share the timestamps
        #: of its scrapes; another target's do not (a block per name would be a row per
        #: timestamp of every target, nearly all NaN).
        self._blocks: dict[tuple[str, str], _Block] = {}
        self._block_list: list[_Block] = []  # by block number
        self._names: dict[str, list[int]] = {}  # name -> its series numbers
        #: ``find`` answers by selection, forgotten whenever a series is created.
        self._memo: dict[tuple[Any, ...], list[tuple[int, SeriesKey]]] = {}
        #: ``_layout`` answers for the ``find`` answers in the memo, by their ``id``.
        self._layouts: dict[int, tuple[list[tuple[int, SeriesKey]],
                                       list[tuple[_Block, I64, I64]]]] = {}

    # --- the sink ----------------------------------------------------------------------------

    def append_columns(self, target: str, ts: float, names: list[str], labels: list[Labels],
                       values: npt.NDArray[np.float64]) -> None:
        """One scrape (NaN already left out by the store): kept at once."""
        ts_ms = round(ts * 1000)
        with self._lock:
            spellings = self._spellings.setdefault(target, {})
            get = spellings.get
            at = [get(k, -1) for k in zip(names, labels, strict=True)]
            if -1 in at:
                for i, k in enumerate(zip(names, labels, strict=True)):
                    if at[i] < 0:
                        p = get(k)
                        at[i] = spellings[k] = self._spell(target, *k) if p is None else p
            if self._where is None:
                self._where = np.array(self._block_of, np.int64), np.array(self._col_of,
                                                                           np.int64)
            p_arr = np.array(at, np.int64)
            blk, col = self._where[0][p_arr], self._where[1][p_arr]
            blocks = self._block_list
            if len(np.unique(blk * (1 << 32) + col)) < len(blk):
                # A series twice in one scrape: written in order, so the last one stays.
                for b_, c_, v_ in zip(blk.tolist(), col.tolist(), values.tolist(), strict=True):
                    block = blocks[b_]
                    block.values[block.row(ts_ms), c_] = v_
                return
            # One assignment per name (no series is twice: any order will do).
            order = np.argsort(blk, kind="stable")
            blk, col, values = blk[order], col[order], values[order]
            cuts = (np.flatnonzero(blk[1:] != blk[:-1]) + 1).tolist()
            for a, b in zip([0, *cuts], [*cuts, len(blk)], strict=True):
                block = blocks[int(blk[a])]
                row = block.row(ts_ms)
                block.values[row, col[a:b]] = values[a:b]

    def send_now(self) -> None:
        """Every sample is readable as soon as it is written."""

    def load(self, cols: SeriesColumns, *, max_cells: int | None = None) -> int:
        """Hold ``cols`` (raw samples, canonical keys, no two at one millisecond: a store's
        answer) at timestamps this object holds nothing at for their target and name (a span
        of time it does not hold yet): one assignment per block.  Returns the values it
        allocated (a row per timestamp, a column per series of the block); LimitExceeded,
        holding nothing of ``cols``, when that would be more than ``max_cells``."""
        if not cols.keys:
            return 0
        ts_ms = np.rint(cols.ts * 1000).astype(np.int64)
        sizes = np.diff(cols.bounds)
        by_block: dict[tuple[str, str], list[int]] = {}
        for i, key in enumerate(cols.keys):
            by_block.setdefault(key[:2], []).append(i)
        with self._lock:
            plans = []
            cells = 0
            for where, series in by_block.items():
                at = np.concatenate([np.arange(cols.bounds[i], cols.bounds[i + 1])
                                     for i in series])
                stamps = np.unique(ts_ms[at])
                block = self._blocks.get(where)
                held, old = (0, 0) if block is None else (block.n, block.cols)
                slot_of = {} if block is None else block.slot_of
                width = old + sum(1 for i in series
                                  if self._ids.get(cols.keys[i]) not in slot_of)
                cells += (held + len(stamps)) * width - held * old
                plans.append((series, at, stamps))
            if max_cells is not None and cells > max_cells:
                raise LimitExceeded(f"holding these samples would take more than "
                                    f"{max_cells:,} values", what="samples", limit=max_cells)
            for series, at, stamps in plans:
                col = np.fromiter((self._place(cols.keys[i])[1] for i in series), np.int64,
                                  len(series))
                block = self._blocks[cols.keys[series[0]][:2]]  # _place made it
                n = block.n
                if np.isin(stamps, block.ts[:n]).any():
                    raise ValueError(f"load: {cols.keys[series[0]][:2]!r} holds samples at "
                                     "these times already")
                grid = np.full((n + len(stamps), max(block.cols, 1)), np.nan)
                grid[:n] = block.values[:n, :grid.shape[1]]
                grid[n + np.searchsorted(stamps, ts_ms[at]), np.repeat(col, sizes[series])] = \
                    cols.values[at]
                every = np.concatenate([block.ts[:n], stamps])
                order = np.argsort(every, kind="stable")
                block.ts, block.values, block.n = every[order], grid[order], len(every)
        return cells

    def _spell(self, target: str, name: str, labels: Labels) -> int:
        """A new spelling of a series (its labels as written): its number, the series (and
        its block's column) created if it is new too."""
        # As the SQL store keeps them: sorted, one value per label name (the last given).
        block, col = self._place(SeriesKey(target, name, make_labels(dict(labels))))
        self._block_of.append(block.number)
        self._col_of.append(col)
        self._where = None
        return len(self._block_of) - 1

    def _place(self, key: SeriesKey) -> tuple[_Block, int]:
        """The block and column of series ``key`` (canonical), made if it is new."""
        name = key.name
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self._keys)
            self._keys.append(key)
            self._names.setdefault(name, []).append(sid)
            self._memo.clear()
            self._layouts.clear()
        block = self._blocks.get(key[:2])
        if block is None:
            block = self._blocks[key[:2]] = _Block(len(self._block_list))
            self._block_list.append(block)
        return block, block.slot(sid)

    def close(self) -> None:
        """Nothing to release: the samples go with this object."""

    # --- reads -------------------------------------------------------------------------------

    def find(self, q: Query, *, window: tuple[int, int] | None = None) -> list[SeriesKey]:
        """The series ``q`` selects, sorted by key (its window is ignored)."""
        with self._lock:
            return [key for _, key in self._find(q)]

    def _find(self, q: Query) -> list[tuple[int, SeriesKey]]:
        """``(series number, key)`` of the series ``q`` selects, sorted by key."""
        memo_key = None
        if q.where is None:
            memo_key = (q.name, None if q.names is None else frozenset(q.names), q.target,
                        tuple(sorted((q.match or {}).items())), q.max_series)
            found = self._memo.get(memo_key)
            if found is not None:
                return found
        names: Collection[str] | None = q.names
        if q.name is not None:
            names = [q.name] if names is None else [q.name] if q.name in names else []
        if names is None:
            candidates: Sequence[int] = range(len(self._keys))
        else:
            candidates = [sid for name in sorted(set(names)) for sid in self._names.get(name, ())]
        out = []
        match, where, target = q.match, q.where, q.target
        for sid in candidates:
            key = self._keys[sid]
            if target is not None and key.target != target:
                continue
            if match and any(label_value(key.labels, k, "") != v for k, v in match.items()):
                continue
            if where is not None and not where(key.target, key.name, key.labels):
                continue
            out.append((sid, key))
            if q.max_series is not None and len(out) > q.max_series:
                raise LimitExceeded(f"the query selects more than {q.max_series:,} series",
                                    what="series", limit=q.max_series)
        out.sort(key=lambda item: item[1])
        if memo_key is not None:
            self._memo[memo_key] = out
        return out

    def _grids(self, found: list[tuple[int, SeriesKey]], lo_ms: int, hi_ms: int,
               max_samples: int | None) -> list[_Grid]:
        """The samples of ``found`` in ``[lo_ms, hi_ms]``: a grid per metric name, a row per
        series (in ``found``'s order), a column per timestamp (in time order)."""
        out: list[_Grid] = []
        total = 0
        for block, ranks, cols in self._layout(found):
            a, b = block.window(lo_ms, hi_ms)
            if a == b:
                continue
            grid = np.ascontiguousarray(block.values[a:b, cols].T)  # a copy: safe unlocked
            has = ~np.isnan(grid)
            total += int(np.count_nonzero(has))
            if max_samples is not None and total > max_samples:
                raise LimitExceeded(f"the query would read more than {max_samples:,} samples",
                                    what="samples", limit=max_samples)
            out.append(_Grid(ranks, block.ts[a:b].copy(), grid, has))
        return out

    def _layout(self, found: list[tuple[int, SeriesKey]]) -> list[tuple[_Block, I64, I64]]:
        """Per block of ``found``'s series: the block, their ranks in ``found`` and their
        columns; remembered for a remembered ``found`` (rules ask the same every time)."""
        known = self._layouts.get(id(found))
        if known is not None and known[0] is found:
            return known[1]
        by_block: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (rank, sid), rank order
        for rank, (sid, key) in enumerate(found):
            by_block.setdefault(key[:2], []).append((rank, sid))
        layout = []
        for where, wanted in by_block.items():
            block = self._blocks[where]
            layout.append((block, np.fromiter((r for r, _ in wanted), np.int64, len(wanted)),
                           np.fromiter((block.slot_of[sid] for _, sid in wanted), np.int64,
                                       len(wanted))))
        if any(f is found for f in self._memo.values()):
            self._layouts[id(found)] = (found, layout)
        return layout

    def _samples(self, found: list[tuple[int, SeriesKey]], lo_ms: int, hi_ms: int,
                 max_samples: int | None) -> Merged:
        """The samples of ``found`` in ``[lo_ms, hi_ms]`` sorted by ``(rank, ts)``, ``rank``
        a series' place in ``found``."""
        cols = _assemble(found, [g.raw() for g in self._grids(found, lo_ms, hi_ms,
                                                               max_samples)])
        ranks = np.repeat(np.arange(len(cols.keys)), np.diff(cols.bounds))
        if cols.keys:  # the ranks in ``found`` of the series that have samples
            where = {key: r for r, (_, key) in enumerate(found)}
            ranks = np.fromiter((where[k] for k in cols.keys), np.int64, len(cols.keys))[ranks]
        return Merged(ranks, np.rint(cols.ts * 1000).astype(np.int64), cols.values)

    def read(self, q: Query) -> SeriesColumns:
        lo, hi = q.window()
        if q.step is None:
            if q.agg is not None:
                raise QueryError(f"agg {q.agg!r} needs a step")
        else:
            if q.agg not in AGGS:
                raise QueryError(f"agg must be one of {sorted(AGGS)}, got {q.agg!r}")
            if not np.isfinite(q.step) or round(q.step * 1000) < 1:
                raise QueryError(f"step must be a positive number of seconds, got {q.step!r}")
        with self._lock:
            found = self._find(q)
            if not found:
                return _EMPTY
            grids = self._grids(found, lo, hi, q.max_samples)
        if q.step is None:
            return _assemble(found, [g.raw() for g in grids])
        step, agg = round(q.step * 1000), str(q.agg)
        return _assemble(found, [g.buckets(step, agg) for g in grids])

    def increase(self, q: Query) -> list[tuple[SeriesKey, float, int, int]]:
        """As ``query.increase``: reset-aware over the raw samples in the window."""
        lo, hi = q.window()
        with self._lock:
            found = self._find(q)
            if not found:
                return []
            m = self._samples(found, lo, hi, q.max_samples)
        if len(m) < 2:
            return []
        return [(found[r][1], inc, first, last)
                for r, inc, first, last in counter_increases(m)]

    def series_page(self, q: Query, *, after: SeriesKey | None,
                    limit: int | None) -> list[SeriesKey]:
        window = page_window(q)
        with self._lock:
            found = self._find(Query(q.name, names=q.names, target=q.target, where=q.where))
            order = sorted(found, key=lambda f: (f[1].target, f[1].name, labels_json(f[1].labels)))
            if after is not None:
                cursor = (after.target, after.name, labels_json(after.labels))
                order = [f for f in order
                         if (f[1].target, f[1].name, labels_json(f[1].labels)) > cursor]
            if window is not None and order:
                m = self._samples(order, window[0], window[1], q.max_samples)
                has = set(np.unique(m.ids).tolist())
                order = [f for r, f in enumerate(order) if r in has]
        keys = [key for _, key in order]
        return keys if limit is None else keys[:limit]


#: Per series with samples (in rank order): its rank, its number of points, then all their
#: timestamps (unix s) and values, one series after the other.
_Piece = tuple[I64, I64, F64, F64]


class _Grid(NamedTuple):
    """Samples of some series of one name: ``grid[i, j]`` is series ``ranks[i]``'s value at
    ``ts[j]`` (ms), where ``has[i, j]``."""

    ranks: I64
    ts: I64
    grid: F64
    has: npt.NDArray[np.bool_]

    def raw(self) -> _Piece:
        counts = self.has.sum(axis=1)
        keep = counts > 0
        flat = self.has.ravel()
        return (self.ranks[keep], counts[keep],
                np.tile(self.ts / 1000, len(self.ranks))[flat], self.grid[self.has])

    def buckets(self, step_ms: int, agg: str) -> _Piece:
        """Epoch-aligned ``step_ms`` buckets, each stamped with its start: what
        ``query.aggregate`` and ``query._merge`` give over raw samples, per ``agg``."""
        b = self.ts // step_ms * step_ms
        starts = np.flatnonzero(np.concatenate([[True], b[1:] != b[:-1]]))
        has, grid = self.has, self.grid
        n = np.add.reduceat(has, starts, axis=1)
        # +inf and -inf in one bucket sum to NaN, as in SQL; numpy would also warn about it.
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if agg in ("avg", "sum"):
                total = np.add.reduceat(np.where(has, grid, 0.0), starts, axis=1)
                value = total / n if agg == "avg" else total
            elif agg == "count":
                value = n.astype(np.float64)
            elif agg == "min":
                value = np.minimum.reduceat(np.where(has, grid, np.inf), starts, axis=1)
            elif agg == "max":
                value = np.maximum.reduceat(np.where(has, grid, -np.inf), starts, axis=1)
            else:  # last: the value at the newest timestamp with one
                at = np.maximum.reduceat(np.where(has, np.arange(len(b)), -1), starts, axis=1)
                value = np.take_along_axis(grid, np.maximum(at, 0), axis=1)
        full = n > 0
        counts = full.sum(axis=1)
        keep = counts > 0
        return (self.ranks[keep], counts[keep],
                np.tile(b[starts] / 1000, len(self.ranks))[full.ravel()], value[full])


def _assemble(found: Sequence[tuple[int, SeriesKey]], pieces: list[_Piece]) -> SeriesColumns:
    """The columns of ``pieces`` (each in rank order, no rank in two), in rank order."""
    pieces = [p for p in pieces if len(p[0])]
    if not pieces:
        return _EMPTY
    if len(pieces) == 1:
        ranks, counts, ts, values = pieces[0]
    else:
        ranks, counts, ts, values = (np.concatenate(c) for c in zip(*pieces, strict=True))
        first = np.cumsum(counts) - counts  # each series' first point, as concatenated
        order = np.argsort(ranks, kind="stable")
        ranks, counts, first = ranks[order], counts[order], first[order]
        # Each series' points, one series after the other in rank order.
        take = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(
            int(counts.sum()))
        ts, values = ts[take], values[take]
    bounds = np.zeros(len(ranks) + 1, np.int64)
    np.cumsum(counts, out=bounds[1:])
    return SeriesColumns([found[r][1] for r in ranks.tolist()], bounds, ts, values)


#: What :class:`HeldWindow` holds at most (values, 8 bytes each).
HELD_SAMPLES = 20_000_000
#: :class:`HeldWindow` reads a name's samples from the database in epoch-aligned spans of
#: this many seconds: the windows of a backtest's next steps are mostly in the span already.
HELD_SPAN_S = 6 * 3600


class HeldWindow:
    """Raw samples of the names read, held in memory for the reads that repeat over history
    (``Store.held``: ``backtest``): a read of a name reads the spans of
    :data:`HELD_SPAN_S` it touches from the database, once each, and is answered here; so are
    later reads in those spans.

    Answered here, with the database's answers (the same raw samples, the same arithmetic):
    raw reads, increase and rate, and buckets whose step is not a multiple of 5 minutes.
    Left to the database (:meth:`read` answers None): steps that are multiples of 5 minutes
    (the database may answer those from its rollups, whose first bucket reaches before the
    window), reads with ``max_series`` or ``max_samples`` (the database counts them its own
    way), reads of every name, and names whose samples would take the holding past
    ``max_samples``.  Samples written to the database after their span was read are not seen:
    it is for history, not for data still being written.
    """

    def __init__(self, load: Callable[[Query], SeriesColumns], *,
                 max_samples: int = HELD_SAMPLES, span_s: float = HELD_SPAN_S) -> None:
        self._load = load
        self._max = max_samples
        self._span = round(span_s * 1000)
        self._series = MemorySeries()
        self._lock = threading.Lock()
        #: Per name read: the spans held (their numbers), or None: left to the database.
        self.names: dict[str, set[int] | None] = {}
        #: Values held: each block's rows times its columns (the samples, and the holes where
        #: a series of the block has none at a timestamp), what ``max_samples`` bounds.
        self.samples = 0

    def read(self, q: Query) -> SeriesColumns | None:
        """``Store.read``'s answer, or None: ask the database."""
        return self._series.read(q) if self._holds(q) else None

    def increase(self, q: Query) -> list[tuple[SeriesKey, float, int, int]] | None:
        """``Store.increase``'s answer (with each series' first and last ms), or None."""
        return self._series.increase(q) if self._holds(q) else None

    def _holds(self, q: Query) -> bool:
        if q.max_samples is not None or q.max_series is not None:
            return False
        if (q.name is None) == (q.names is None):  # every name, or a name within names
            return False
        if q.step is not None and (not math.isfinite(q.step)
                                   or round(q.step * 1000) % ROLLUP_5M_MS == 0):
            return False
        if q.start is None or q.end is None or not (
                math.isfinite(q.start) and math.isfinite(q.end)) or q.start > q.end:
            return False  # the database says what is wrong with it
        first, last = round(q.start * 1000) // self._span, round(q.end * 1000) // self._span
        names = [q.name] if q.name is not None else sorted(set(q.names or ()))
        with self._lock:
            for name in names:
                spans = self.names.setdefault(name, set())
                for span in range(first, last + 1):
                    if spans is not None and span not in spans:
                        spans = self._fetch(name, spans, span)
                    if spans is None:
                        return False
            return True

    def _fetch(self, name: str, spans: set[int], span: int) -> set[int] | None:
        lo = span * self._span
        left = self._max - self.samples
        try:
            cols = self._load(Query(name, start=lo / 1000, end=(lo + self._span - 1) / 1000,
                                    max_samples=left))
            self.samples += self._series.load(cols, max_cells=left)
        except LimitExceeded:
            self.names[name] = None
            return None
        spans.add(span)
        return spans
