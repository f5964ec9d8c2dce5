"""``SampleWriter``: a flush of buffered scrapes into the sample log, with series ids.

Series ids come from a per-target ``Layout`` (``store.write``): a scrape listing the same
series as its target's previous one reuses its ids; a changed one resolves its new series (a
group of layouts at a time, in slices of :data:`RESOLVE_SLICE`), within each target's series
limit.  Layouts expire after the writer's ``ttl_s`` (``RetentionConfig.series_cache_ttl``),
so that each writer re-resolves (and so marks as in use, see
``retention.delete_empty_series``) every series it writes.  Every
method runs under the store's flush lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import Engine

from tritonwatch.schemas.config import SERIES_CACHE_TTL_MIN_S
from tritonwatch.schemas.samples import Labels
from tritonwatch.store import maintenance, samplelog
from tritonwatch.store.chunks import sort_keep_last
from tritonwatch.store.engine import transaction
from tritonwatch.store.reads import Reader
from tritonwatch.store.write import (
    REFUSED,
    UNRESOLVED,
    Layout,
    SampleColumns,
    SeriesKeyTuple,
    name_index,
    next_seq,
    resolve_owners,
    resolve_series,
    sample_columns,
    target_groups,
    within_series_limits,
)

#: The series-id cache is dropped this often, by default, so that each writer re-resolves (and
#: so marks as in use, see ``retention.delete_empty_series``) every series it writes.  Raw
#: retention must be longer than a writer's TTL; ``serve`` takes it from its retention
#: (``RetentionConfig.series_cache_ttl``: half the raw retention, up to an hour).
SERIES_CACHE_TTL_S = SERIES_CACHE_TTL_MIN_S

#: Series resolved per statement (and transaction), and the most series whose layouts expire
#: in one flush.
RESOLVE_SLICE = 20_000

#: Samples a flush encodes before inserting them (whole targets, one log row each).  Each
#: group's columns, packed words and row blobs are alive at once, so this bounds the flush's
#: transient memory: measured on a 1,000-target fleet's flush (566,000 samples, traced by
#: ``tracemalloc``), 65,536 peaked 6.8 MiB above the buffered scrapes, 16,384 1.8 MiB, for
#: 138-150 -> 152-153 ms of CPU a flush.  In ``serve`` that peak came on top of the scrapes'
#: own churn: RSS rose 6-10 MiB within the insert every flush interval.
FLUSH_GROUP_SAMPLES = 16_384

#: One buffered scrape, column-wise: (target, ts_ms, sample names, label tuples, values, how
#: many values are NaN).
BufferedScrape = tuple[
    str, int, list[str], list[Labels], np.ndarray[Any, np.dtype[np.float64]], int
]

#: Told, after a flush that dropped samples of series a target's series limit refused:
#: ``(target, series refused, samples dropped)``.  Called in the flushing thread.
SeriesRefused = Callable[[str, int, int], None]


class SampleWriter:
    """Writes scrapes to one database, keeping each target's layout between flushes."""

    def __init__(self, engine: Engine, reader: Reader, *,
                 ttl_s: float = SERIES_CACHE_TTL_S) -> None:
        self._engine = engine
        #: Seconds a target's layout (its series ids) is kept before they are resolved again.
        self.ttl_s = ttl_s
        self._reader = reader  # told when series or rollup watermarks change
        self._layouts: dict[str, Layout] = {}  # per target, the last scrape's series and ids
        self._series_limits: dict[str, int] = {}
        self._on_refused: SeriesRefused | None = None

    def limit_series(self, limits: Mapping[str, int], on_refused: SeriesRefused | None) -> None:
        """See ``Store.limit_series``."""
        self._series_limits = {target: n for target, n in limits.items() if n > 0}
        self._on_refused = on_refused
        self._layouts.clear()  # resolved under the old limits

    def forget_layouts(self) -> None:
        """Resolve every series again (retention removed some: their ids may be gone)."""
        self._layouts.clear()

    def write(self, chunks: Iterable[BufferedScrape]) -> int:
        """Write buffered scrapes (the flush lock held); returns the samples written."""
        layouts = self._layouts
        now = time.monotonic()
        self._expire_layouts(now)
        # 1. Series ids.  A scrape listing the same series as its target's previous one (the
        # steady state) reuses that layout's ids; only a changed scrape hashes its keys.
        current: dict[str, Layout] = {}
        # Layouts with series to create, and which positions need an id.
        stale: dict[int, tuple[Layout, np.ndarray[Any, np.dtype[np.bool_]]]] = {}
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]] = []
        for target, ts_ms, names, labels, values, nan in chunks:
            prev = current.get(target) or layouts.get(target)
            lay = prev if prev is not None and prev.same(names, labels) else Layout(
                target, names, labels, prev, now=now
            )
            if lay.unresolved:
                # Series are created for values only: one that has only ever been NaN has none.
                need = lay.ids == UNRESOLVED
                if nan:
                    need &= ~np.isnan(values)
                if need.any():
                    entry = stale.get(id(lay))
                    if entry is None:
                        stale[id(lay)] = (lay, need)
                    else:
                        entry[1][:] |= need  # the same layout in an earlier buffered scrape
            current[target] = lay
            work.append((lay, ts_ms, values, nan))
        if not work:
            return 0
        if stale:
            self._resolve_layouts(list(stale.values()))
        unowned = {id(lay): lay for lay, _, _, _ in work if lay.owners is None}
        if unowned:
            self._resolve_owners(list(unowned.values()))
        layouts.update(current)
        refusals = self._refusals(work)
        if not sum(len(values) - nan for _, _, values, nan in work):
            return 0
        # 2. Per target, three columns: each series' samples together, in time order, encoded
        # as chunks (one per series, two if its samples straddle a full hour, see
        # ``store.chunks``) and packed into a ``sample_log`` row per name, all with this flush's new
        # write sequence number; the rows go in per group of targets, so that a flush never
        # holds all of its encoded samples at once (a 1,000-target flush built whole was a
        # 70 MB RSS spike every flush interval).  Readers take the log's chunks where they
        # overlap stored samples (the last write); maintenance moves them into
        # ``sample_chunks`` (``store.samplelog``).  A retried flush whose first commit did
        # succeed after all stores the same samples twice; the merge folds them together.
        written = 0
        lowest: int | None = None
        highest = 0
        with transaction(self._engine, write=True) as conn:
            seq = next_seq(conn)
            for group in target_groups(work, FLUSH_GROUP_SAMPLES):
                rows: list[samplelog.LogRow] = []
                for columns in self._columns(group):
                    if not len(columns.ids):
                        continue
                    rows += samplelog.log_rows(seq, columns)
                    written += len(columns.ids)
                    first = int(columns.ts.min())
                    lowest = first if lowest is None else min(lowest, first)
                    highest = max(highest, int(columns.ts.max()))
                samplelog.insert(conn, rows)
            # Samples older than the rollup watermark (a buffer flushed after an outage, or a
            # lagging second writer) move it back in this same transaction, so they are rolled
            # up before raw retention may delete them.
            if lowest is not None:
                samplelog.record_flush(conn, seq, lowest, highest)
                self._reader.watermarks_moved()
                maintenance.rewind_watermarks(conn, lowest)
        if refusals and self._on_refused is not None:
            for target, (series, samples) in refusals.items():
                self._on_refused(target, series, samples)
        return written

    @staticmethod
    def _refusals(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
    ) -> dict[str, tuple[int, int]]:
        """Per target whose series limit refused series: (series refused, samples dropped)."""
        out: dict[str, tuple[int, int]] = {}
        for lay, _, values, nan in work:
            if not lay.refused:
                continue
            refused = lay.ids == REFUSED
            if nan:
                refused &= ~np.isnan(values)
            series, samples = out.get(lay.target, (0, 0))
            out[lay.target] = (max(series, lay.refused), samples + int(refused.sum()))
        return out

    @staticmethod
    def _columns(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
    ) -> list[SampleColumns]:
        """``work``'s samples as columns without NaN (see ``sample_columns``): all at once, or,
        when that needs a sort, one target at a time (only those targets take the sort)."""
        columns = sample_columns([(lay, ts_ms, values) for lay, ts_ms, values, _ in work])
        if columns is not None:
            return [SampleWriter._dropped(work, columns)]
        out = []
        for target_work in target_groups(work, 1):  # one target per group
            columns = sample_columns(
                [(lay, ts_ms, values) for lay, ts_ms, values, _ in target_work]
            )
            out.append(
                SampleWriter._sorted_columns(target_work) if columns is None
                else SampleWriter._dropped(target_work, columns)
            )
        return out

    @staticmethod
    def _dropped(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
        columns: SampleColumns,
    ) -> SampleColumns:
        """The columns without NaN samples and samples of refused series (no id)."""
        keep = SampleWriter._kept(work, columns.ids, columns.values)
        return columns if keep is None else columns.take(keep)

    @staticmethod
    def _kept(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
        sids: np.ndarray[Any, np.dtype[np.int64]],
        vals: np.ndarray[Any, np.dtype[np.float64]],
    ) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
        """Which samples are neither NaN nor of a refused series (None: all)."""
        nan = any(w[3] for w in work)
        refused = any(w[0].refused for w in work)
        if not (nan or refused):
            return None
        keep = ~np.isnan(vals) if nan else sids >= 0
        if nan and refused:
            keep &= sids >= 0
        return keep

    @staticmethod
    def _sorted_columns(
        work: list[tuple[Layout, int, np.ndarray[Any, np.dtype[np.float64]], int]],
    ) -> SampleColumns:
        """The general case of ``sample_columns``, for one target: every sample, sorted by
        ``(id, ts)``, each named by a lookup of its id."""
        sids = np.concatenate([lay.ids for lay, _, _, _ in work])
        tss = np.repeat(
            np.fromiter((w[1] for w in work), np.int64, len(work)),
            [len(lay.ids) for lay, _, _, _ in work],
        )
        vals = np.concatenate([w[2] for w in work])
        keep = SampleWriter._kept(work, sids, vals)
        if keep is not None:
            sids, tss, vals = sids[keep], tss[keep], vals[keep]
        # Key order; of two samples with the same key (a series listed twice, or two label
        # orders of one series) the one written last is kept.
        kept = sort_keep_last(sids, tss, vals)
        lays = list({id(w[0]): w[0] for w in work}.values())
        return samplelog.named_columns(
            lays[0].target, (kept.ids, kept.ts, kept.values), name_index(lays)
        )

    def _resolve_layouts(
        self, stale: list[tuple[Layout, np.ndarray[Any, np.dtype[np.bool_]]]]
    ) -> None:
        """Give ``stale`` layouts the ids of their new series, a group of layouts at a time.

        A fleet's first flush (or the refresh after retention) creates hundreds of thousands
        of series; resolving them a group at a time, each group's keys and ids dropped before
        the next, bounds what is held in memory at once (measured: it was the collector's peak
        RSS at 1,000 targets).
        """
        group: list[Layout] = []
        keys: set[SeriesKeyTuple] = set()
        for lay, need in stale:
            group.append(lay)
            keys.update(lay.keys_at(np.flatnonzero(need).tolist()))
            if len(keys) >= RESOLVE_SLICE:
                resolved = self._resolve(keys)
                for member in group:
                    member.fill(resolved)
                group, keys = [], set()
        if group:
            resolved = self._resolve(keys)
            for member in group:
                member.fill(resolved)

    def _resolve(self, keys: set[SeriesKeyTuple]) -> dict[SeriesKeyTuple, int]:
        # In slices, each its own transaction (keys sorted within each, so two writers lock
        # index entries in the same order and cannot deadlock).
        ordered = sorted(keys)
        resolved: dict[SeriesKeyTuple, int] = {}
        for lo in range(0, len(ordered), RESOLVE_SLICE):
            with transaction(self._engine, write=True) as conn:
                allowed, refused = within_series_limits(
                    conn, ordered[lo : lo + RESOLVE_SLICE], limits=self._series_limits
                )
                ids = resolve_series(conn, allowed, now_ms=round(time.time() * 1000))
            self._reader.series_created()
            resolved.update(ids)  # only once committed
            resolved.update(dict.fromkeys(refused, REFUSED))
        return resolved

    def _resolve_owners(self, lays: list[Layout]) -> None:
        """Give ``lays`` the log owners of their names (``sample_log_owners``): a layout that
        replaces its target's previous one takes that one's by name; the rest (new names, a
        target's first or expired layout) are looked up, or created, and committed before
        any row refers to them.  Set only once all are known: a failed lookup leaves the
        layouts to try again at the next flush."""
        found: list[tuple[Layout, list[str], npt.NDArray[np.int64]]] = []
        keys: set[tuple[str, str]] = set()
        for lay in lays:
            _, names = lay.name_codes()
            prev = self._layouts.get(lay.target)
            known: dict[str, int] = {}
            if prev is not None and prev.owners is not None:
                known = dict(zip(prev.name_codes()[1], prev.owners.tolist(), strict=True))
            owners = np.fromiter((known.get(name, UNRESOLVED) for name in names), np.int64,
                                 len(names))
            keys.update((lay.target, names[i])
                        for i in np.flatnonzero(owners == UNRESOLVED).tolist())
            found.append((lay, names, owners))
        resolved: dict[tuple[str, str], int] = {}
        ordered = sorted(keys)
        now_ms = round(time.time() * 1000)
        for lo in range(0, len(ordered), RESOLVE_SLICE):
            with transaction(self._engine, write=True) as conn:
                resolved.update(resolve_owners(conn, ordered[lo : lo + RESOLVE_SLICE],
                                               now_ms=now_ms))
        for lay, names, owners in found:
            holes = np.flatnonzero(owners == UNRESOLVED)
            owners[holes] = [resolved[(lay.target, names[i])] for i in holes.tolist()]
            lay.owners = owners

    def _expire_layouts(self, now: float) -> None:
        """Forget layouts resolved more than ``ttl_s`` ago, a few per flush.

        Their next scrape resolves its series again, which marks them in use for retention.
        A budget of keys per flush spreads the re-resolution of a large fleet over many
        flushes instead of one long burst every TTL.
        """
        budget = RESOLVE_SLICE
        expired = [(lay.born, target, len(lay.ids)) for target, lay in self._layouts.items()
                   if now - lay.born > self.ttl_s]
        for _, target, size in sorted(expired):
            if budget <= 0:
                break
            del self._layouts[target]
            budget -= size

