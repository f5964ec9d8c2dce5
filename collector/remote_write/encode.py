"""Samples to Prometheus remote-write 1.0 ``WriteRequest`` bytes, sharded by series.

The messages are Prometheus's own (``prompb/remote.proto`` and ``types.proto``, compiled into
:mod:`.third_party.prompb`).  Each series' labels are serialized once, by the generated
``TimeSeries`` class, and kept; a request is then put together from those bytes and each sample's
value and timestamp.  That relies on two rules of the protobuf wire format: a message is the
concatenation of its fields, and a repeated field is a run of entries, each ``tag, length, bytes``.
Building a ``TimeSeries`` object per sample instead costs 10 us a sample (measured), as much CPU as
scraping and parsing it.  tests/scale/test_remote_write_unit.py parses every shape of request
built here back with the generated ``WriteRequest``.

One sample per ``TimeSeries`` entry, as Prometheus's own sender does.  Label names are sorted;
``__name__`` is the series name (characters outside ``[a-zA-Z0-9_:]`` become ``_``), ``target``
is the Triton target (a stored label ``target`` is sent as ``exported_target``, as the exporter
and Prometheus's ``honor_labels: false`` do), and the receiver's configured labels are added
where a series lacks them.

A series always goes to the same shard (CRC-32 of its label bytes), so each shard's requests,
sent one after the other, keep every series in time order: Prometheus refuses a sample older
than the newest it holds for the series.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from tritonwatch.schemas.samples import Labels

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_TS_TAG = b"\x0a"  # WriteRequest.timeseries = 1, length-delimited
_SAMPLES_TAG = b"\x12"  # TimeSeries.samples = 2, length-delimited
_VALUE_TAG = b"\x09"  # Sample.value = 1, 64-bit
_TIMESTAMP_TAG = b"\x10"  # Sample.timestamp = 2, varint
#: Series whose label bytes are kept, at most; past it the cache starts again (a target whose
#: label values change every scrape must not grow it without end).
MAX_CACHED_SERIES = 2_000_000


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _int64(value: int) -> bytes:
    # int64 is encoded as its two's complement in 64 bits (a negative one takes 10 bytes).
    return varint(value & 0xFFFF_FFFF_FFFF_FFFF)


def metric_name(name: str) -> str:
    return _NAME_BAD.sub("_", name) or "_"


def series_labels(name: str, labels: Labels, target: str,
                  external: Mapping[str, str]) -> list[tuple[str, str]]:
    """The label set sent for one stored series, sorted by name."""
    out: dict[str, str] = {}
    for key, value in labels:
        out["exported_" + key if key in ("target", "__name__") else key] = value
    out["__name__"] = metric_name(name)
    out["target"] = target
    for key, value in external.items():
        out.setdefault(key, value)
    return sorted(out.items())


class Batch:
    """One shard's encoded samples waiting to become a request."""

    __slots__ = ("oldest_ms", "parts", "samples")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.samples = 0
        self.oldest_ms: int | None = None

    def request(self) -> bytes:
        """The serialized ``WriteRequest`` of everything in the batch."""
        return b"".join(self.parts)


class Encoder:
    """Turns stored samples into per-shard ``TimeSeries`` entries (see the module docstring).

    Not thread-safe: the writer calls it under its lock.
    """

    def __init__(self, shards: int, external: Mapping[str, str]) -> None:
        self.shards = shards
        self.external = dict(external)
        # (target, name, labels) -> (shard, label bytes)
        self._series: dict[tuple[str, str, Labels], tuple[int, bytes]] = {}
        # target -> (names, labels, shard of each series, label bytes of each series, and
        # each series' entry head by sample length): the collector hands the same list objects
        # for every scrape of an unchanged layout.
        self._layouts: dict[str, tuple[list[str], list[Labels], list[int],
                                       list[bytes], dict[int, list[bytes]]]] = {}
        self.refused = 0

    def _one(self, target: str, name: str, labels: Labels) -> tuple[int, bytes]:
        key = (target, name, labels)
        found = self._series.get(key)
        if found is None:
            pairs = series_labels(name, labels, target, self.external)
            # Imported on first use: every ``serve`` loads this module, and protobuf's
            # runtime is only needed where a remote-write receiver is configured.
            from tritonwatch.collector.remote_write.third_party.prompb import types_pb2

            msg = types_pb2.TimeSeries(
                labels=[types_pb2.Label(name=k, value=v) for k, v in pairs])
            raw = msg.SerializeToString()
            found = (zlib.crc32(raw) % self.shards, raw)
            if len(self._series) >= MAX_CACHED_SERIES:
                self._series.clear()
            self._series[key] = found
        return found

    def encode_columns(self, target: str, ts: float, names: list[str], labels: list[Labels],
                       values: NDArray[np.float64], batches: Sequence[Batch]) -> int:
        """Add one scrape's samples to ``batches`` (one per shard); returns samples added."""
        layout = self._layouts.get(target)
        if layout is None or layout[0] is not names or layout[1] is not labels:
            shards, raws = self._series_of(target, names, labels)
            layout = (names, labels, shards, raws, {})
            self._layouts[target] = layout
        _, _, shard_of, raws, heads = layout
        return self._add(ts, raws, shard_of, values, batches, heads)

    def encode(self, target: str, ts: float, names: Sequence[str], labels: Sequence[Labels],
               values: Sequence[float], batches: Sequence[Batch]) -> int:
        """Samples given one by one (API readings, ``up``, probe series)."""
        shards, raws = self._series_of(target, names, labels)
        return self._add(ts, raws, shards, np.asarray(values, np.float64), batches)

    def _series_of(self, target: str, names: Sequence[str], labels: Sequence[Labels]
                   ) -> tuple[list[int], list[bytes]]:
        """Each series' shard and encoded labels, in order."""
        shards: list[int] = []
        raws: list[bytes] = []
        for name, lab in zip(names, labels, strict=True):
            shard, raw = self._one(target, name, lab)
            shards.append(shard)
            raws.append(raw)
        return shards, raws

    def _add(self, ts: float, raws: list[bytes], shard_of: list[int],
             values: NDArray[np.float64], batches: Sequence[Batch],
             cache: dict[int, list[bytes]] | None = None) -> int:
        ts_ms = round(ts * 1000)
        tail = _TIMESTAMP_TAG + _int64(ts_ms)
        sample_len = 1 + 8 + len(tail)
        # Everything of an entry before the sample's value: the same for every scrape of the
        # series while the timestamp's varint keeps its length (about 4 years at a time).
        heads = cache.get(sample_len) if cache is not None else None
        if heads is None:
            sample_head = _SAMPLES_TAG + varint(sample_len) + _VALUE_TAG
            entry = 1 + len(varint(sample_len)) + sample_len
            heads = [_TS_TAG + varint(len(raw) + entry) + raw + sample_head for raw in raws]
            if cache is not None:
                cache.clear()
                cache[sample_len] = heads
        packed = values.astype("<f8").tobytes()
        for i, (head, k) in enumerate(zip(heads, shard_of, strict=True)):
            batch = batches[k]
            batch.parts.append(head + packed[8 * i:8 * i + 8] + tail)
            batch.samples += 1
        for batch in batches:
            if batch.samples and (batch.oldest_ms is None or ts_ms < batch.oldest_ms):
                batch.oldest_ms = ts_ms
        return len(heads)

    def forget(self, target: str) -> None:
        """``target`` is no longer collected here (a shard moved): drop its layout."""
        self._layouts.pop(target, None)

