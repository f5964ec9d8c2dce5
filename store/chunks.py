"""Raw samples as per-series chunks: the encoding of ``sample_chunks.data`` and the merge rule.

No SQL here: ``store.write`` stores chunks, ``store.query`` and ``store.maintenance`` read them
back through :func:`merge`.

Encoding.  A chunk holds ``n`` samples of one series; the row beside it repeats ``n``, the
first and last timestamp (``start_ms``, ``end_ms``) and ``seq``.  Its ``data`` is one of:

* **raw**: exactly ``16 * n`` bytes, the ``n`` timestamps (ms since the epoch, little-endian
  int64, ascending) followed by the ``n`` values (little-endian IEEE float64), no header.
  numpy writes and reads it whole (``np.frombuffer``), no Python object per sample.  What the
  sample log's chunks are (``store.samplelog``), what maintenance first moves out of the log
  (a few minutes per series, soon merged again), and all that schema 3 stored.
* **compressed**: a format byte, :data:`FORMAT_PCO`, then the timestamps and then the values
  as two pcodec chunks (pcodec's wrapped format under the file header :data:`PCO_HEADER`,
  chunk metadata and one page each).  Compaction writes these (:func:`compress`): chosen by
  measurement (``bench/storage.py``) against delta-of-delta and XOR with byte shuffling and
  zstd; pcodec finds per chunk the delta order and bins that suit each column, which is what
  makes counters, gauges and jittered timestamps all small: about 1.9 bytes a sample for hour
  chunks of Triton data, against 16 raw.  Lossless to the bit: NaN payloads (Prometheus's stale
  marker ``0x7ff0000000000002``), -0.0 and infinities survive (``tests/store/test_codec.py``).
  Encoding costs about 45 us per chunk whatever its size (pcodec's mode search), which is why
  the frequent small chunks of the log's moves stay raw and only hour chunks are compressed.

* **shared timestamps** (schema 6): the format byte :data:`FORMAT_PCO_SHARED`, a header
  naming a timestamp column stored once in ``chunk_timestamps`` (its first timestamp, as the
  chunk's start minus a delta, and a 64-bit hash of its content) and the chunk's offset in
  it, then the values as one pcodec chunk.  All series of a target are scraped at the same
  instants, so their span chunks have the same timestamp column, which was 0.7 of the 1.7
  bytes a compressed sample took; compaction's span merges (``compress_shared``) store it
  once for every chunk of the batch that has it, and a chunk whose column no other has (a
  series with missing scrapes or skipped NaN, late samples) holds its own, as above.  Readers
  fetch the columns their chunks name (``store.query.shared_timestamps``), each once.
  Retention deletes the columns ending before its cutoff after the chunks there.
  Measured with ``bench/storage.py`` (24 h, SQLite, bytes per sample in ``sample_chunks``
  and ``chunk_timestamps``): 566 series at 15 s 1.84 -> 1.04, 116 series at 30 s 2.09 -> 1.27.

A compressed chunk never is ``16 * n`` bytes long (:func:`compress` keeps a chunk raw unless
compressing it saves bytes), so the length alone tells the two apart; the format byte leaves
room for other codecs.

Windows.  A chunk never crosses a boundary of the aligned :data:`WINDOW_MS` (1 h) grid: a
flush encodes one chunk per series (kept in the sample log, ``store.samplelog``, until
maintenance merges a few minutes of them into one), split in two only when its samples
straddle a full hour.
Compaction merges each hour's chunks into one per series, and once all six hours of an aligned
:data:`SPAN_MS` (6 h) span are done, the span's hour chunks into one (schema 5: a 6 h chunk
compresses a tenth better than six hour chunks, and its row costs a sixth).  So no chunk
crosses a span boundary, and only those span merges cross an hour one.
Every chunk holding samples at or after ``lo`` then starts at or after ``lo``'s span, and the
chunks overlapping ``[lo, hi]`` are a bounded primary-key range scan
(``start_ms BETWEEN span(lo) AND hi AND end_ms >= lo``) with no index on ``end_ms``; and
compaction can merge one hour (its chunks that end in it) or one span at a time, knowing no
chunk it does not read holds samples in what it writes, but span chunks it read or that are
older than every chunk it read.

Last write wins.  Chunks of one series may overlap: late samples flushed after newer ones, a
re-sent scrape, two writers, a retried flush whose commit had in fact succeeded.  Each flush
takes a new ``seq`` (a PostgreSQL sequence, or a counter in ``meta`` on SQLite, where writes
are serialised anyway) and every chunk it writes carries it, so ``(series_id, start_ms, seq)``
is unique whatever the data.  A reader concatenates the chunks of a series in ``(seq,
start_ms)`` order, stable-sorts by timestamp, and of samples with equal timestamps keeps the
one from the highest ``seq``: exactly what a per-sample upsert (the previous ``samples``
table) stored.  Compacted chunks keep the highest ``seq`` they merged (see
``maintenance.compact`` for why that is safe).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from pcodec import ChunkConfig
from pcodec import wrapped as pco

#: Chunks are cut at the boundaries of this aligned grid (ms) when written, and compacted an
#: hour at a time.
WINDOW_MS = 3_600_000
#: No chunk crosses a boundary of this aligned grid (ms): compaction merges a span's hours.
SPAN_MS = 6 * WINDOW_MS

#: Samples per chunk written by compaction and migration (64 KiB of data).
MAX_SAMPLES = 4096

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_LE_I64 = np.dtype("<i8")
_LE_F64 = np.dtype("<f8")
I64_MIN = int(np.iinfo(np.int64).min)
I64_MAX = int(np.iinfo(np.int64).max)

#: Format byte of a compressed chunk (see the module docstring).
FORMAT_PCO = 1
#: Format byte of a compressed chunk whose timestamps are stored once for the series sharing
#: them (``chunk_timestamps``, see the module docstring): the header :data:`_SHARED_HEAD`,
#: then the values as in :data:`FORMAT_PCO`.
FORMAT_PCO_SHARED = 2
#: A shared chunk's header: the format byte, the column's key, how long before the chunk's
#: first sample the column starts (ms), and at which of its samples the chunk starts.
_SHARED_HEAD = struct.Struct("<BqII")
_SHARED_TAG = bytes([FORMAT_PCO_SHARED])
#: The longest column shared (its offsets fit the header); compaction's chunks hold at most
#: :data:`MAX_SAMPLES`.
_SHARED_MAX = 1 << 31
#: The pcodec wrapped-format file header compressed chunks are written and read under.  Kept
#: here rather than asked of the installed pcodec: data written today must decode the same way
#: after an upgrade, and an upgrade that writes another header is refused (:func:`_pco`).
PCO_HEADER = b"\x04\x01"
#: pcodec's compression level: 8 (its default) costs a third more time than 4 for 0.1 % less.
_PCO_LEVEL = 4
_pco_state: tuple[pco.FileCompressor, pco.FileDecompressor, ChunkConfig] | None = None


def _pco() -> tuple[pco.FileCompressor, pco.FileDecompressor, ChunkConfig]:
    global _pco_state
    if _pco_state is None:
        compressor = pco.FileCompressor()
        header = compressor.write_header()
        if header != PCO_HEADER:
            raise RuntimeError(
                f"the installed pcodec writes the file header {header!r}, not {PCO_HEADER!r}: "
                "tritonwatch does not know that format; install the pcodec version "
                "pyproject.toml names"
            )
        decompressor, _ = pco.FileDecompressor.new(PCO_HEADER)
        _pco_state = compressor, decompressor, ChunkConfig(compression_level=_PCO_LEVEL)
    return _pco_state


class Encoded(NamedTuple):
    """Chunks built from sorted columns: one entry per chunk, data in one buffer."""

    ids: I64
    start_ms: I64
    end_ms: I64
    n: I64
    buf: bytes
    #: Byte offset of each chunk's data in ``buf``.
    offsets: I64
    #: Byte length of each chunk's data: ``16 * n`` when raw (what :func:`encode` builds).
    sizes: I64

    def __len__(self) -> int:
        return len(self.ids)

    def blobs(self, lo: int = 0, hi: int | None = None) -> list[bytes]:
        """The data of chunks ``lo`` to ``hi`` (all by default), one bytes object each."""
        buf = self.buf
        starts = self.offsets[lo:hi]
        ends = starts + self.sizes[lo:hi]
        return [buf[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


class Merged(NamedTuple):
    """Samples of several series, sorted by ``(id, ts)`` with no duplicate key."""

    ids: I64
    ts: I64
    values: F64

    def __len__(self) -> int:
        return len(self.ids)

    def groups(self) -> tuple[I64, I64]:
        """``(starts, ends)``: index ranges of each series' samples."""
        return run_bounds(self.ids)


