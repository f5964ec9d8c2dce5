"""Statements of the write path: resolving series ids, and storing a batch of samples as chunks.

Functions here take a connection already inside a transaction; ``store.store.Store`` owns the
buffer, the series cache and the retry policy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
from sqlalchemy import Connection, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite

from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Labels, labels_json
from tritonwatch.store.chunks import Encoded

SeriesKeyTuple = tuple[str, str, Labels]  # (target, name, labels): the series cache key

#: A layout position whose series has no id yet (never resolved, or only ever NaN).
UNRESOLVED = -1
#: A layout position whose series the target's series limit refused: its samples are dropped,
#: and it is not resolved again until the layout is (its TTL, retention).
REFUSED = -2

#: Arbitrary constant key for pg_advisory_xact_lock: serialises rollups, compaction and
#: retention of concurrent processes; flushes take it in shared mode.
PG_LOCK_ROLLUP = 0x7477_0001


def dialect_insert(conn: Connection, table: Table) -> Any:
    """``INSERT`` with ``ON CONFLICT`` support for the connection's backend."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def get_meta(conn: Connection, key: str) -> str | None:
    """The value of ``key`` in ``meta`` (the store's own settings and watermarks), if set."""
    return conn.execute(select(t.meta.c.value).where(t.meta.c.key == key)).scalar_one_or_none()


def set_meta(conn: Connection, key: str, value: str) -> None:
    stmt = dialect_insert(conn, t.meta).values(key=key, value=value)
    conn.execute(stmt.on_conflict_do_update(index_elements=[t.meta.c.key], set_={"value": value}))


def resolve_series(
    conn: Connection, keys: Iterable[SeriesKeyTuple], *, now_ms: int
) -> dict[SeriesKeyTuple, int]:
    """Ids for ``keys``, creating the series that do not exist yet.

    One upsert for the whole batch.  ``ON CONFLICT`` makes two writers creating the same series
    at once safe (the loser gets the winner's id), the keys are sorted so that two writers
    lock index entries in the same order and cannot deadlock, and the ``DO UPDATE`` of
    ``resolved_at`` (rather than ``DO NOTHING``) both returns the existing row's id and tells
    retention the series is in use (see ``maintenance.delete_empty_series``).
    """
    ordered = sorted(set(keys))
    if not ordered:
        return {}
    texts = [labels_json(labels) for _, _, labels in ordered]
    # Deduplicated on the stored text: PostgreSQL refuses to upsert one row twice per statement.
    params = [
        {"target": target, "name": name, "labels": text, "resolved_at": now_ms}
        for target, name, text in sorted(
            {(k[0], k[1], text) for k, text in zip(ordered, texts, strict=True)}
        )
    ]
    stmt = dialect_insert(conn, t.series)
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.series.c.target, t.series.c.name, t.series.c.labels],
        set_={"resolved_at": stmt.excluded.resolved_at},
    ).returning(t.series.c.id, t.series.c.target, t.series.c.name, t.series.c.labels)
    by_text = {(r.target, r.name, r.labels): r.id for r in conn.execute(stmt, params)}
    # Keyed by the caller's label tuples: two tuples with the same canonical JSON (say, one
    # not sorted) share one row.
    return {key: by_text[(key[0], key[1], text)] for key, text in zip(ordered, texts, strict=True)}


def resolve_owners(
    conn: Connection, keys: Iterable[tuple[str, str]], *, now_ms: int
) -> dict[tuple[str, str], int]:
    """Ids of the ``(target, name)`` pairs ``keys`` (``sample_log.owner``), creating those that
    do not exist yet: one upsert, as :func:`resolve_series` (sorted, the winner's id to the
    loser, ``resolved_at`` refreshed for retention)."""
    ordered = sorted(set(keys))
    if not ordered:
        return {}
    o = t.sample_log_owners
    stmt = dialect_insert(conn, o)
    stmt = stmt.on_conflict_do_update(
        index_elements=[o.c.target, o.c.name], set_={"resolved_at": stmt.excluded.resolved_at},
    ).returning(o.c.id, o.c.target, o.c.name)
    params = [{"target": target, "name": name, "resolved_at": now_ms}
              for target, name in ordered]
    return {(r.target, r.name): r.id for r in conn.execute(stmt, params)}


