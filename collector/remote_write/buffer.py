"""A bounded on-disk queue of encoded remote-write requests: a directory of segment files.

Each shard of each receiver has one directory.  Records are appended to the newest segment
(``<seq>.seg``, a new one every ``segment_size`` bytes); the sender reads them in order and
commits each once the receiver has answered for it.  A fully sent segment is deleted; the
read position (segment and offset) is kept in ``position`` (replaced atomically after every
commit) so a restart resumes where the last one stopped.  A crash between a send and its
commit re-sends that one request: receivers take a sample they already hold (same series,
timestamp and value) without a duplicate.

Record layout (little-endian)::

    u32 payload length | u32 CRC-32 of the payload | u32 samples | i64 oldest sample (ms)
    | payload (a snappy-compressed WriteRequest, exactly the HTTP body)

A record torn by a crash (short, or failing its CRC) ends its segment: what follows is
skipped, and the writer never appends after it (a new start opens a new segment).

Bounded: the directory never holds more than ``max_bytes``.  An append that would pass it
deletes the oldest segments first (whole; the one being read too), and their unsent samples
are counted as dropped, so a long outage keeps the newest data, as Prometheus's WAL does.

Thread-safe: the collector's worker threads append while the shard's sender reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IIIq")
#: A record's payload, at most (a request of 100,000 samples compresses to far less).
MAX_RECORD_BYTES = 256 * 1024**2
_POSITION = "position"
_SUFFIX = ".seg"


@dataclass(frozen=True)
class Record:
    """One request as read back: its body and where the next record starts."""

    payload: bytes
    samples: int
    oldest_ms: int
    seq: int
    end: int


@dataclass
class _Segment:
    seq: int
    size: int = 0
    #: (end offset, samples, oldest ms) per record, in order.
    records: list[tuple[int, int, int]] = field(default_factory=list)
    torn: bool = False


class SegmentBuffer:
    """The queue of one shard (see the module docstring)."""

    def __init__(self, directory: Path, *, max_bytes: int, segment_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.dropped_samples = 0
        self._lock = threading.Lock()
        self._file: int | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self._segments: list[_Segment] = [self._scan(seq) for seq in self._list()]
        self._read_seq, self._read_off = self._load_position()
        # Never append to a segment found on disk: its tail may be torn.
        self._next_seq = (self._segments[-1].seq + 1) if self._segments else 1
        self._forget_sent()

    # --- state -----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    def pending(self) -> tuple[int, int | None]:
        """(samples not yet committed, oldest such sample in ms or None)."""
        with self._lock:
            samples, oldest = 0, None
            for seg in self._segments:
                for end, count, first in seg.records:
                    if (seg.seq, end) <= (self._read_seq, self._read_off):
                        continue
                    samples += count
                    oldest = first if oldest is None else min(oldest, first)
            return samples, oldest

    # --- writing ---------------------------------------------------------------------------

    def append(self, payload: bytes, samples: int, oldest_ms: int) -> None:
        """Add one record; drops the oldest segments first if the bound would be passed.

        Raises OSError when the disk refuses (the caller counts those samples dropped).
        """
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"a record of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
        record = _HEADER.pack(len(payload), zlib.crc32(payload), samples, oldest_ms) + payload
        with self._lock:
            current = self._segments[-1] if self._file is not None else None
            if current is None or current.size + len(record) > self.segment_bytes:
                current = self._rotate()
            self._make_room(len(record))
            assert self._file is not None
            os.write(self._file, record)
            current.size += len(record)
            current.records.append((current.size, samples, oldest_ms))

    def _rotate(self) -> _Segment:
        if self._file is not None:
            os.close(self._file)
            self._file = None
        seg = _Segment(self._next_seq)
        self._next_seq += 1
        self._file = os.open(self._path(seg.seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND
                             | os.O_CLOEXEC, 0o600)
        self._segments.append(seg)
        return seg

    def _make_room(self, need: int) -> None:
        total = sum(s.size for s in self._segments)
        # The segment being written (the last) is never dropped: the bound holds at least two.
        while total + need > self.max_bytes and len(self._segments) > 1:
            seg = self._segments.pop(0)
            total -= seg.size
            lost = sum(count for end, count, _ in seg.records
                       if (seg.seq, end) > (self._read_seq, self._read_off))
            self.dropped_samples += lost
            if lost:
                log.warning("remote-write buffer %s is full (%d bytes): dropped its oldest "
                            "segment, %d unsent samples", self.dir, self.max_bytes, lost)
            with contextlib.suppress(FileNotFoundError):
                self._path(seg.seq).unlink()
            if (self._read_seq, self._read_off) < (seg.seq + 1, 0):
                self._read_seq, self._read_off = seg.seq + 1, 0

    # --- reading ---------------------------------------------------------------------------

    def peek(self) -> Record | None:
        """The oldest record not yet committed, or None when everything is sent."""
        with self._lock:
            for seg in self._segments:
                if seg.seq < self._read_seq:
                    continue
                offset = self._read_off if seg.seq == self._read_seq else 0
                nxt = next(((end, count, first) for end, count, first in seg.records
                            if end > offset), None)
                if nxt is None:
                    continue
                end, count, first = nxt
                with open(self._path(seg.seq), "rb") as f:
                    f.seek(offset)  # a record starts where the one before it ended
                    raw = f.read(end - offset)
                payload = raw[_HEADER.size:]
                return Record(payload, count, first, seg.seq, end)
            return None

    def commit(self, record: Record) -> None:
        """``record`` is sent (or refused for good): move past it, delete what is done."""
        with self._lock:
            if (record.seq, record.end) > (self._read_seq, self._read_off):
                self._read_seq, self._read_off = record.seq, record.end
            self._forget_sent()
            self._save_position()

    def _forget_sent(self) -> None:
        # Delete the fully sent segments, except the one being written.
        writing = self._segments[-1].seq if self._file is not None and self._segments else None
        while self._segments:
            seg = self._segments[0]
            done = seg.seq < self._read_seq or (
                seg.seq == self._read_seq and (not seg.records or seg.records[-1][0]
                                               <= self._read_off))
            if not done or seg.seq == writing:
                break
            self._segments.pop(0)
            with contextlib.suppress(FileNotFoundError):
                self._path(seg.seq).unlink()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                os.close(self._file)
                self._file = None
            self._save_position()

    # --- files -----------------------------------------------------------------------------

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}{_SUFFIX}"

    def _list(self) -> list[int]:
        seqs = []
        for path in self.dir.iterdir():
            if path.suffix == _SUFFIX and path.stem.isdigit():
                seqs.append(int(path.stem))
        return sorted(seqs)

    def _scan(self, seq: int) -> _Segment:
        """Index a segment found on disk; a torn record ends it (and is cut off)."""
        seg = _Segment(seq)
        path = self._path(seq)
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, crc, samples, oldest = _HEADER.unpack_from(data, offset)
            end = offset + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[offset + _HEADER.size:end]) != crc:
                break
            seg.records.append((end, samples, oldest))
            offset = end
        if offset != len(data):
            seg.torn = True
            log.warning("remote-write buffer %s: segment %s ends in a torn record (%d bytes "
                        "cut off, from a crash)", self.dir, path.name, len(data) - offset)
            with open(path, "r+b") as f:
                f.truncate(offset)
        seg.size = offset
        return seg

    def _load_position(self) -> tuple[int, int]:
        first = self._segments[0].seq if self._segments else 0
        try:
            text = (self.dir / _POSITION).read_text(encoding="ascii")
            seq_text, off_text = text.split()
            seq, off = int(seq_text), int(off_text)
        except (OSError, ValueError):
            return first, 0
        # A position before the oldest segment left (dropped meanwhile) starts at that one.
        return (seq, off) if (seq, off) >= (first, 0) else (first, 0)

    def _save_position(self) -> None:
        tmp = self.dir / (_POSITION + ".tmp")
        try:
            tmp.write_text(f"{self._read_seq} {self._read_off}\n", encoding="ascii")
            os.replace(tmp, self.dir / _POSITION)
        except OSError as exc:
            # Only costs re-sending after a restart; the data itself is unharmed.
            log.warning("remote-write buffer %s: position not saved: %s", self.dir, exc)
