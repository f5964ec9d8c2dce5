"""Rollup chunks: a series' rollup rows of one window, stored column-wise and compressed.

A rollup row (one per series and bucket) is six columns: the bucket start ``ts`` (ms), ``min``,
``max``, ``sum``, ``count`` and ``last``.  Stored a row per bucket, they were most of the
database: about 60 bytes on disk per 5 m bucket, 3 bytes per raw sample of a 15 s series and
6 of a 30 s one, more than the compressed samples themselves, and every rollup run dirtied a
B-tree page per series.  So they are stored as the samples are (``store.chunks``): a row of
``rollup_chunks_5m`` or ``rollup_chunks_1h`` holds the buckets of one series in one aligned
window (:data:`WINDOWS`: a day of 5 m buckets, a week of 1 h ones), keyed
``(series_id, start_ms, seq)`` with ``end_ms`` (the last bucket's start) and ``n`` (buckets).

Data.  Either **raw**, exactly ``48 * n`` bytes: the six columns one after the other, each
``n`` little-endian words (``count`` an int64, the others float64); or **compressed**: the
format byte :data:`FORMAT_PCO`, six little-endian uint16 byte lengths, then each column as a
pcodec chunk (metadata and one page, under ``store.chunks.PCO_HEADER``), so that a reader
decodes only the columns its aggregation needs.  Since schema 6 compaction writes the format
byte :data:`FORMAT_COLUMNS` instead, with a mode byte per column before the lengths: a column
is a pcodec chunk, or one word when every bucket has the same value (``count`` of a regular
scrape, a gauge that held still), or the step of evenly spaced bucket starts (``ts``, almost
always), or nothing when it equals ``last`` (a counter's ``max``; ``min`` and ``sum`` of a
bucket of one sample).  ``bench/storage.py``, 24 h on SQLite, 5 m rollups in bytes per raw
sample: 0.48 -> 0.36 (566 series at 15 s), 0.88 -> 0.63 (116 at 30 s).  A compressed chunk is
never ``48 * n`` bytes (:func:`compress` keeps a chunk raw unless compressing saves bytes).
Lossless to the bit, like the sample chunks (``tests/store/test_rollup_chunks.py``,
``tests/faults/test_storage_disk.py``).

Last write wins, as for samples: a rollup run takes a new ``seq`` and appends a chunk per
series and window; of two buckets with the same start the one of the higher ``seq`` counts,
which is what the upsert of a rollup row did.  Compaction (``maintenance.compact``) merges a
window's chunks into one, keeping the highest ``seq``.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from tritonwatch.store.chunks import (
    FORMAT_PCO,
    I64,
    MAX_CHUNK_BYTES,
    Encoded,
    _pco,
    from_pieces,
    pieces,
    run_bounds,
)

ROLLUP_5M_MS = 300_000
ROLLUP_1H_MS = 3_600_000

#: Rollup resolution -> the aligned window no chunk of it crosses (ms).
WINDOWS = {ROLLUP_5M_MS: 86_400_000, ROLLUP_1H_MS: 7 * 86_400_000}
#: Rollup resolution -> the most bytes of one chunk; a larger one is stored in pieces.  5 m
#: chunks keep to what SQLite stores inline (``store.chunks.MAX_CHUNK_BYTES``): they are most
#: of the rollups' bytes.  Hourly ones are few (a week's overflow page per series costs less
#: than 0.05 bytes per raw sample) and are what long-range panels read: in pieces of 960
#: bytes a 30-day panel of 200 series decoded 5,000 chunks, each a few pcodec calls.  The
#: cap keeps every column's length within the header's uint16.
PIECE_BYTES = {ROLLUP_5M_MS: MAX_CHUNK_BYTES, ROLLUP_1H_MS: 48_000}

COLUMNS = ("ts", "min", "max", "sum", "count", "last")
_INT_COLUMNS = frozenset({0, 4})
_K = len(COLUMNS)
_LE_I64 = np.dtype("<i8")
_LE_F64 = np.dtype("<f8")
_LE_U16 = np.dtype("<u2")
_LENS = struct.Struct("<6H")
#: Format byte of a rollup chunk whose columns each say how they are stored (schema 6, see
#: the module docstring): a mode byte per column, then the lengths and data as in
#: :data:`FORMAT_PCO`.
FORMAT_COLUMNS = 2
#: Column modes: a pcodec chunk; one word, every bucket's value; one word, the step between
#: consecutive bucket starts (``ts`` only); nothing, the ``last`` column's values (``min``,
#: ``max`` and ``sum`` only: a counter's max, a gauge that held still through each bucket).
_MODE_PCO, _MODE_CONST, _MODE_STEP, _MODE_LAST = 0, 1, 2, 3
_LAST = 5
_LIKE_LAST = frozenset({1, 2, 3})
F64 = npt.NDArray[np.float64]


class Rows(NamedTuple):
    """Rollup rows as columns, sorted by ``(ids, ts)`` without duplicate keys."""

    ids: I64
    ts: I64
    min: F64
    max: F64
    sum: F64
    n: I64  # ``count`` (taken by tuple)
    last: F64

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, keep: npt.NDArray[np.bool_] | I64) -> Rows:
        return Rows(*(c[keep] for c in self))  # type: ignore[arg-type]


def empty() -> Rows:
    i, f = np.empty(0, np.int64), np.empty(0, np.float64)
    return Rows(i, i, f, f, f, i, f)


def window_start(ms: int, res: int) -> int:
    return ms // WINDOWS[res] * WINDOWS[res]


def encode(rows: Rows, res: int) -> Encoded:
    """Raw chunks of ``rows``: one per series and window of resolution ``res``."""
    n = len(rows)
    starts, ends = run_bounds(rows.ids, rows.ts // WINDOWS[res])
    counts = ends - starts
    out = np.empty(_K * n, _LE_I64)
    # Chunk i's data is words [6 s_i, 6 s_i + 6 n_i): column c of it at 6 s_i + c n_i + k.
    base = np.repeat(_K * starts, counts) + np.arange(n, dtype=np.int64) - np.repeat(
        starts, counts)
    step = np.repeat(counts, counts)
    for c in range(_K):
        col = rows[1 + c]
        out[base + c * step] = (
            col if c in _INT_COLUMNS else np.ascontiguousarray(col, _LE_F64).view(_LE_I64))
    return Encoded(rows.ids[starts], rows.ts[starts], rows.ts[ends - 1], counts,
                   out.tobytes(), 8 * _K * starts, 8 * _K * counts)


def compress(chunks: Encoded, res: int) -> Encoded:
    """``chunks`` (raw, from :func:`encode`, of resolution ``res``) compressed where that
    saves bytes, one larger than :data:`PIECE_BYTES` cut into pieces (``store.chunks.pieces``).
    """
    if not len(chunks):
        return chunks
    limit = PIECE_BYTES[res]
    compressor, _, config = _pco()
    words = np.frombuffer(chunks.buf, _LE_I64)
    ids: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    ns: list[int] = []
    parts: list[bytes] = []
    for sid, at, n in zip(chunks.ids.tolist(), (chunks.offsets // 8).tolist(),
                          chunks.n.tolist(), strict=True):
        cols = [words[at + c * n : at + (c + 1) * n] for c in range(_K)]

        def packed(lo: int, hi: int, cols: list[npt.NDArray[np.int64]] = cols) -> bytes:
            out: list[bytes] = []
            modes: list[int] = []
            last = cols[_LAST][lo:hi]
            for c, col in enumerate(cols):
                part = col[lo:hi]
                mode, data = _MODE_PCO, b""
                if c == 0 and hi - lo > 1 and (np.diff(part) == part[1] - part[0]).all():
                    mode, data = _MODE_STEP, int(part[1] - part[0]).to_bytes(8, "little",
                                                                                signed=True)
                elif c in _LIKE_LAST and np.array_equal(part, last):
                    mode = _MODE_LAST
                elif (part == part[0]).all():
                    mode, data = _MODE_CONST, part[:1].astype(_LE_I64).tobytes()
                else:
                    cc = compressor.chunk_compressor(
                        part if c in _INT_COLUMNS else part.view(_LE_F64), config)
                    data = cc.write_meta() + b"".join(
                        cc.write_page(k) for k in range(len(cc.n_per_page())))
                modes.append(mode)
                out.append(data)
            lens = [len(b) for b in out]
            if max(lens) >= 1 << 16:
                return raw(lo, hi) + b"\0"  # lengths a header cannot hold: raw wins
            return (bytes([FORMAT_COLUMNS, *modes]) + np.array(lens, _LE_U16).tobytes()
                    + b"".join(out))

        def raw(lo: int, hi: int, cols: list[npt.NDArray[np.int64]] = cols) -> bytes:
            return b"".join(col[lo:hi].astype(_LE_I64).tobytes() for col in cols)

        for lo, hi, blob in pieces(n, packed, raw, limit=limit):
            ids.append(sid)
            starts.append(int(cols[0][lo]))
            ends.append(int(cols[0][hi - 1]))
            ns.append(hi - lo)
            parts.append(blob)
    return from_pieces(ids, starts, ends, ns, parts)


def _column(blob: bytes, n: int, c: int, start: int | None = None) -> npt.NDArray[Any]:
    """Column ``c`` of one chunk of ``n`` buckets starting at ``start`` (needed for a
    :data:`FORMAT_COLUMNS` chunk's stepped ``ts``).  Python ints, not numpy, for the header:
    a long-range panel decodes thousands of chunks, and numpy's per-call cost on six numbers
    was most of the time."""
    if len(blob) == 8 * _K * n:
        words = np.frombuffer(blob, _LE_I64, n, 8 * c * n)
        return words.astype(np.int64) if c in _INT_COLUMNS else words.view(_LE_F64).astype(
            np.float64)
    dtype = np.int64 if c in _INT_COLUMNS else np.float64
    if blob and blob[0] == FORMAT_COLUMNS and len(blob) >= 1 + 3 * _K:
        mode = blob[1 + c]
        lens = _LENS.unpack_from(blob, 1 + _K)
        head = 1 + 3 * _K
        if head + sum(lens) != len(blob):
            raise ValueError(f"a compressed rollup chunk of {n} buckets is damaged: its column "
                             "lengths do not add up")
        at = head + sum(lens[:c])
        part = blob[at : at + lens[c]]
        if mode == _MODE_STEP and len(part) == 8 and start is not None:
            step = int.from_bytes(part, "little", signed=True)
            return start + step * np.arange(n, dtype=np.int64)
        if mode == _MODE_LAST and not part and c in _LIKE_LAST:
            return _column(blob, n, _LAST, start)
        if mode == _MODE_CONST and len(part) == 8:
            return np.full(n, np.frombuffer(part, _LE_I64)[0], np.int64).view(dtype)
        if mode != _MODE_PCO:
            raise ValueError(f"a compressed rollup chunk of {n} buckets is damaged: column "
                             f"{COLUMNS[c]} has mode {mode} in {len(part)} bytes"
                             + (" and no start given" if mode == _MODE_STEP else ""))
        return _pco_column(part, n, c)
    if len(blob) < 1 + 2 * _K or blob[0] != FORMAT_PCO:
        raise ValueError(f"a rollup chunk of {n} buckets holds {len(blob)} bytes: neither raw "
                         f"(expected {8 * _K * n}) nor compressed")
    lens = _LENS.unpack_from(blob, 1)
    if 1 + 2 * _K + sum(lens) != len(blob):
        raise ValueError(f"a compressed rollup chunk of {n} buckets is damaged: its column "
                         "lengths do not add up")
    at = 1 + 2 * _K + sum(lens[:c])
    return _pco_column(blob[at : at + lens[c]], n, c)


def _pco_column(part: bytes, n: int, c: int) -> npt.NDArray[Any]:
    _, decompressor, _ = _pco()
    out: npt.NDArray[Any] = np.empty(n, np.int64 if c in _INT_COLUMNS else np.float64)
    try:
        cd, used = decompressor.chunk_decompressor(part, "i64" if c in _INT_COLUMNS else "f64")
        progress, used2 = cd.read_page_into(part[used:], n, out)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"a compressed rollup chunk of {n} buckets is damaged: {exc}") from exc
    if progress.n_processed != n or used + used2 != len(part):
        raise ValueError(f"a compressed rollup chunk of {n} buckets is damaged")
    return out


def decode(
    ids: I64, seqs: I64, starts: I64, ns: I64, blobs: list[bytes], *, lo_ms: int, hi_ms: int,
    columns: tuple[str, ...] = COLUMNS, ends: I64 | None = None, res: int | None = None,
) -> Rows:
    """The rows of the chunks (parallel columns, any order) with ``ts`` in ``[lo_ms, hi_ms]``,
    keeping of equal ``(id, ts)`` the one of the highest ``seq``.  Columns not in ``columns``
    are not decoded (zeros).  Given the chunks' ``ends`` and resolution ``res``, a chunk with
    a bucket at every step from its start to its end (most are) has its ``ts`` column computed
    rather than decoded.  Raises ValueError on damaged data."""
    if not len(ids):
        return empty()
    order_a = np.lexsort((starts, seqs, ids))
    order = order_a.tolist()
    counts = ns[order_a]
    count_list = counts.tolist()
    start_list = starts[order_a].tolist()
    total = int(counts.sum())
    first = np.cumsum(counts) - counts
    want = {COLUMNS.index(c) for c in columns} | {0}
    cols: list[npt.NDArray[Any]] = []
    dense = np.zeros(len(ids), bool)
    if ends is not None and res is not None:
        dense = (ends - starts == (ns - 1) * res)[order_a]
    # Raw chunks (what each rollup run writes, until compaction) decoded all at once: a chunk
    # at a time, the 1 h rollup of a fleet's hour of 5 m chunks was most of a rollup run.
    blob_lens = np.fromiter((len(blobs[i]) for i in order), np.int64, len(order))
    is_raw = blob_lens == 8 * _K * counts
    raw_words: npt.NDArray[np.int64] | None = None
    if is_raw.any():
        raw_at = np.flatnonzero(is_raw)
        raw_words = np.frombuffer(b"".join(blobs[order[k]] for k in raw_at.tolist()), _LE_I64)
        raw_n = counts[raw_at]
        # Where each raw chunk's words start in raw_words, and where its buckets go in a column.
        raw_word_at = np.cumsum(_K * raw_n) - _K * raw_n
        raw_dest = np.repeat(first[raw_at], raw_n) + np.arange(int(raw_n.sum()), dtype=np.int64) - (
            np.repeat(np.cumsum(raw_n) - raw_n, raw_n))
        raw_src = raw_dest - np.repeat(first[raw_at], raw_n) + np.repeat(raw_word_at, raw_n)
        raw_rep_n = np.repeat(raw_n, raw_n)
    packed = np.flatnonzero(~is_raw).tolist()
    for c in range(_K):
        if c in want and raw_words is not None and not (c == 0 and dense.any()):
            col = np.empty(total, np.int64 if c in _INT_COLUMNS else np.float64)
            words = raw_words[raw_src + c * raw_rep_n]
            col[raw_dest] = words if c in _INT_COLUMNS else words.view(_LE_F64)
            for k in packed:
                a = int(first[k])
                col[a : a + count_list[k]] = _column(blobs[order[k]], count_list[k], c,
                                                     start_list[k])
            cols.append(col)
        elif c == 0 and dense.any():
            step = res or 0
            ts = np.repeat(starts[order_a], counts) + step * (
                np.arange(total, dtype=np.int64) - np.repeat(first, counts))
            for k in np.flatnonzero(~dense).tolist():
                a = int(first[k])
                ts[a : a + count_list[k]] = _column(blobs[order[k]], count_list[k], 0,
                                                    start_list[k])
            cols.append(ts)
        elif c in want:
            parts = [_column(blobs[i], n, c, s) for i, n, s in zip(order, count_list, start_list,
                                                                    strict=True)]
            cols.append(np.concatenate(parts) if parts else np.empty(0))
        else:
            cols.append(np.zeros(total, np.int64 if c in _INT_COLUMNS else np.float64))
    sids = np.repeat(ids[order], counts)
    rows = Rows(sids, *cols)
    keep = (rows.ts >= lo_ms) & (rows.ts <= hi_ms)
    if not keep.all():
        rows = rows.take(keep)
    if len(rows) > 1:
        same = rows.ids[1:] == rows.ids[:-1]
        if not ((rows.ids[1:] > rows.ids[:-1]) | (same & (rows.ts[1:] > rows.ts[:-1]))).all():
            # Overlapping chunks: stable sort, the last write of each key last, kept.
            order2 = np.lexsort((rows.ts, rows.ids))
            rows = rows.take(order2)
            last = np.ones(len(rows), bool)
            last[:-1] = (rows.ids[1:] != rows.ids[:-1]) | (rows.ts[1:] != rows.ts[:-1])
            rows = rows.take(last)
    return rows


def _skip_nan(ufunc: np.ufunc, fill: float, values: F64, starts: I64) -> F64:
    """``ufunc.reduceat`` over the runs of ``values`` starting at ``starts``, NaN skipped (NaN
    only where a run holds nothing else), as Prometheus's min/max_over_time.  Not ``np.fmin``:
    a signalling NaN such as the stale marker ``0x7ff0000000000002`` makes numpy's fmin (and
    nanmin) answer another number of the run (measured: 4.0 for [3, stale, 5, 4])."""
    nan = np.isnan(values)
    if not nan.any():
        out: F64 = ufunc.reduceat(values, starts)
        return out
    out = ufunc.reduceat(np.where(nan, fill, values), starts)
    out[np.add.reduceat(~nan, starts) == 0] = np.nan
    return out


def nan_min(values: F64, starts: I64) -> F64:
    """The least of each run of ``values`` (starting at ``starts``) that is a number."""
    return _skip_nan(np.minimum, np.inf, values, starts)


def nan_max(values: F64, starts: I64) -> F64:
    """The greatest of each run of ``values`` (starting at ``starts``) that is a number."""
    return _skip_nan(np.maximum, -np.inf, values, starts)


def aggregate(rows: Rows, res: int) -> Rows:
    """Rows of a coarser resolution ``res`` from ``rows`` (sorted by ``(ids, ts)``): min of
    mins, max of maxes (NaN skipped), sums of sums and counts, the last of the newest row."""
    b = rows.ts // res * res
    starts, ends = run_bounds(rows.ids, b)
    if not len(starts):
        return empty()
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.add.reduceat(rows.sum, starts)
    return Rows(
        rows.ids[starts], b[starts], nan_min(rows.min, starts),
        nan_max(rows.max, starts), total, np.add.reduceat(rows.n, starts),
        rows.last[ends - 1],
    )