def within_series_limits(
    conn: Connection, keys: Sequence[SeriesKeyTuple], *, limits: Mapping[str, int]
) -> tuple[list[SeriesKeyTuple], list[SeriesKeyTuple]]:
    """``keys`` split into those :func:`resolve_series` may resolve and those it must not: new
    series that would take a target in ``limits`` past its number of series in the store.

    ``keys`` are sorted (each target's together).  Targets whose stored series plus every key
    asked for fit their limits cost one ``count`` query for all of them; only a target at its
    limit reads its stored series (about ``limit`` rows) to tell the existing ones, which are
    always allowed, from the new ones, which get what room is left, in key order.
    """
    limited = sorted({k[0] for k in keys if k[0] in limits})
    if not limited:
        return list(keys), []
    sr = t.series
    counts: dict[str, int] = {
        row[0]: int(row[1])
        for row in conn.execute(
            select(sr.c.target, func.count()).where(sr.c.target.in_(limited))
            .group_by(sr.c.target)
        )
    }
    allowed: list[SeriesKeyTuple] = []
    refused: list[SeriesKeyTuple] = []
    for target, group in groupby(keys, key=itemgetter(0)):
        tkeys = list(group)
        limit = limits.get(target)
        stored = counts.get(target, 0)
        if limit is None or stored + len(tkeys) <= limit:
            allowed += tkeys
            continue
        existing = {
            (row[0], row[1])
            for row in conn.execute(select(sr.c.name, sr.c.labels).where(sr.c.target == target))
        }
        room = limit - stored
        for key in tkeys:
            if (key[1], labels_json(key[2])) in existing:
                allowed.append(key)
            elif room > 0:
                allowed.append(key)
                room -= 1
            else:
                refused.append(key)
    return allowed, refused


