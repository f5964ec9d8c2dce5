"""The flushes' append-only log of raw samples (``sample_log``), and its move into chunks.

Why a log.  A flush holds one scrape interval of every series, so at a fleet's 15 s interval a
chunk per series per flush is a chunk per *sample*, and each lands at its own place in the
``(series_id, start_ms, seq)`` B-tree: SQLite rewrote about 1 KB of pages per 16-byte sample
(measured at 1,000 targets: 39 MB/s written for 37.7k samples/s) and PostgreSQL's index had the
same pattern.  So a flush writes instead one row per target, holding that flush's chunks of the
target's series packed together, appended in write order (the key leads with ``seq``); each
hour of the log, 5 minutes after it ends, :func:`transpose` moves into ``sample_chunks`` at
once, compressed, one chunk per series and hour.  Rows are per target, metric name and hour: a
reader (an alert rule, a dashboard panel) asks for a few names, and decodes only their rows;
it finds the flushes overlapping its window in ``sample_log_flushes``.

Row format.  ``data`` is little-endian int64 words: ``k`` (chunks), then the ``k`` series ids,
then the ``k`` sample counts, then the chunks' data one after the other, each in the
``store.chunks`` encoding (``n`` timestamps, then ``n`` float64 values).  A row of one scrape
(each series one sample, all at one instant: a fleet's steady state) is written compact:
``-k``, the timestamp, the ``k`` ids, the ``k`` values (16 bytes a sample instead of 32);
and where the ids are a few runs of consecutive ids (a target's series are created together),
as ``-(2**40 + k)``, the timestamp, the number of runs, each run's first id and length, then
the ``k`` values (a fleet-shaped target of 566 series: 17.4 -> 11.1 bytes a sample).  A
compact row whose values are all whole numbers that fit an int32 (counters, histogram buckets,
counts; not -0.0) adds ``2**41`` to that ``k`` and stores them as little-endian int32s, two a
word, the last word's upper half 0 when ``k`` is odd (schema 9): at 566 series, three in four
values are, and a flush wrote 41.6 -> 35.0 bytes a sample (``bench.writes``, 100 targets).
``start_ms`` and ``end_ms`` are the row's oldest and newest sample, ``n`` its samples;
``owner`` (``sample_log_owners``) the target and name of all of its series.

The last-write rule still holds.  A log row carries its flush's ``seq``, so readers simply treat
its chunks as chunks (:func:`read`).  :func:`transpose` moves *every* log row that ends before
its cut (whole hours) of the flushes it listed under the rollup lock held exclusively, which a
flush holds in shared mode from taking its ``seq`` to committing (SQLite serialises writers
anyway): so the rows it moves are all the rows of those series and hours whose ``seq`` had
been taken, any row written later has a higher ``seq``, chunks already stored have lower
ones, and the rows it leaves hold later hours only (no (series, ts) of a moved sample).  It
writes the chunks a group of targets per transaction and deletes the moved rows last, all at
once (on SQLite by keeping a copy of the rest: deleting rows rewrites their pages, dropping a
table does not); meanwhile a reader finds those samples in both places and keeps one.
The moved samples are merged by the last-write rule and stored with the highest ``seq`` moved,
which therefore orders them exactly as the rows they replace were ordered against every other
chunk and row of their series (a series belongs to one target and name: one log row's).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import pairwise, repeat
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    MetaData,
    Select,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    func,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.schema import DropTable

from tritonwatch.schemas import tables as t
from tritonwatch.store.chunks import (
    I64_MAX,
    MAX_SAMPLES,
    WINDOW_MS,
    compress,
    encode,
    run_bounds,
    sort_keep_last,
    window_start,
)
from tritonwatch.store.engine import fetch_tuples, transaction
from tritonwatch.store.id_lists import IDS, ids_param, ids_value, in_ids, prepared
from tritonwatch.store.write import (
    PG_COPY_HEADER,
    PG_COPY_TRAILER,
    PG_LOCK_ROLLUP,
    NameIndex,
    SampleColumns,
    get_meta,
    insert_chunks,
    set_meta,
)

log = logging.getLogger(__name__)

#: Samples moved into chunks per transaction: whole targets up to this many samples, a larger
#: target's whole names (one name larger than this goes alone, a range of its series at a
#: time: :func:`_series_ranges`).  About 200 bytes of transient memory each (measured at
#: 1,000 targets: 1 << 18 of them raised the collector's peak RSS by 50 MB).
#:
#: Why a target is cut between its names as soon as it is larger, and a group takes only the
#: units that fit.  A group over the budget goes through :func:`_series_ranges`, which decodes
#: all of its rows once for the ranges and once more for each range: an hour of a Triton of
#: 566 series at 15 s (135,840 samples) was decoded three times, as was nearly every group of
#: several targets (the last target added took it just past the budget).  The same
#: chunks either way; measured on 20 such targets (``bench.move --targets 20``, twice each,
#: side by side): 7.80, 8.83 -> 7.51, 7.28 CPU s, and a traced peak of 9.2 -> 7.7 MiB.  Moved
#: whole, the NVML host's target (the GPU series joined across a fleet: 6.8 M samples an hour
#: at 1,000 targets) took the collector from 350 to 618 MiB every hour.  Half the earlier
#: budget (1 << 16), measured the same way: a traced peak of 7.7 -> 4.2 MiB, CPU 5.10, 4.69
#: -> 5.00, 4.93 s, the same chunks.
TRANSPOSE_SAMPLES = 1 << 15
#: Samples' worth of log rows the move decodes at a time: the rows' index is the 200 bytes a
#: sample, and the decoded samples (32 bytes each) are what is kept of them.
DECODE_SAMPLES = 1 << 14

#: The log is moved an hour at a time (``store.chunks.WINDOW_MS``), this long after the hour
#: ends (late samples of the hour still reach it first; compaction, which merges a window's
#: chunks, waits longer: ``maintenance.COMPACT_AFTER_MS``).  Moved every 5 minutes, the log was
#: written to the chunks' B-tree as a raw chunk per series each time, over pages that compaction
#: then rewrote compressed: 400 of the 620 bytes written per sample ingested (at 100 targets).
MOVE_AFTER_MS = 300_000

_LE_I64 = np.dtype("<i8")
#: Added to ``k`` in the header word of a compact row that lists its ids as runs (the module
#: docstring); far above any real ``k``, which a row's length bounds.
_RANGED = 1 << 40
#: Added to ``k`` (besides :data:`_RANGED`, if the row lists runs) in the header word of a
#: compact row whose values are int32s (the module docstring).
_PACKED = 1 << 41
#: The whole numbers a packed row holds.
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_LE_F64 = np.dtype("<f8")
_LE_I32 = np.dtype("<i4")


#: One ``sample_log`` row, in the table's column order: ``(owner, seq, start_ms, end_ms, n,
#: data)``.
LogRow = tuple[int, int, int, int, int, bytes]


def named_columns(
    target: str,
    columns: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]],
    names: NameIndex,
) -> SampleColumns:
    """One target's ``(ids, ts, values)``, each series' samples together and in time order,
    with each sample's log row (its name's owner) found by its id in ``names``
    (``write.Layout.name_index``, which must hold every id)."""
    sids, ts, values = columns
    index_ids, index_codes, index_owners = names
    rows = np.empty(0, np.int64)
    if len(sids):
        pos = np.minimum(np.searchsorted(index_ids, sids), len(index_ids) - 1)
        if not len(index_ids) or not (index_ids[pos] == sids).all():
            raise ValueError(f"sample_log rows of {target!r}: a series id has no name")
        rows = index_codes[pos]
    return SampleColumns(sids, ts, values, rows, index_owners)


def log_rows(seq: int, columns: SampleColumns) -> list[LogRow]:
    """The ``sample_log`` rows of ``columns`` (``write.sample_columns``) written by flush
    ``seq``: one per owner (target and name) of ``columns.owners`` that has samples.

    Built column-wise, a flush's group of targets at once: the rows' headers in one array,
    each row's bytes one slice of it and one of the chunks' data (a fleet's flush is tens of
    thousands of rows of a few samples each).
    """
    hours = columns.ts // WINDOW_MS
    if len(hours) and hours.min() != hours.max():
        # A row per hour (the key's ``start_ms`` tells them apart): the log moves an hour at a
        # time, and a row holding samples of a later hour would hold its earlier ones back.
        return [row for hour in np.unique(hours).tolist()
                for row in log_rows(seq, columns.take(hours == hour))]
    columns = _by_row(columns)
    compact = _compact_rows(seq, columns)
    if compact is not None:
        return compact
    sids, ts, values, row_of, owners = columns
    chunks = encode(sids, ts, values)
    codes = row_of[chunks.offsets // 16]
    starts, ends = run_bounds(codes)
    if not len(starts):
        return []
    # Row r holds chunks starts[r] to ends[r]: its data is ``k``, the ids, the counts (its
    # header, at head_at[r] in ``head``), then those chunks' data, one range of chunks.buf.
    k = ends - starts
    head_len = 1 + 2 * k
    head_end = np.cumsum(head_len)
    head_at = head_end - head_len
    head = np.empty(int(head_end[-1]), _LE_I64)
    head[head_at] = k
    row = np.repeat(np.arange(len(k), dtype=np.int64), k)
    at = head_at[row] + 1 + np.arange(len(chunks), dtype=np.int64) - starts[row]
    head[at] = chunks.ids
    head[at + k[row]] = chunks.n
    head_bytes, buf = head.tobytes(), chunks.buf
    last = ends - 1
    datas = [
        head_bytes[h0:h1] + buf[d0:d1]
        for h0, h1, d0, d1 in zip(
            (8 * head_at).tolist(), (8 * head_end).tolist(), chunks.offsets[starts].tolist(),
            (chunks.offsets[last] + chunks.sizes[last]).tolist(), strict=True,
        )
    ]
    return list(zip(
        owners[codes[starts]].tolist(), repeat(seq),
        np.minimum.reduceat(chunks.start_ms, starts).tolist(),
        np.maximum.reduceat(chunks.end_ms, starts).tolist(),
        np.add.reduceat(chunks.n, starts).tolist(), datas,
    ))


def _compact_rows(seq: int, columns: SampleColumns) -> list[LogRow] | None:
    """The rows of ``columns`` (grouped by row: :func:`_by_row`) in the compact layout (module
    docstring), or None unless each row is one scrape: every series one sample, a row's
    samples at one instant."""
    sids, ts, values, row_of, owners = columns
    if not len(sids) or (sids[1:] == sids[:-1]).any():
        return None
    starts, ends = run_bounds(row_of)
    k = ends - starts
    row = np.repeat(np.arange(len(k), dtype=np.int64), k)
    if (ts != ts[starts][row]).any():
        return None
    # Runs of consecutive ids (a target's series are created together, so a name's ids are
    # mostly one run or a few): a row whose runs take fewer words than its ids lists runs.
    is_start = np.ones(len(sids), bool)
    is_start[1:] = sids[1:] != sids[:-1] + 1
    is_start[starts] = True
    run_at = np.flatnonzero(is_start)
    runs = np.bincount(row[run_at], minlength=len(k))
    ranged = 2 * runs + 1 < k
    # Rows whose values all read back exactly as int32s (NaN and the infinities fail the first
    # test, -0.0 the last): half the bytes for their values.
    with np.errstate(invalid="ignore"):  # a signalling NaN's bits raise it (and fail)
        whole = (np.trunc(values) == values) & (values >= _I32_MIN) & (values <= _I32_MAX) & ~(
            (values == 0) & np.signbit(values))
    packed = np.minimum.reduceat(whole.view(np.int8), starts).astype(bool)
    value_words = np.where(packed, (k + 1) // 2, k)
    ids_end = np.where(ranged, 3 + 2 * runs, 2 + k)  # the values' first word, in the row
    size = ids_end + value_words
    row_end = np.cumsum(size)
    row_at = row_end - size
    words = np.empty(int(row_end[-1]), _LE_I64)
    words[row_at] = -(np.where(ranged, _RANGED, 0) + np.where(packed, _PACKED, 0) + k)
    words[row_at + 1] = ts[starts]
    pos = np.arange(len(sids), dtype=np.int64) - starts[row]
    listed = ~ranged[row]
    words[(row_at[row] + 2 + pos)[listed]] = sids[listed]
    as_words = ~packed[row]
    words[(row_at[row] + ids_end[row] + pos)[as_words]] = (
        np.ascontiguousarray(values[as_words], _LE_F64).view(_LE_I64))
    if packed.any():
        halves = words.view(_LE_I32)
        odd = packed & (k % 2 == 1)
        halves[2 * (row_at[odd] + size[odd]) - 1] = 0  # the unused upper half of the last word
        on = ~as_words
        halves[(2 * (row_at[row] + ids_end[row]) + pos)[on]] = values[on].astype(np.int32)
    if ranged.any():
        words[row_at[ranged] + 2] = runs[ranged]
        run_row = row[run_at]
        run_end = np.append(run_at[1:], len(sids))
        first_run = np.cumsum(runs) - runs
        slot = row_at[run_row] + 3 + 2 * (np.arange(len(run_at)) - first_run[run_row])
        on = ranged[run_row]
        words[slot[on]] = sids[run_at[on]]
        words[slot[on] + 1] = (run_end - run_at)[on]
    buf = words.tobytes()
    datas = [buf[a:b] for a, b in zip((8 * row_at).tolist(), (8 * row_end).tolist(),
                                      strict=True)]
    stamps = ts[starts].tolist()
    return list(zip(owners[row_of[starts]].tolist(), repeat(seq), stamps, stamps, k.tolist(),
                    datas))


def _by_row(columns: SampleColumns) -> SampleColumns:
    """``columns`` with each row's samples together: as they are when they already are, else
    sorted by row, stably, so that each series' samples stay together and in time order (a
    row's series may lie apart: columns in id order, a name's series created at two times)."""
    starts, _ = run_bounds(columns.rows)
    seen = np.zeros(len(columns.owners), bool)
    seen[columns.rows[starts]] = True
    if int(np.count_nonzero(seen)) == len(starts):  # each row one run
        return columns
    return columns.take(np.argsort(columns.rows, kind="stable"))


def insert(conn: Connection, rows: Sequence[LogRow]) -> None:
    """Append ``rows`` (from :func:`target_rows`) to the log.

    On the driver's connection, past SQLAlchemy's per-row parameter processing (measured: a
    third of a fleet's flush).  SQLite: one ``executemany``.  PostgreSQL: one binary COPY
    written at once, the data as it is (bound as a parameter, a bytea travels hex-encoded:
    twice the bytes, and measurable CPU on both sides at 1 s scrapes).
    """
    if not rows:
        return
    raw = conn.connection.driver_connection
    assert raw is not None
    if conn.dialect.name != "postgresql":
        raw.executemany(
            "INSERT INTO sample_log (owner, seq, start_ms, end_ms, n, data) "
            "VALUES (?, ?, ?, ?, ?, ?)", rows,
        )
        return
    with raw.cursor() as cur, cur.copy(
        "COPY sample_log (owner, seq, start_ms, end_ms, n, data) FROM STDIN "
        "(FORMAT BINARY)"
    ) as cp:
        cp.write(copy_log_rows(rows))


def copy_log_rows(rows: Iterable[LogRow]) -> bytes:
    """The binary COPY stream of ``rows`` (header, rows, trailer)."""
    parts = [PG_COPY_HEADER]
    fields = _PG_LOG_FIELDS.pack
    for owner, seq, start_ms, end_ms, n, data in rows:
        parts += (fields(6, 8, owner, 8, seq, 8, start_ms, 8, end_ms, 4, n, len(data)), data)
    parts.append(PG_COPY_TRAILER)
    return b"".join(parts)


# A binary COPY row of the log: its field count, then owner, seq, start_ms, end_ms (int8), n
# (int4) and the length of data, each after its own length (then data itself).
_PG_LOG_FIELDS = struct.Struct(">hiqiqiqiqiii")


class _Rows:
    """Log rows decoded together, as columns of their chunks (no per-row Python work: a read
    of one name across a fleet is tens of thousands of small rows).  Rows of both layouts
    (module docstring) may be mixed."""

    __slots__ = ("at", "ids", "ns", "packed", "seqs", "vat", "words")

    def __init__(self, seqs: Sequence[int], datas: Sequence[bytes]) -> None:
        lens = np.fromiter(map(len, datas), np.int64, len(datas))
        if (lens % 8).any() or (lens < 8).any():
            raise ValueError("sample_log row data is not a whole number of int64 words")
        words = np.frombuffer(b"".join(datas), _LE_I64)
        size = lens // 8
        row_at = np.cumsum(size) - size
        head = words[row_at].astype(np.int64)
        compact = head < 0
        # A compact row's header is -(flags + k): at most _PACKED + _RANGED + k.  Anything
        # beyond that (-2**63 included, whose negation wraps) is refused below as a huge k.
        flagged = compact & (head > -(2 * _PACKED))
        flags = np.where(flagged, -head, 0)
        packed = flags >= _PACKED
        flags -= np.where(packed, _PACKED, 0)
        ranged = flags >= _RANGED
        k = np.where(compact, np.where(flagged, flags - np.where(ranged, _RANGED, 0), -1), head)
        value_words = np.where(packed, (k + 1) // 2, k)
        # Compared before any arithmetic on them: a damaged count must not wrap around.  A
        # chunk takes at least 4 words (id, count, a sample's two), a compact one 2 (a value
        # per series beside 3 header words and two per run), a packed one at least 1.5.
        most = np.where(compact, np.where(packed, 2 * size, size), (size - 1) // 4)
        if (k < 1).any() or (k > most).any():
            raise ValueError("sample_log row header names more chunks than the row holds")
        runs = np.zeros(len(datas), np.int64)
        runs[ranged] = words[row_at[ranged] + 2]
        if ((runs < 0) | (runs > size)).any() or (ranged & (
            (runs < 1) | (3 + 2 * runs + value_words != size)
        )).any() or (compact & ~ranged & (2 + k + value_words != size)).any():
            raise ValueError("sample_log row does not hold the samples its header counts")
        if packed.any():
            last = words.view(_LE_I32)[2 * (row_at + size) - 1]
            if (packed & (k % 2 == 1) & (last != 0)).any():
                raise ValueError("sample_log row does not hold the samples its header counts")
        row = np.repeat(np.arange(len(datas), dtype=np.int64), k)
        first = np.cumsum(k) - k
        pos = np.arange(int(k.sum()), dtype=np.int64) - first[row]
        one = compact[row]
        id_at = row_at[row] + 1 + pos + one
        ns = np.where(one, 1, words[np.where(one, 0, id_at + k[row])].astype(np.int64))
        if ((ns < 1) | (ns > size[row] // 2)).any():
            raise ValueError("sample_log row counts an empty or oversized chunk")
        if (~compact & (1 + 2 * k + 2 * np.add.reduceat(ns, first) != size)).any():
            raise ValueError("sample_log row does not hold the samples its header counts")
        before = np.cumsum(ns) - ns
        self.words = words
        self.ids = words[np.where(ranged[row], 0, id_at)].astype(np.int64)
        self.ns = ns
        #: Word index of each chunk's first timestamp, and of its first value; for a chunk of
        #: a packed row (:attr:`packed`), the int32 index of its value.
        at = (row_at + 1 + 2 * k)[row] + 2 * (before - before[first][row])
        self.at = np.where(one, row_at[row] + 1, at)
        self.vat = np.where(one, id_at + k[row], at + ns)
        self.packed = packed[row]
        self.seqs = np.asarray(seqs, np.int64)[row]
        if ranged.any():
            self._runs(words, row_at, ranged, runs, k, row, pos)
        if packed.any():  # the values start on a word: value i is int32 2 * start + i
            on = self.packed
            self.vat[on] = 2 * self.vat[on] - pos[on]

    def _runs(self, words: npt.NDArray[np.int64], row_at: npt.NDArray[np.int64],
              ranged: npt.NDArray[np.bool_], runs: npt.NDArray[np.int64],
              k: npt.NDArray[np.int64], row: npt.NDArray[np.int64],
              pos: npt.NDArray[np.int64]) -> None:
        # The ids and value positions of the rows that list their ids as runs.
        which = np.flatnonzero(ranged)
        n_runs = runs[which]
        run_row = np.repeat(which, n_runs)
        slot = row_at[run_row] + 3 + 2 * (
            np.arange(int(n_runs.sum()), dtype=np.int64) - np.repeat(np.cumsum(n_runs) - n_runs,
                                                                      n_runs))
        first_id, length = words[slot].astype(np.int64), words[slot + 1].astype(np.int64)
        if (length < 1).any() or (first_id < 0).any() or (first_id > I64_MAX - length).any():
            raise ValueError("sample_log row lists an empty or overflowing run of ids")
        if (np.bincount(run_row, weights=length, minlength=len(k))[which] != k[which]).any():
            raise ValueError("sample_log row's runs of ids do not add up to its series")
        sel = ranged[row]
        # The ranged rows' series in order are their runs' ids in order.
        run_first = np.cumsum(length) - length
        ids = np.repeat(first_id - run_first, length) + np.arange(int(length.sum()),
                                                                  dtype=np.int64)
        self.ids[sel] = ids
        self.vat[sel] = (row_at + 3 + 2 * runs)[row[sel]] + pos[sel]

    def samples(
        self, keep: npt.NDArray[np.int64] | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64],
               npt.NDArray[np.int64]]:
        """``(ids, ts, values, seqs)`` of the samples of the chunks ``keep`` (all by default),
        grouped by chunk."""
        at, vat, ns, ids, seqs = self.at, self.vat, self.ns, self.ids, self.seqs
        packed = self.packed
        if keep is not None:
            at, vat, ns, ids, seqs = at[keep], vat[keep], ns[keep], ids[keep], seqs[keep]
            packed = packed[keep]
        total = int(ns.sum())
        offset = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(ns) - ns, ns)
        ts = self.words[np.repeat(at, ns) + offset].astype(np.int64)
        if not packed.any():
            values = self.words[np.repeat(vat, ns) + offset].view(_LE_F64).astype(np.float64)
        else:  # a packed row's chunks are one sample each (compact rows only)
            values = np.empty(total, np.float64)
            wide = np.repeat(~packed, ns)
            values[wide] = self.words[(np.repeat(vat, ns) + offset)[wide]].view(_LE_F64)
            values[~wide] = self.words.view(_LE_I32)[vat[packed]]
        return np.repeat(ids, ns), ts, values, np.repeat(seqs, ns)


Columns = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64],
                npt.NDArray[np.int64]]


def record_flush(conn: Connection, seq: int, start_ms: int, end_ms: int) -> None:
    """List flush ``seq``, whose log rows hold samples from ``start_ms`` to ``end_ms``, in
    ``sample_log_flushes`` (in the flush's transaction, after its rows)."""
    conn.execute(t.sample_log_flushes.insert().values(seq=seq, start_ms=start_ms, end_ms=end_ms))


def _owned_rows(dialect: str, *cols: Any) -> Select[Any]:
    """``SELECT cols`` of the log rows of the owners (targets and names) of the series bound
    as ``ids`` that overlap ``[lo_ms, hi_ms]`` (the parameters: :func:`_owned_params`).

    The flushes overlapping the window first (``sample_log_flushes``: a few hundred rows at
    most), then the rows by their key: ``(seq, owner)`` seeks, as many as those flushes times
    the owners, whatever else the log holds.  All as subqueries of one statement, built once
    per backend (``id_lists.prepared``): a list of seqs bound as parameters was compiled anew
    each time, some 5 ms a read."""
    c, s, f, o = t.sample_log.c, t.series.c, t.sample_log_flushes.c, t.sample_log_owners.c
    lo, hi = bindparam("lo_ms", type_=BigInteger), bindparam("hi_ms", type_=BigInteger)
    seqs = select(f.seq).where(f.end_ms >= lo, f.start_ms <= hi)
    named = select(s.target, s.name).where(ids_param(dialect, s.id)).distinct()
    owners = select(o.id).where(tuple_(o.target, o.name).in_(named))
    if dialect == "postgresql":
        return select(*cols).where(
            c.seq == any_(_array(seqs)), c.owner == any_(_array(owners)),
            c.end_ms >= lo, c.start_ms <= hi,
        )
    return select(*cols).where(
        c.seq.in_(seqs), c.owner.in_(owners), c.end_ms >= lo, c.start_ms <= hi,
    )


def _array(query: Select[Any]) -> Any:
    """``query``'s one column as a PostgreSQL array: a scalar subquery (run once, an initplan),
    so that ``column = ANY`` of it is an index condition, not a semi-join."""
    (col,) = query.selected_columns
    return cast(query.with_only_columns(func.array_agg(col)).scalar_subquery(),
                ARRAY(BigInteger))


def _bigints(values: list[int]) -> Any:
    """``values`` bound as one PostgreSQL ``bigint[]``."""
    return bindparam(None, values, type_=ARRAY(BigInteger))


def _seq_in(flushes: Select[Any] | list[int]) -> Any:
    """``sample_log.seq`` among ``flushes``: their query (SQLite), or their seqs listed
    (PostgreSQL, :func:`_listed`)."""
    if isinstance(flushes, list):
        return t.sample_log.c.seq == any_(_bigints(flushes))
    return t.sample_log.c.seq.in_(flushes)


def _listed(conn: Connection, seqs: Select[Any]) -> Select[Any] | list[int]:
    """What a move's statements name its flushes by: on SQLite their query, on PostgreSQL
    their seqs, listed once under the rollup lock and bound as one array (:func:`_group_rows`
    reads a group's rows a flush at a time by key).  As ``seq IN (query)``, PostgreSQL's
    planner hashed every row of the hour for each group (36 ms a group at 100 targets, the
    scan growing with the fleet, and the groups with it)."""
    if conn.dialect.name == "postgresql":
        return [int(seq) for seq in conn.execute(seqs).scalars()]
    return seqs


def _log_rows(dialect: str) -> Select[Any]:
    return _owned_rows(dialect, t.sample_log.c.seq, t.sample_log.c.data)


def _log_count(dialect: str) -> Select[Any]:
    return _owned_rows(dialect, func.sum(t.sample_log.c.n))


def _owned_params(conn: Connection, ids: Sequence[int], lo_ms: int, hi_ms: int
                  ) -> dict[str, Any]:
    return {IDS: ids_value(conn, ids), "lo_ms": lo_ms, "hi_ms": hi_ms}


def read(conn: Connection, ids: Sequence[int], *, lo_ms: int, hi_ms: int) -> Columns:
    """The log's samples of the series ``ids`` in the chunks that overlap ``[lo_ms, hi_ms]``:
    ``(ids, ts, values, seqs)``, each sample with the ``seq`` of the flush that wrote it.
    Rows are found by the owners (targets and names) of ``ids``."""
    rows: Sequence[Any] = []
    if ids:
        rows = fetch_tuples(conn, prepared(_log_rows, conn.dialect.name),
                            _owned_params(conn, ids, lo_ms, hi_ms))
    return select_samples(
        [r[0] for r in rows], [bytes(r[1]) for r in rows], np.asarray(ids, np.int64),
        lo_ms=lo_ms, hi_ms=hi_ms,
    )


def count_read(conn: Connection, ids: Sequence[int], *, lo_ms: int, hi_ms: int) -> int:
    """Samples in the log rows :func:`read` would decode for these arguments (whole rows:
    every series of the targets and names of ``ids``)."""
    if not ids:
        return 0
    total = conn.execute(prepared(_log_count, conn.dialect.name),
                         _owned_params(conn, ids, lo_ms, hi_ms)).scalar_one_or_none()
    return int(total or 0)


def select_samples(
    seqs: Sequence[int], datas: Sequence[bytes], ids: npt.NDArray[np.int64], *, lo_ms: int,
    hi_ms: int,
) -> Columns:
    """The samples of log rows (``seqs[i]``, ``datas[i]``) in their chunks of the series
    ``ids`` that overlap ``[lo_ms, hi_ms]`` (samples outside it are left in).

    The rows are decoded :data:`READ_SLICE_WORDS` of their words at a time: a row holds every
    series of its target and name, and its index (:class:`_Rows`) some 200 bytes a sample
    while it is built, however few of them the read keeps (the alert rules' reads of a
    1,000-target fleet's last minutes were a step of +15 MiB in the collector's RSS)."""
    parts: list[Columns] = []
    for lo, hi in _slices([len(data) >> 3 for data in datas], READ_SLICE_WORDS):
        r = _Rows(seqs[lo:hi], datas[lo:hi])
        starts = r.words[r.at]
        ends = r.words[r.at + r.ns - 1]
        keep = np.flatnonzero(np.isin(r.ids, ids) & (starts <= hi_ms) & (ends >= lo_ms))
        parts.append(r.samples(keep))
    if not parts:
        empty = np.empty(0, np.int64)
        return empty, empty, np.empty(0, np.float64), empty
    return _joined(parts)


#: Words (8 bytes) of log rows a read decodes at a time (:func:`select_samples`): the index
#: of a slice takes about 200 bytes a sample while it is built.  Traced at 300 targets
#: (``bench.alerts_eval``), the failure-ratio rule's read of a batch of 250 series' hour of
#: log peaked 6.3 MiB above its start with slices of 1 << 16 words and 4.1 with 1 << 14, at
#: about the same CPU (within the run-to-run noise of the evaluations).
READ_SLICE_WORDS = 1 << 14


def count(conn: Connection) -> int:
    """Samples held in the log."""
    return int(conn.execute(select(func.sum(t.sample_log.c.n))).scalar_one_or_none() or 0)


def move_before(now_ms: int) -> int:
    """Where maintenance at ``now_ms`` cuts the log: the start of the hour that ended
    :data:`MOVE_AFTER_MS` ago."""
    return window_start(now_ms - MOVE_AFTER_MS)


def hours_through(ms: int) -> int:
    """The end of the hour holding ``ms``: where retention, whose raw cutoff is ``ms``, cuts
    the log (whole hours, as maintenance: the rows it leaves then hold later hours only)."""
    return window_start(ms) + WINDOW_MS


def transpose(
    engine: Engine, *, gate: AbstractContextManager[Any], before_ms: int | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Move the log's rows that end before ``before_ms`` (maintenance: :func:`move_before`;
    retention: :func:`hours_through` its raw cutoff; without it: every row) into
    ``sample_chunks``, compressed, a group of targets (or of a large target's names) at a
    time; returns samples moved.

    What moves is every row of those hours: a flush writes a row per hour it has samples of
    (:func:`log_rows`), so every sample of a (series, ts) moves at once and the last-write
    rule orders the moved chunks as it ordered their rows (the module docstring).  The flushes
    are listed once, under the rollup lock (every flush that has taken its ``seq`` has
    committed); then each transaction writes the chunks of up to :data:`TRANSPOSE_SAMPLES`
    samples' worth of whole targets, or of a large target's names (:func:`_groups`), and a
    last one deletes all the rows moved at once.

    Why the rows are deleted last.  Deleted with their group, a target's rows were a few
    scattered in every flush of the hour, so each group's transaction rewrote nearly every
    page of the hour's log (96 of the 233 bytes written per sample ingested, at 100
    targets).  All at once, on SQLite the table is replaced by a copy of the rows left
    (:func:`_keep_only_unmoved`: 96 -> 10 with the chunks' own writes), and on PostgreSQL
    each page is dirtied once.  Until then a reader finds those samples twice, in the
    chunks and in the log, and keeps one (the chunk's ``seq`` is the highest of its rows':
    the last-write rule).  A run that ends early deletes the rows of the groups it finished;
    one that crashed leaves :data:`MOVE_PENDING` set, and the next run, which moves those
    rows again, replaces the chunks it had written.  Flushes appended meanwhile stay for
    the next run, and so do the groups not reached when ``stop`` (asked between
    transactions) answers True.
    """
    c, f = t.sample_log.c, t.sample_log_flushes.c
    cutoff = I64_MAX if before_ms is None else before_ms
    with gate, transaction(engine, write=True) as conn:
        _lock(conn)
        top = conn.execute(select(func.max(f.seq)).where(f.start_ms < cutoff)).scalar()
        if top is None:
            return 0
        # A run that crashed between writing chunks and deleting their rows left this set.
        redo = get_meta(conn, MOVE_PENDING) is not None
        set_meta(conn, MOVE_PENDING, str(cutoff))
        # The flushes listed now: every one committed, and immutable but for moves (flushes
        # appended later take higher seqs).  A subquery (on PostgreSQL, one array), so that
        # each statement below compiles once, whatever the number of flushes.
        seqs = select(f.seq).where(f.start_ms < cutoff, f.seq <= top)
        flushes = _listed(conn, seqs)
    groups = _groups(engine, seqs, cutoff)
    moved = 0
    done: list[_Group] = []
    for group in groups:
        if stop():
            break
        try:
            with gate, transaction(engine, write=True) as conn:
                _lock(conn)
                moved += _move(conn, flushes, cutoff, group, redo=redo)
        except ValueError:
            # A damaged row (a damaged database, or another program's write) can be read by
            # no one: it is dropped, loudly, so that it stops failing every read and every
            # maintenance run of its series; the group's other rows move on.
            with gate, transaction(engine, write=True) as conn:
                _lock(conn)
                _drop_damaged(conn, flushes, cutoff, group)
                moved += _move(conn, flushes, cutoff, group, redo=redo)
        done.append(group)
    with gate, transaction(engine, write=True) as conn:
        _lock(conn)
        if len(done) < len(groups):  # stopped early: the groups done only
            for group in done:
                conn.execute(delete(t.sample_log).where(
                    _seq_in(flushes), c.end_ms < cutoff, group.rows(conn)))
        elif not groups:
            # The listed flushes hold no row before the cut: an earlier run moved them (a
            # listing kept from before its start moved to the cut, see _forget_flushes, or
            # from a version that did not move it).  No table to copy, only listings to
            # correct.
            pass
        elif conn.dialect.name == "sqlite":
            _keep_only_unmoved(conn, seqs, top, cutoff)
        else:
            conn.execute(delete(t.sample_log).where(c.seq.in_(seqs), c.end_ms < cutoff))
        _forget_flushes(conn, top, cutoff, all_moved=len(done) == len(groups))
        conn.execute(delete(t.meta).where(t.meta.c.key == MOVE_PENDING))
    return moved


#: ``meta`` key set while a move has written chunks whose log rows it has not yet deleted
#: (:func:`transpose`).
MOVE_PENDING = "sample_log_move_pending"


def _keep_only_unmoved(conn: Connection, seqs: Any, top: int, cutoff: int) -> None:
    """SQLite: replace ``sample_log`` by a copy of the rows a move left, in its transaction.

    Deleting rows writes every page they were on (the rest of the page, or its emptied
    image): deleting a moved hour wrote it to the WAL and the database file once more,
    about 50 bytes per sample ingested (``bench.writes``).  Dropping a table writes only
    the freelist (with ``secure_delete`` FAST, ``store.engine``).  What is left is the flushes
    appended since the listing (a move runs minutes after its hour ends: about a twelfth of
    an hour's rows) and the later hours' rows of the flushes listed, found by key: the log
    leads with ``seq``.
    """
    c, f = t.sample_log.c, t.sample_log_flushes.c
    later = select(f.seq).where(or_(f.seq > top, f.start_ms >= cutoff, f.end_ms >= cutoff))
    kept = select(*t.sample_log.c).where(
        c.seq.in_(later.scalar_subquery()), ~and_(c.seq.in_(seqs), c.end_ms < cutoff)
    )
    copy = t.sample_log.to_metadata(MetaData(), name=_LOG_COPY)
    conn.execute(DropTable(copy, if_exists=True))  # a leftover could only be an older crash's
    copy.create(conn)
    conn.execute(copy.insert().from_select(list(t.sample_log.c.keys()), kept))
    conn.execute(DropTable(t.sample_log))
    conn.exec_driver_sql(f"ALTER TABLE {_LOG_COPY} RENAME TO {t.sample_log.name}")


_LOG_COPY = "sample_log_kept"


def _forget_flushes(conn: Connection, top: int, cutoff: int, *, all_moved: bool) -> None:
    """After a move of the rows before ``cutoff`` of the flushes up to ``top``: delete the
    listings of those flushes that have no log row left (a key seek each), and when the move
    took every such row (``all_moved``), start the others' at ``cutoff``, where their rows
    left begin (whole hours).

    A flush's listing outlives the move when it also wrote rows of the next hour (every flush
    that straddles an hour does).  Left starting before ``cutoff``, every later run listed it
    again, found nothing to move, and on SQLite still copied the whole log to drop none of it
    (15-25 s of CPU every 5 minutes at 1,000 targets).  Flushes after ``top`` (appended
    during the move) keep their listings: rows of theirs before ``cutoff`` were not moved.
    """
    f, c = t.sample_log_flushes.c, t.sample_log.c
    listed = [f.start_ms < cutoff, f.seq <= top]
    conn.execute(delete(t.sample_log_flushes).where(
        *listed, ~select(c.seq).where(c.seq == f.seq).exists()
    ))
    if all_moved:
        conn.execute(update(t.sample_log_flushes).where(*listed).values(start_ms=cutoff))


class _Group(NamedTuple):
    """The log rows one move transaction takes: those of ``owners`` (whole targets' owners,
    or, for a large target, a few of its names')."""

    owners: npt.NDArray[np.int64]

    def rows(self, conn: Connection) -> Any:
        if conn.dialect.name == "postgresql":
            # One array, as the flushes' (``_listed``): both halves of the key are then index
            # conditions, where a list of literals was a filter over every flush's rows.
            return t.sample_log.c.owner == any_(_bigints(self.owners.tolist()))
        return in_ids(conn, t.sample_log.c.owner, self.owners)


#: Rows of the move's listing of owners (:func:`_groups`) fetched at a time.
LIST_BATCH = 4096


def _groups(engine: Engine, seqs: Any, cutoff: int) -> list[_Group]:
    """The move's transactions: whole targets up to :data:`TRANSPOSE_SAMPLES` samples (their
    series' chunks then land side by side in ``sample_chunks``), and a target holding more
    than that a few names at a time.

    The listing is read a batch at a time into arrays, and a group is a slice of them.  A
    fleet's hour is some 60,000 owners.  Read row by row into Python ints, tuples and lists,
    they were small objects made in the move's first seconds beside the scrapes and alert
    evaluations, and the groups' lists kept them for the whole move (``tracemalloc`` in
    ``bench.fleet`` at 1,000 targets: 72,730 blocks made by the row fetch, alive minutes into
    the move).  CPython hands an arena of small objects back only once every one in it is
    freed, and the collector's RSS after each trim stayed higher after the move than before
    it: 262-266 -> 269-280 MiB.  In arrays (the same bench, 40 minutes, the move in the
    window): 256-263 MiB before the move, 260-272 after it.
    """
    c, o = t.sample_log.c, t.sample_log_owners.c
    # Summed per owner (an integer: the smallest thing to sort), then each owner's target
    # joined, in target order: read as it streams, a target at a time (a fleet's hour is
    # some 60,000 owners).  An owner missing (no reader could find its rows) moves with the
    # rest, as a target of its own.
    per_owner = select(c.owner, func.sum(c.n).label("n")).where(
        c.seq.in_(seqs), c.end_ms < cutoff).group_by(c.owner).subquery()
    listed = select(o.target, per_owner.c.owner, per_owner.c.n).join_from(
        per_owner, t.sample_log_owners, o.id == per_owner.c.owner, isouter=True,
    ).order_by(o.target, per_owner.c.owner)
    owner_parts: list[npt.NDArray[np.int64]] = []
    n_parts: list[npt.NDArray[np.int64]] = []
    firsts: list[int] = []  # the row where each target's owners start
    unowned: list[int] = []  # the targets (their numbers) that are no target: owners missing
    at = 0
    last: Any = object()  # no target's
    with transaction(engine, write=False) as conn:  # a scan of the hour: not under the lock
        result = conn.execute(listed)
        try:
            cursor = result.cursor
            while batch := cursor.fetchmany(LIST_BATCH):
                owner_parts.append(np.fromiter((r[1] for r in batch), np.int64, len(batch)))
                n_parts.append(np.fromiter((r[2] for r in batch), np.int64, len(batch)))
                for i, (target, _, _) in enumerate(batch):
                    if target != last:
                        if target is None:
                            unowned.append(len(firsts))
                        firsts.append(at + i)
                        last = target
                at += len(batch)
        finally:
            result.close()
    if not firsts:
        return []
    if unowned:
        log.error("store: sample_log rows before %d belong to no owner; they are moved anyway",
                  cutoff)
    return _pack(np.concatenate(owner_parts), np.concatenate(n_parts),
                 np.array(firsts, np.int64), unowned)


def _pack(owners: npt.NDArray[np.int64], ns: npt.NDArray[np.int64],
          starts: npt.NDArray[np.int64], unowned: Sequence[int]) -> list[_Group]:
    """The groups of ``owners`` (with ``ns`` samples each, in target order; target ``i``'s
    owners start at ``starts[i]``; the targets ``unowned`` are the owners no target holds).

    A target is one unit, or each of its owners one unit if it holds more than the budget
    (not the owners of no target: they move together).  A group holds whole targets, or
    names of one target, and only as many units as fit: a group over the budget is decoded
    once more for its ranges and once per range (_move), where the units that would not fit
    start the next group."""
    sizes = np.diff(np.append(starts, len(owners)))
    whole = np.add.reduceat(ns, starts) <= TRANSPOSE_SAMPLES
    whole[list(unowned)] = True
    by_owner = np.repeat(~whole, sizes)
    first = np.zeros(len(owners), bool)
    first[starts] = True
    unit_at = np.flatnonzero(by_owner | first)
    unit_n = np.add.reduceat(ns, unit_at)
    # A unit's kind: -1 for a whole target (whole targets group together), else its target's
    # number (a large target's names group only with each other).
    unit_kind = np.where(by_owner[unit_at], np.repeat(np.arange(len(starts)), sizes)[unit_at],
                         -1)
    cuts: list[int] = []
    size, kind = 0, -2
    for u, (k, n) in enumerate(zip(unit_kind.tolist(), unit_n.tolist(), strict=True)):
        if cuts and k == kind and size + n <= TRANSPOSE_SAMPLES:
            size += n
            continue
        cuts.append(u)
        size, kind = n, k
    bounds = np.append(unit_at[cuts], len(owners)).tolist()
    return [_Group(owners[lo:hi]) for lo, hi in pairwise(bounds)]


def _drop_damaged(conn: Connection, flushes: Select[Any] | list[int], cutoff: int,
                  group: _Group) -> None:
    c, o = t.sample_log.c, t.sample_log_owners.c
    rows = conn.execute(select(c.owner, c.seq, c.start_ms, c.data).where(
        _seq_in(flushes), group.rows(conn), c.end_ms < cutoff
    )).all()
    for owner, seq, start_ms, data in rows:
        try:
            _Rows([seq], [bytes(data)])
        except ValueError as exc:
            target, name = conn.execute(
                select(o.target, o.name).where(o.id == owner)).first() or ("?", "?")
            log.error(
                "store: dropped a damaged sample_log row (target %r, name %r, write %d, "
                "%d bytes): %s", target, name, seq, len(data), exc,
            )
            conn.execute(
                delete(t.sample_log).where(c.seq == seq, c.owner == owner,
                                           c.start_ms == start_ms)
            )


def _lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_LOCK_ROLLUP:d})")


def _group_rows(conn: Connection, flushes: Select[Any] | list[int], cutoff: int,
                group: _Group) -> Select[Any]:
    """``(seq, n, data)`` of the group's rows in ``flushes`` that end before ``cutoff``, by
    ``seq``."""
    c = t.sample_log.c
    if isinstance(flushes, list):
        # A flush at a time, its rows of the group's owners by key: PostgreSQL's planner can't
        # then scan the whole hour, whatever its statistics of a log that turns over hourly.
        flush = func.unnest(_bigints(flushes)).table_valued("seq").render_derived(name="flush")
        # OFFSET 0 keeps the subquery one (it is not pulled up into a join, which the planner
        # would hash over a scan of every row of the hour when its statistics are stale).
        found = select(c.seq, c.n, c.data).where(
            c.seq == flush.c.seq, group.rows(conn), c.end_ms < cutoff).offset(0).lateral()
        return select(found.c.seq, found.c.n, found.c.data).select_from(flush).join(
            found, true()).order_by(found.c.seq)
    return select(c.seq, c.n, c.data).where(
        _seq_in(flushes), group.rows(conn), c.end_ms < cutoff).order_by(c.seq)


def _move(conn: Connection, flushes: Select[Any] | list[int], cutoff: int, group: _Group, *,
          redo: bool) -> int:
    # Every row of the group that ends before ``cutoff`` (an hour) in the flushes listed
    # under the rollup lock (all committed then; the module docstring).  The rows
    # left hold later hours only: no sample of theirs shares a (series, ts) with a moved one,
    # so their order against the moved chunks does not matter.  The rows are deleted later,
    # all groups at once (:func:`transpose`).
    rows = fetch_tuples(conn, _group_rows(conn, flushes, cutoff, group))
    if not rows:
        return 0
    row_seqs = [r[0] for r in rows]
    datas = [bytes(r[2]) for r in rows]
    sizes = [int(r[1]) for r in rows]
    slices = list(_slices(sizes, DECODE_SAMPLES))
    del rows
    # Most groups (a target's names, a large target's name) fit in one batch: decoded once.
    ranges = (_series_ranges(row_seqs, datas, slices) if sum(sizes) > TRANSPOSE_SAMPLES
              else [None])
    moved = 0
    for ids in ranges:
        # In seq order (the rows', slice after slice), as _write_chunks wants them.
        sids, ts, values, sample_seqs = _joined([
            r.samples(None if ids is None else np.flatnonzero((r.ids >= ids[0])
                                                             & (r.ids <= ids[1])))
            for r in (_Rows(row_seqs[lo:hi], datas[lo:hi]) for lo, hi in slices)])
        _write_chunks(conn, sids, ts, values, sample_seqs, redo=redo)
        moved += len(sids)
    return moved


def _series_ranges(seqs: list[int], datas: list[bytes], slices: list[tuple[int, int]]
                   ) -> list[tuple[int, int]]:
    """Ranges ``[lo, hi]`` of the series ids of the rows, in order, each holding about
    :data:`TRANSPOSE_SAMPLES` of their samples (a series whole in one, however large),
    together all of them: what one decode, sort and encoding of the move holds at once.

    A group of more samples is decoded once per range, each time keeping that range's series
    only.  Decoded whole (32 bytes a sample, kept until the last range was written), one name
    of the NVML host's target (a GPU series of every target of a fleet: 480,000 samples an
    hour at 1,000 targets) peaked at 28.6 MiB traced (``bench.move``); a range at a time, at
    a third of that, for one more decode of the rows' index per range."""
    # Each slice's series and their samples, merged into the running totals slice by slice:
    # the memory of the series, not of every slice's list of them.  Merged at the end, the
    # lists of a name of 10,000 series flushed 240 times (the GPU placement SLIs of a
    # 1,000-target fleet) were 1.2 M ids, and their sort took a collector 35 MB over its
    # usual high-water mark for a tenth of a second, every hour.
    ids = np.empty(0, np.int64)
    counts: npt.NDArray[Any] = np.empty(0, np.float64)  # bincount of weights: floats
    for lo, hi in slices:
        r = _Rows(seqs[lo:hi], datas[lo:hi])
        ids, inverse = np.unique(np.concatenate([ids, r.ids]), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate([counts, r.ns]),
                             minlength=len(ids))
    batch = ((np.cumsum(counts) - counts) // TRANSPOSE_SAMPLES).astype(np.int64)
    starts, ends = run_bounds(batch)
    return [(int(ids[a]), int(ids[b - 1]))
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _slices(sizes: Sequence[int], budget: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` of consecutive items whose ``sizes`` add up to ``budget`` or just past it
    (the last slice: whatever is left), in order."""
    lo = total = 0
    for i, size in enumerate(sizes):
        total += size
        if total >= budget or i == len(sizes) - 1:
            yield lo, i + 1
            lo, total = i + 1, 0


def _joined(parts: list[Columns]) -> Columns:
    """``parts`` (emptied) joined column by column."""
    if len(parts) == 1:
        return parts.pop()
    # A column at a time, each column's parts dropped once joined: a sample is held twice
    # over one column's 8 bytes at most, not over all four.
    columns: list[list[Any]] = [list(col) for col in zip(*parts, strict=True)]
    parts.clear()
    joined = []
    for col in columns:
        joined.append(np.concatenate(col))
        col.clear()
    return joined[0], joined[1], joined[2], joined[3]


def _write_chunks(conn: Connection, sids: npt.NDArray[np.int64], ts: npt.NDArray[np.int64],
                  values: npt.NDArray[np.float64], row_seqs: npt.NDArray[np.int64], *,
                  redo: bool) -> None:
    # Samples in seq order, so of equal (series, ts) keys the stable sort keeps the last
    # write (``sort_keep_last``).
    merged = sort_keep_last(sids, ts, values)
    # Compressed now: these are whole hours, which compaction would otherwise rewrite.
    chunks = compress(encode(merged.ids, merged.ts, merged.values, max_samples=MAX_SAMPLES))
    # Each series' chunks take the highest seq of that series' rows, not of the whole group:
    # a chunk of another writer (an older tritonwatch on a shared database) between the two
    # keeps its place in write order.
    order = np.argsort(sids, kind="stable")
    starts, _ = run_bounds(sids[order])
    top_of = np.maximum.reduceat(row_seqs[order], starts) if len(starts) else row_seqs
    series = sids[order][starts]
    chunk_seqs = top_of[np.searchsorted(series, chunks.ids)]
    if redo:  # the same rows, moved before by a run that crashed: the same keys
        sc = t.sample_chunks.c
        keys = list(zip(chunks.ids.tolist(), chunks.start_ms.tolist(), chunk_seqs.tolist(),
                        strict=True))
        for lo in range(0, len(keys), 500):
            conn.execute(delete(t.sample_chunks).where(
                tuple_(sc.series_id, sc.start_ms, sc.seq).in_(keys[lo : lo + 500])))
    insert_chunks(conn, chunks, chunk_seqs)