def run_bounds(*keys: npt.NDArray[np.int64]) -> tuple[I64, I64]:
    """Start and end (exclusive) positions of the runs of equal ``keys`` in sorted columns."""
    n = len(keys[0])
    if not n:
        empty = np.empty(0, np.int64)
        return empty, empty
    change = np.zeros(n, bool)
    change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    starts = np.flatnonzero(change).astype(np.int64)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = n
    return starts, ends


def window_start(ms: int) -> int:
    """Start of the :data:`WINDOW_MS` window holding ``ms``."""
    return ms // WINDOW_MS * WINDOW_MS


def span_start(ms: int) -> int:
    """Start of the :data:`SPAN_MS` span holding ``ms``: no chunk holding samples at or after
    ``ms`` starts before it."""
    return ms // SPAN_MS * SPAN_MS


def encode(
    ids: I64, ts: I64, values: F64, *, max_samples: int | None = None,
    window_ms: int = WINDOW_MS,
) -> Encoded:
    """Chunks for columns sorted by ``(id, ts)`` without duplicate keys.

    One chunk per series and ``window_ms`` window (an hour; a span for compaction's span
    merges), cut further every ``max_samples`` samples if given.
    """
    n = len(ids)
    win = ts // window_ms
    starts, ends = run_bounds(ids, win)
    if max_samples is not None and len(starts) and int((ends - starts).max()) > max_samples:
        pos = np.arange(n, dtype=np.int64) - np.repeat(starts, ends - starts)
        cut = np.zeros(n, bool)
        cut[starts] = True
        cut |= pos % max_samples == 0
        starts = np.flatnonzero(cut).astype(np.int64)
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        if len(ends):
            ends[-1] = n
    counts = ends - starts
    # Chunk i's data occupies words [2*s_i, 2*s_i + 2*n_i) of one buffer: its timestamps at
    # s_i + k, its values n_i words further, for the samples k in [s_i, s_i + n_i).
    out = np.empty(2 * n, _LE_I64)
    at = np.repeat(starts, counts) + np.arange(n, dtype=np.int64)
    out[at] = ts
    out[at + np.repeat(counts, counts)] = np.ascontiguousarray(values, _LE_F64).view(_LE_I64)
    return Encoded(
        ids=ids[starts],
        start_ms=ts[starts],
        end_ms=ts[ends - 1],
        n=counts,
        buf=out.tobytes(),
        offsets=16 * starts,
        sizes=16 * counts,
    )