class Layout:
    """The series of one target's scrape, in the order the scrape lists them, with their ids.

    A target exposes the same series in the same order scrape after scrape, so the store keeps
    its last layout and builds the next one block by block: a block whose names and label
    tuples compare equal to the same block of the previous layout (list comparisons in C,
    mostly identity checks: the collector hands over the same lists and tuples each scrape)
    takes its ids without hashing a single label tuple.  Only blocks that changed (typically
    the derived SLIs at the end, whose set varies with traffic) look their keys up, in the
    previous layout first; whatever is still unknown is resolved in the database.

    There is no store-wide key → id cache: the layouts are the cache, at 8 bytes per series
    (the name and label lists are the collector's own), where a dict keyed by
    ``(target, name, labels)`` cost ~130 bytes per series (75 MB at 1,000 targets).
    ``born`` is when the oldest of its ids was resolved (monotonic seconds).
    """

    __slots__ = ("_by_name", "_codes", "born", "ids", "labels", "names", "owners", "refused",
                 "target", "unresolved")

    BLOCK = 256
    ids: npt.NDArray[np.int64]
    born: float

    def __init__(
        self,
        target: str,
        names: list[str],
        labels: list[Labels],
        prev: Layout | None = None,
        *,
        now: float,
    ) -> None:
        self.target = target
        self.names = names
        self.labels = labels
        self.born = now if prev is None else prev.born
        n = len(names)
        ids = np.empty(n, np.int64)
        prev_ids: npt.NDArray[np.int64] = ids if prev is None else prev.ids
        index: dict[tuple[str, Labels], int] | None = None
        b = self.BLOCK
        for lo in range(0, n, b):
            hi = min(lo + b, n)
            if (
                prev is not None
                and len(prev.names) >= hi
                and prev.names[lo:hi] == names[lo:hi]
                and prev.labels[lo:hi] == labels[lo:hi]
            ):
                ids[lo:hi] = prev_ids[lo:hi]
            elif prev is None:
                ids[lo:hi] = UNRESOLVED
            else:
                if index is None:
                    index = dict(zip(zip(prev.names, prev.labels, strict=True),
                                     prev.ids.tolist(), strict=True))
                keys = zip(names[lo:hi], labels[lo:hi], strict=True)
                ids[lo:hi] = np.fromiter(
                    map(index.get, keys, repeat(UNRESOLVED)), np.int64, hi - lo
                )
        self.ids = ids
        #: Positions without an id yet (UNRESOLVED): series only ever seen as NaN, or not
        #: created yet; and positions the series limit refused (REFUSED, never resolved again
        #: by this layout).
        self.unresolved = int(np.count_nonzero(ids == UNRESOLVED))
        self.refused = int(np.count_nonzero(ids == REFUSED))
        # What the flushes reuse, kept small: a fleet holds one layout per target (1,000 x 566
        # series), so each int64 array kept per layout costs ~4.5 MB.  Positions and name codes
        # are int32 (a layout never holds 2**31 series); the arrays derived from them and the
        # ids (``ids[positions]``, the sorted ids) are rebuilt per flush, a few microseconds.
        self._by_name: npt.NDArray[np.int32] | None = None
        self._codes: tuple[npt.NDArray[np.int32], list[str]] | None = None
        #: The ``sample_log`` owner of each name of :meth:`name_codes` (``store.flush``
        #: resolves them before the layout's first flush).
        self.owners: npt.NDArray[np.int64] | None = None

    def same(self, names: list[str], labels: list[Labels]) -> bool:
        # Identity first: list equality walks every item even for the list itself.
        return (names is self.names or names == self.names) and (
            labels is self.labels or labels == self.labels
        )

    def keys_at(self, positions: Iterable[int]) -> Iterator[SeriesKeyTuple]:
        target, names, labels = self.target, self.names, self.labels
        return ((target, names[i], labels[i]) for i in positions)

    def fill(self, resolved: Mapping[SeriesKeyTuple, int]) -> None:
        """Take the ids still missing from ``resolved``."""
        holes = np.flatnonzero(self.ids == UNRESOLVED)
        self.ids[holes] = np.fromiter(
            map(resolved.get, self.keys_at(holes.tolist()), repeat(UNRESOLVED)), np.int64,
            len(holes),
        )
        self.unresolved = int(np.count_nonzero(self.ids == UNRESOLVED))
        self.refused = int(np.count_nonzero(self.ids == REFUSED))
        self._by_name = None

    def name_codes(self) -> tuple[npt.NDArray[np.int32], list[str]]:
        """``(codes, names)``: each position's name as an index in ``names`` (the distinct
        names, in order of first appearance).  Kept: a layout's names never change."""
        if self._codes is None:
            index: dict[str, int] = {}
            codes = np.fromiter(
                (index.setdefault(name, len(index)) for name in self.names),
                np.int32, len(self.names),
            )
            self._codes = codes, list(index)
        return self._codes

    def name_index(self) -> NameIndex:
        """``(ids, codes, owners)``: the ids in ascending order, and for each the index in
        ``owners`` of its series' log owner (its name's).  Built per call (only a flush that
        cannot take :meth:`name_order` asks)."""
        codes, _ = self.name_codes()
        order = np.argsort(self.ids, kind="stable")
        return self.ids[order], codes[order].astype(np.int64), self._owners()

    def _owners(self) -> npt.NDArray[np.int64]:
        if self.owners is None:
            raise ValueError(f"the layout of {self.target!r} has no log owners resolved")
        return self.owners

    def name_order(self) -> NameOrder | None:
        """The positions grouped by name, in ascending id order within a name (what a flush's
        log rows, one per name, want), or None when two positions share an id (a series
        listed twice).  The grouping is kept until the ids change."""
        positions = self._by_name
        if positions is None:
            ids = np.sort(self.ids)
            if ((ids[1:] == ids[:-1]) & (ids[1:] >= 0)).any():
                positions = np.empty(0, np.int32)
            else:
                positions = np.lexsort((self.ids, self.name_codes()[0])).astype(np.int32)
            self._by_name = positions
        if len(positions) != len(self.ids):
            return None
        codes, _ = self.name_codes()
        return NameOrder(positions, self.ids[positions], codes[positions].astype(np.int64),
                         self._owners())


#: ``(ids, codes, owners)``: series ids in ascending order, and for each the index in
#: ``owners`` of its ``sample_log`` owner.
NameIndex = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


class NameOrder(NamedTuple):
    """A layout's positions grouped by name (:meth:`Layout.name_order`)."""

    positions: npt.NDArray[np.int32]
    ids: npt.NDArray[np.int64]  # the ids at ``positions``
    codes: npt.NDArray[np.int64]  # their names, as indices in ``owners``
    owners: npt.NDArray[np.int64]  # each name's ``sample_log`` owner


class SampleColumns(NamedTuple):
    """Samples of some targets as the columns a flush's log rows are built from: each series'
    samples together and in time order, and ``rows``, each sample's log row (an index in
    ``owners``, which holds that row's ``sample_log`` owner: its target and name)."""

    ids: npt.NDArray[np.int64]
    ts: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    rows: npt.NDArray[np.int64]
    owners: npt.NDArray[np.int64]

    def take(self, keep: npt.NDArray[np.bool_] | npt.NDArray[np.int64]) -> SampleColumns:
        """The samples ``keep`` selects (a mask or positions), owners unchanged."""
        return SampleColumns(self.ids[keep], self.ts[keep], self.values[keep], self.rows[keep],
                             self.owners)


_Work = TypeVar("_Work", bound=tuple[Any, ...])


def target_groups(work: Iterable[_Work], limit: int) -> Iterator[list[_Work]]:
    """``work`` (items whose first field is a :class:`Layout`) in groups of whole targets,
    each holding at least ``limit`` samples except the last.

    Every item of a target lands in the same group, in its original order: a series belongs
    to one target, so each group holds all of its series' samples.  Targets keep the order of
    their first item.
    """
    by_target: dict[str, list[_Work]] = {}
    for item in work:
        by_target.setdefault(item[0].target, []).append(item)
    group: list[_Work] = []
    size = 0
    for items in by_target.values():
        group.extend(items)
        size += sum(len(item[0].ids) for item in items)
        if size >= limit:
            yield group
            group, size = [], 0
    if group:
        yield group


def name_index(layouts: Sequence[Layout]) -> NameIndex:
    """:meth:`Layout.name_index` of several layouts of one target (its series changed within
    one flush) together."""
    if len(layouts) == 1:
        return layouts[0].name_index()
    owners: dict[int, int] = {}
    ids, codes = [], []
    for lay in layouts:
        lay_ids, lay_codes, lay_owners = lay.name_index()
        remap = np.array([owners.setdefault(o, len(owners)) for o in lay_owners.tolist()],
                         np.int64)
        ids.append(lay_ids)
        codes.append(remap[lay_codes])
    all_ids = np.concatenate(ids)
    order = np.argsort(all_ids, kind="stable")
    return all_ids[order], np.concatenate(codes)[order], np.array(list(owners), np.int64)


def sample_columns(
    work: Sequence[tuple[Layout, int, npt.NDArray[np.float64]]],
) -> SampleColumns | None:
    """A flush's samples (scrapes given as ``(layout, ts_ms, values)``) as columns for its log
    rows, without sorting them, or None when that needs a sort.

    A steady flush holds a few scrapes of each target, each with that target's one layout:
    the samples of a layout are then a (scrapes x series) matrix, and reading it by column in
    the layout's name order (:meth:`Layout.name_order`) gives each series' samples together,
    in time order, and each name's series together.  Layouts of different targets hold
    different series, so no series spans two of them.  That replaces a lexsort of every
    sample of the flush (64 ms for 864k samples) with copies.  Declined (None): no scrapes, a
    target with two layouts in the flush (its series changed), scrapes of a layout not in
    strictly increasing time order, a series listed twice.  NaN samples are kept here (the
    caller drops them).
    """
    groups: dict[int, tuple[Layout, list[int], list[npt.NDArray[np.float64]]]] = {}
    targets: dict[str, int] = {}
    for lay, ts_ms, values in work:
        if targets.setdefault(lay.target, id(lay)) != id(lay):
            return None
        group = groups.get(id(lay))
        if group is None:
            groups[id(lay)] = (lay, [ts_ms], [values])
            continue
        if ts_ms <= group[1][-1]:
            return None
        group[1].append(ts_ms)
        group[2].append(values)
    ids, tss, vals, rows, owners = [], [], [], [], []
    codes = 0  # owners listed so far
    for lay, stamps, scrapes in groups.values():
        by_name = lay.name_order()
        if by_name is None:
            return None
        order = by_name.positions
        k = len(stamps)
        if k == 1:  # a fleet's flush: one scrape per target
            ids.append(by_name.ids)
            tss.append(np.full(len(order), stamps[0], np.int64))
            vals.append(scrapes[0][order])
            rows.append(by_name.codes + codes)
        else:
            ids.append(np.repeat(by_name.ids, k))
            tss.append(np.tile(np.array(stamps, np.int64), len(order)))
            vals.append(np.vstack(scrapes)[:, order].T.ravel())
            rows.append(np.repeat(by_name.codes + codes, k))
        owners.append(by_name.owners)
        codes += len(by_name.owners)
    if not ids:
        return None
    return SampleColumns(np.concatenate(ids), np.concatenate(tss), np.concatenate(vals),
                         np.concatenate(rows), np.concatenate(owners))