#: The most bytes a stored chunk's data takes: a larger one is cut into pieces (by samples)
#: that each fit.  SQLite keeps a row of a WITHOUT ROWID table of 4 KB pages inline only up to
#: about 1,000 bytes; past that it moves the rest to an overflow page of its own, mostly empty
#: (measured: a day of a 566-series target took 3.4 bytes a sample in ``sample_chunks`` for
#: 1.7 of chunk data).
MAX_CHUNK_BYTES = 960

#: ``(lo, hi, data)``: a piece of a chunk, samples ``lo`` to ``hi``.
Piece = tuple[int, int, bytes]


def pieces(
    n: int, packed: Callable[[int, int], bytes], raw: Callable[[int, int], bytes],
    *, limit: int = MAX_CHUNK_BYTES,
) -> list[Piece]:
    """Samples ``0`` to ``n`` as pieces of at most ``limit`` bytes (a single sample or row may
    exceed it): each compressed (``packed(lo, hi)``) or raw (``raw(lo, hi)``) where that is
    not larger, cut evenly by samples as often as needed."""
    out: list[Piece] = []
    todo = [(0, n)]
    while todo:
        lo, hi = todo.pop()
        blob = packed(lo, hi)
        plain = raw(lo, hi)
        if len(blob) >= len(plain):
            blob = plain
        if len(blob) <= limit or hi - lo == 1:
            out.append((lo, hi, blob))
            continue
        k = min(hi - lo, -(-len(blob) // limit))
        cuts = np.linspace(lo, hi, k + 1).astype(np.int64).tolist()
        todo.extend(reversed(list(itertools.pairwise(cuts))))
    return out


def from_pieces(ids: list[int], starts: list[int], ends: list[int], ns: list[int],
                parts: list[bytes]) -> Encoded:
    """An :class:`Encoded` of chunks given one by one."""
    sizes = np.fromiter(map(len, parts), np.int64, len(parts))
    offsets = np.zeros(len(parts), np.int64)
    if len(parts):
        np.cumsum(sizes[:-1], out=offsets[1:])
    return Encoded(np.array(ids, np.int64), np.array(starts, np.int64),
                   np.array(ends, np.int64), np.array(ns, np.int64), b"".join(parts), offsets,
                   sizes)


def compress(chunks: Encoded, *, limit: int = MAX_CHUNK_BYTES) -> Encoded:
    """``chunks`` (raw, from :func:`encode`) with each chunk compressed (:data:`FORMAT_PCO`),
    or kept raw where that is not smaller; one larger than ``limit`` bytes is cut into
    pieces (:func:`pieces`), chunks of the same series and window."""
    if not len(chunks):
        return chunks
    compressor, _, config = _pco()
    words = np.frombuffer(chunks.buf, _LE_I64)
    prefix = bytes([FORMAT_PCO])
    ids: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    ns: list[int] = []
    parts: list[bytes] = []
    for sid, at, n in zip(chunks.ids.tolist(), (chunks.offsets // 8).tolist(),
                          chunks.n.tolist(), strict=True):
        ts = words[at : at + n]
        values = words[at + n : at + 2 * n].view(_LE_F64)

        def packed(lo: int, hi: int, ts: I64 = ts, values: F64 = values) -> bytes:
            out = [prefix]
            for column in (ts[lo:hi], values[lo:hi]):
                cc = compressor.chunk_compressor(column, config)
                out.append(cc.write_meta())
                out.extend(cc.write_page(k) for k in range(len(cc.n_per_page())))
            return b"".join(out)

        def raw(lo: int, hi: int, ts: I64 = ts, values: F64 = values) -> bytes:
            return ts[lo:hi].astype(_LE_I64).tobytes() + values[lo:hi].astype(
                _LE_F64).tobytes()

        for lo, hi, blob in pieces(n, packed, raw, limit=limit):
            ids.append(sid)
            starts.append(int(ts[lo]))
            ends.append(int(ts[hi - 1]))
            ns.append(hi - lo)
            parts.append(blob)
    return from_pieces(ids, starts, ends, ns, parts)


#: ``(start_ms, key)`` of a shared timestamp column (a row of ``chunk_timestamps``).
TsRef = tuple[int, int]


class SharedColumn(NamedTuple):
    """A timestamp column stored once (a row of ``chunk_timestamps``) for the chunks of every
    series scraped at those instants."""

    start_ms: int
    key: int
    end_ms: int
    n: int
    #: The timestamps as one pcodec chunk (metadata and page, under :data:`PCO_HEADER`).
    data: bytes


def timestamps_key(ts: I64) -> int:
    """The content key of a timestamp column: 64 bits of BLAKE2b over its little-endian
    words, as a signed int64 (a database's BIGINT)."""
    digest = hashlib.blake2b(np.ascontiguousarray(ts, _LE_I64).tobytes(), digest_size=8)
    return int.from_bytes(digest.digest(), "little", signed=True)


def _pack_column(column: I64 | F64) -> bytes:
    compressor, _, config = _pco()
    cc = compressor.chunk_compressor(column, config)
    meta: bytes = cc.write_meta()
    return meta + b"".join(cc.write_page(k) for k in range(len(cc.n_per_page())))


def compress_shared(
    chunks: Encoded, *, share_from_ms: int = I64_MIN, limit: int = MAX_CHUNK_BYTES,
) -> tuple[Encoded, list[SharedColumn]]:
    """:func:`compress`, but a chunk whose timestamp column recurs in ``chunks`` (the series
    of one target, scraped at the same instants) refers to it (:data:`FORMAT_PCO_SHARED`)
    instead of holding it: returns the chunks and the shared columns they refer to, one each,
    for ``chunk_timestamps``.  A piece of such a chunk (one over ``limit`` bytes is cut, see
    :func:`pieces`) refers to the whole chunk's column and its offset in it, so series whose
    values cut into other pieces share it all the same.

    Where a column does not recur (a series with samples missing, late or out of step) or
    starts before ``share_from_ms`` (what retention may be collecting, see
    ``store.retention``), the chunk holds its timestamps itself, as :func:`compress` writes.
    """
    if not len(chunks):
        return chunks, []
    words = np.frombuffer(chunks.buf, _LE_I64)
    cols: list[tuple[int, I64, F64, TsRef]] = []
    uses: dict[TsRef, int] = {}
    for sid, at, n in zip(chunks.ids.tolist(), (chunks.offsets // 8).tolist(),
                          chunks.n.tolist(), strict=True):
        ts = words[at : at + n]
        ref = (int(ts[0]), timestamps_key(ts))
        uses[ref] = uses.get(ref, 0) + 1
        cols.append((sid, ts, words[at + n : at + 2 * n].view(_LE_F64), ref))
    ids: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    ns: list[int] = []
    blobs: list[bytes] = []
    shared: dict[TsRef, SharedColumn] = {}
    for sid, ts, values, ref in cols:
        if uses[ref] < 2 or ref[0] < share_from_ms or len(ts) > _SHARED_MAX:
            parts = _inline_pieces(ts, values, limit)
        else:
            def packed(lo: int, hi: int, ts: I64 = ts, values: F64 = values,
                       key: int = ref[1]) -> bytes:
                return _SHARED_HEAD.pack(FORMAT_PCO_SHARED, key, int(ts[lo] - ts[0]),
                                         lo) + _pack_column(values[lo:hi])

            def raw(lo: int, hi: int, ts: I64 = ts, values: F64 = values) -> bytes:
                return _raw(ts[lo:hi], values[lo:hi])

            parts = pieces(len(ts), packed, raw, limit=limit)
            if ref not in shared and any(p[2][:1] == _SHARED_TAG for p in parts):
                shared[ref] = SharedColumn(ref[0], ref[1], int(ts[-1]), len(ts),
                                           _pack_column(ts))
        for lo, hi, part in parts:
            ids.append(sid)
            starts.append(int(ts[lo]))
            ends.append(int(ts[hi - 1]))
            ns.append(hi - lo)
            blobs.append(part)
    return from_pieces(ids, starts, ends, ns, blobs), list(shared.values())


def _raw(ts: I64, values: F64) -> bytes:
    return ts.astype(_LE_I64).tobytes() + values.astype(_LE_F64).tobytes()


def _inline_pieces(ts: I64, values: F64, limit: int) -> list[Piece]:
    """``ts``/``values`` as :func:`compress` stores them: pieces holding their timestamps."""
    prefix = bytes([FORMAT_PCO])

    def packed(lo: int, hi: int) -> bytes:
        return prefix + _pack_column(ts[lo:hi]) + _pack_column(values[lo:hi])

    return pieces(len(ts), packed, lambda lo, hi: _raw(ts[lo:hi], values[lo:hi]), limit=limit)


def shared_refs(starts: I64 | list[int], blobs: list[bytes]) -> set[TsRef]:
    """The shared timestamp columns (``(start_ms, key)``) the chunks starting at ``starts``
    with data ``blobs`` refer to."""
    out: set[TsRef] = set()
    for start, blob in zip(list(starts), blobs, strict=True):
        if blob[:1] == _SHARED_TAG and len(blob) >= _SHARED_HEAD.size:
            _, key, before, _ = _SHARED_HEAD.unpack_from(blob)
            out.add((int(start) - before, key))
    return out


def unpack_timestamps(data: bytes, n: int) -> I64:
    """A shared timestamp column (``chunk_timestamps.data``) of ``n`` samples."""
    _, decompressor, _ = _pco()
    out = np.empty(n, np.int64)
    try:
        cd, used = decompressor.chunk_decompressor(data, "i64")
        progress, used2 = cd.read_page_into(data[used:], n, out)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"a shared timestamp column of {n} samples is damaged: {exc}") from exc
    if progress.n_processed != n or used + used2 != len(data):
        raise ValueError(f"a shared timestamp column of {n} samples is damaged")
    return out


def is_raw(size: int, n: int) -> bool:
    """Whether a chunk of ``n`` samples whose data is ``size`` bytes is stored raw."""
    return size == 16 * n


def _unpack(blob: bytes, n: int, start: int | None = None,
            shared: Mapping[TsRef, I64] | None = None) -> tuple[I64, F64]:
    """The timestamps and values of one compressed chunk (starting at ``start``; its shared
    timestamp column, if it refers to one, in ``shared``)."""
    if blob and blob[0] == FORMAT_PCO_SHARED:
        return _unpack_shared(blob, n, start, shared)
    if not blob or blob[0] != FORMAT_PCO:
        what = f"format byte {blob[0]}" if blob else "empty"
        raise ValueError(
            f"a sample chunk of {n} samples holds {len(blob)} bytes: neither raw (expected "
            f"{16 * n}) nor compressed ({what})"
        )
    _, decompressor, _ = _pco()
    rest = blob[1:]  # pcodec takes bytes only: slices (copies) of a few hundred bytes
    ts = np.empty(n, np.int64)
    values = np.empty(n, np.float64)
    try:
        for dtype, column in (("i64", ts), ("f64", values)):
            cd, used = decompressor.chunk_decompressor(rest, dtype)
            rest = rest[used:]
            progress, used = cd.read_page_into(rest, n, column)
            rest = rest[used:]
            if progress.n_processed != n:
                raise ValueError(f"holds {progress.n_processed} samples")
        if rest:
            raise ValueError(f"has {len(rest)} bytes after its values")
    except (RuntimeError, TypeError) as exc:  # pcodec's errors on damaged data
        raise ValueError(f"a compressed sample chunk of {n} samples is damaged: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"a compressed sample chunk of {n} samples {exc}") from exc
    return ts, values


def _unpack_shared(blob: bytes, n: int, start: int | None,
                   shared: Mapping[TsRef, I64] | None) -> tuple[I64, F64]:
    if len(blob) < _SHARED_HEAD.size:
        raise ValueError(f"a compressed sample chunk of {n} samples is damaged: "
                         f"{len(blob)} bytes")
    _, key, before, offset = _SHARED_HEAD.unpack_from(blob)
    column = None if shared is None or start is None else shared.get((start - before, key))
    if column is None or offset + n > len(column) or column[offset] != start:
        raise ValueError(
            f"a sample chunk of {n} samples starting at {start} ms refers to a shared "
            f"timestamp column ({key}, from sample {offset}) that was not found"
            + ("" if column is None else f" to hold them ({len(column)} samples)"))
    ts = column[offset : offset + n]
    _, decompressor, _ = _pco()
    rest = blob[_SHARED_HEAD.size :]
    values = np.empty(n, np.float64)
    try:
        cd, used = decompressor.chunk_decompressor(rest, "f64")
        progress, used2 = cd.read_page_into(rest[used:], n, values)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"a compressed sample chunk of {n} samples is damaged: {exc}") from exc
    if progress.n_processed != n or used + used2 != len(rest):
        raise ValueError(f"a compressed sample chunk of {n} samples is damaged")
    return ts, values


def columns(ns: I64, blobs: list[bytes], *, starts: I64 | None = None,
            shared: Mapping[TsRef, I64] | None = None) -> tuple[I64, F64]:
    """The timestamps and values of the chunks (``ns[i]`` samples in ``blobs[i]``, raw or
    compressed) one after the other.  A chunk referring to a shared timestamp column
    (:data:`FORMAT_PCO_SHARED`) needs its start (``starts[i]``) and that column in ``shared``
    (``store.query.shared_timestamps`` reads them).  Raises ValueError on data that is
    neither, or a shared column not given."""
    total = int(ns.sum())
    sizes = np.fromiter(map(len, blobs), np.int64, len(blobs))
    raw = sizes == 16 * ns
    if raw.all():
        # Every chunk raw: one gather, as before compression.
        words = np.frombuffer(b"".join(blobs), _LE_I64)
        first = np.cumsum(ns) - ns
        at = np.repeat(first, ns) + np.arange(total, dtype=np.int64)
        ts = words[at].astype(np.int64, copy=False)
        values = words[at + np.repeat(ns, ns)].view(_LE_F64).astype(np.float64, copy=False)
        return ts, values
    ts = np.empty(total, np.int64)
    values = np.empty(total, np.float64)
    pos = 0
    start_list: list[int | None] = [None] * len(blobs) if starts is None else starts.tolist()
    for blob, n, is_raw_chunk, start in zip(blobs, ns.tolist(), raw.tolist(), start_list,
                                            strict=True):
        if is_raw_chunk:
            words = np.frombuffer(blob, _LE_I64)
            ts[pos : pos + n] = words[:n]
            values[pos : pos + n] = words[n:].view(_LE_F64)
        else:
            ts[pos : pos + n], values[pos : pos + n] = _unpack(blob, n, start, shared)
        pos += n
    return ts, values


def merge(
    ids: I64,
    seqs: I64,
    starts: I64,
    ns: I64,
    blobs: list[bytes],
    *,
    lo_ms: int = I64_MIN,
    hi_ms: int = I64_MAX,
    shared: Mapping[TsRef, I64] | None = None,
) -> Merged:
    """Decode chunks (given as parallel columns, in any order) into their samples in
    ``[lo_ms, hi_ms]``, keeping the last write of each ``(id, ts)`` (see the module docstring).

    Raises ValueError if a chunk's data is neither raw ``16 * n`` bytes nor a compressed
    chunk of ``n`` samples, or refers to a shared timestamp column not in ``shared``.
    """
    if not len(ids):
        return Merged(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
    order = np.lexsort((starts, seqs, ids))  # series, then write order
    counts = ns[order]
    ts, values = columns(counts, [blobs[i] for i in order.tolist()], starts=starts[order],
                         shared=shared)
    sids = np.repeat(ids[order], counts)
    keep = (ts >= lo_ms) & (ts <= hi_ms)
    if not keep.all():
        sids, ts, values = sids[keep], ts[keep], values[keep]
    if len(ts) > 1:
        same = sids[1:] == sids[:-1]
        if not ((sids[1:] > sids[:-1]) | (same & (ts[1:] > ts[:-1]))).all():
            # Overlapping chunks.
            return sort_keep_last(sids, ts, values)
    return Merged(sids, ts, values)


def decode(ids: I64, seqs: I64, ns: I64, blobs: list[bytes], *, starts: I64 | None = None,
           shared: Mapping[TsRef, I64] | None = None) -> tuple[I64, I64, F64, I64]:
    """Every sample of the chunks given as parallel columns: ``(ids, ts, values, seqs)``,
    grouped by chunk in the given order.  Raises ValueError as :func:`merge` does."""
    ts, values = columns(ns, blobs, starts=starts, shared=shared)
    return np.repeat(ids, ns), ts, values, np.repeat(seqs, ns)


def last_writes(ids: I64, ts: I64, values: F64, seqs: I64, *, lo_ms: int, hi_ms: int) -> Merged:
    """Samples in ``[lo_ms, hi_ms]`` sorted by ``(id, ts)``, keeping of equal keys the one of
    the highest ``seq`` (of equal ``seq``, the one given last)."""
    keep = (ts >= lo_ms) & (ts <= hi_ms)
    if not keep.all():
        ids, ts, values, seqs = ids[keep], ts[keep], values[keep], seqs[keep]
    return _last_of_each_key(np.lexsort((seqs, ts, ids)), ids, ts, values)


def sort_keep_last(ids: I64, ts: I64, values: F64) -> Merged:
    """Samples sorted by ``(id, ts)``, keeping of equal keys the one given last (the sort is
    stable, so the last in the input order ends up last and is kept)."""
    return _last_of_each_key(np.lexsort((ts, ids)), ids, ts, values)


def _last_of_each_key(order: I64, ids: I64, ts: I64, values: F64) -> Merged:
    """The samples in ``order`` (sorted by ``(id, ts)``), keeping the last of equal keys."""
    ids, ts, values = ids[order], ts[order], values[order]
    last = np.ones(len(ts), bool)
    last[:-1] = (ids[1:] != ids[:-1]) | (ts[1:] != ts[:-1])
    if not last.all():
        ids, ts, values = ids[last], ts[last], values[last]
    return Merged(ids, ts, values)