def next_seq(conn: Connection) -> int:
    """A write sequence number greater than every one taken before (see ``store.chunks``).

    On PostgreSQL the flush first takes the rollup lock in shared mode: compaction, which
    holds it exclusively, then never runs while a flush holds a number it has not committed
    yet (see ``maintenance.compact``).  On SQLite write transactions are serialised already.
    """
    if conn.dialect.name == "postgresql":
        value = conn.exec_driver_sql(
            "SELECT nextval('sample_chunks_seq') "
            f"FROM (SELECT pg_advisory_xact_lock_shared({PG_LOCK_ROLLUP:d})) AS rollup_lock"
        ).scalar_one()
    else:
        value = conn.exec_driver_sql(
            "INSERT INTO meta (key, value) VALUES ('chunk_seq', '1') ON CONFLICT (key) "
            "DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) RETURNING value"
        ).scalar_one()
    return int(value)


#: Rows per ``executemany`` on SQLite, and per piece of a COPY on PostgreSQL (one transaction,
#: one statement still holds them all).
_SQLITE_ROWS = 16_384
_COPY_ROWS = 65_536


def insert_chunks(
    conn: Connection, chunks: Encoded, seq: int | npt.NDArray[np.int64], *,
    table: str = "sample_chunks",
) -> None:
    """Insert ``chunks`` with write sequence ``seq`` (one for all, or one per chunk) into
    ``table`` (``sample_chunks``, or a rollup chunk table of the same columns).

    Plain inserts: the caller guarantees the keys are new.  SQLite: one ``executemany``.
    PostgreSQL: one binary COPY (:func:`copy_stream`: 62 bytes of row header per chunk, then
    the chunk's data as it is).  ``chunks`` may be raw or compressed (``store.chunks``).
    """
    if not len(chunks):
        return
    raw = conn.connection.driver_connection
    assert raw is not None
    if conn.dialect.name != "postgresql":
        seq_all = np.broadcast_to(np.asarray(seq, np.int64), chunks.ids.shape)
        # A slice of rows at a time: as Python objects a row costs ~200 bytes, so a fleet's
        # flush of 566k chunks built whole was a 130 MB spike every flush interval.
        for lo in range(0, len(chunks), _SQLITE_ROWS):
            hi = lo + _SQLITE_ROWS
            raw.executemany(
                f"INSERT INTO {table} (series_id, start_ms, seq, end_ms, n, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                zip(chunks.ids[lo:hi].tolist(), chunks.start_ms[lo:hi].tolist(),
                    seq_all[lo:hi].tolist(), chunks.end_ms[lo:hi].tolist(),
                    chunks.n[lo:hi].tolist(), chunks.blobs(lo, hi), strict=True),
            )
        return
    with raw.cursor() as cur, cur.copy(
        f"COPY {table} (series_id, start_ms, seq, end_ms, n, data) FROM STDIN "
        "(FORMAT BINARY)"
    ) as cp:
        cp.write(PG_COPY_HEADER)
        for lo in range(0, len(chunks), _COPY_ROWS):  # bounded memory, as on SQLite
            cp.write(copy_rows(chunks, seq, lo, min(lo + _COPY_ROWS, len(chunks))))
        cp.write(PG_COPY_TRAILER)


# PostgreSQL binary COPY: a header, then per row a field count and (length, big-endian value)
# per field (a bytea's value is its bytes as they are), then a trailer.
PG_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
PG_COPY_TRAILER = b"\xff\xff"
# Field count; series_id, start_ms, seq, end_ms (int8); n (int4); the length of data.
_PG_ROW_HEADER = struct.Struct(">h" + "iq" * 4 + "ii" + "i")
# The same header as numpy fields (packed, big-endian), followed by a chunk's data.
_PG_ROW_FIELDS = [
    ("fields", ">i2"),
    ("len_id", ">i4"), ("series_id", ">i8"),
    ("len_start", ">i4"), ("start_ms", ">i8"),
    ("len_seq", ">i4"), ("seq", ">i8"),
    ("len_end", ">i4"), ("end_ms", ">i8"),
    ("len_n", ">i4"), ("n", ">i4"),
    ("len_data", ">i4"),
]


def copy_stream(chunks: Encoded, seq: int | npt.NDArray[np.int64]) -> bytes:
    """The binary COPY stream of ``chunks`` (rows of ``sample_chunks``), built column-wise:
    the header, :func:`copy_rows` of every chunk, the trailer."""
    return PG_COPY_HEADER + copy_rows(chunks, seq, 0, len(chunks)) + PG_COPY_TRAILER


def copy_rows(chunks: Encoded, seq: int | npt.NDArray[np.int64], lo: int, hi: int) -> bytes:
    """The binary COPY rows of chunks ``lo`` to ``hi``.

    Rows may go in any order, so the chunks are taken a group of equal sample counts and data
    sizes at a time (one or two groups in a steady flush of raw chunks): each group is one
    numpy record array, header fields and data together, with no Python work per row.
    ``copy_stream_rows`` builds the same stream row by row; a differential test holds them
    equal.
    """
    seqs = np.broadcast_to(np.asarray(seq, np.int64), chunks.ids.shape)
    data = np.frombuffer(chunks.buf, np.uint8)
    parts = []
    counts, sizes = chunks.n[lo:hi], chunks.sizes[lo:hi]
    # One group per distinct (n, size): compressed chunks of one size mostly share n too.
    keys = counts * (1 << 32) + sizes
    for key in np.unique(keys).tolist():
        n, size = key >> 32, key & 0xFFFFFFFF
        rows = lo + np.flatnonzero(keys == key)
        rec = np.empty(len(rows), [*_PG_ROW_FIELDS, ("data", f"V{size}")])
        rec["fields"] = 6
        rec["len_id"] = rec["len_start"] = rec["len_seq"] = rec["len_end"] = 8
        rec["len_n"] = 4
        rec["len_data"] = size
        rec["series_id"] = chunks.ids[rows]
        rec["start_ms"] = chunks.start_ms[rows]
        rec["seq"] = seqs[rows]
        rec["end_ms"] = chunks.end_ms[rows]
        rec["n"] = n
        at = chunks.offsets[rows]
        if len(rows) == 1:
            rec["data"] = data[int(at[0]) : int(at[0]) + size].view(f"V{size}")
        elif size % 16 == 0 and not (at % 16).any():
            # Raw chunks: 16-byte units, a gather of 16 * len(rows) words' worth of units.
            units = data[: len(data) // 16 * 16].view("V16")
            first = at // 16
            rec["data"] = units[(first[:, None] + np.arange(size // 16)).ravel()].view(
                f"V{size}")
        else:
            rec["data"] = data[(at[:, None] + np.arange(size)).ravel()].view(f"V{size}")
        parts.append(rec.tobytes())
    return b"".join(parts)


def copy_stream_rows(chunks: Encoded, seq: int | npt.NDArray[np.int64]) -> bytes:
    """:func:`copy_stream` row by row, in chunk order (the reference for its test)."""
    seqs = np.broadcast_to(np.asarray(seq, np.int64), chunks.ids.shape).tolist()
    pack = _PG_ROW_HEADER.pack
    data = memoryview(chunks.buf)
    parts: list[bytes | memoryview] = [PG_COPY_HEADER]
    for sid, start, sq, end, n, at, size in zip(
        chunks.ids.tolist(), chunks.start_ms.tolist(), seqs, chunks.end_ms.tolist(),
        chunks.n.tolist(), chunks.offsets.tolist(), chunks.sizes.tolist(), strict=True,
    ):
        parts.append(pack(6, 8, sid, 8, start, 8, sq, 8, end, 4, n, size))
        parts.append(data[at : at + size])
    parts.append(PG_COPY_TRAILER)
    return b"".join(parts)
