"""Remote-write (issue 18 item 1) piece by piece: the encoding against Prometheus's own
generated ``WriteRequest``, the on-disk segment buffer and its bound, and the sender's retry,
refusal and authentication against a scripted receiver.

The scripted receiver is a fake at the edge (a real HTTP server in a thread that answers the
statuses a test asks for); the real receivers are in test_remote_write_receivers.py.
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import cramjam
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.fixtures_http import free_port
from tests.scale.targets import payload
from tests.serving import QuietHandler, serving
from tritonwatch.alerts.notify.base import register_secrets
from tritonwatch.collector.remote_write.buffer import SegmentBuffer
from tritonwatch.collector.remote_write.encode import Batch, Encoder, varint
from tritonwatch.collector.remote_write.third_party.prompb import remote_pb2, types_pb2
from tritonwatch.collector.remote_write.writer import RemoteWriter, classify
from tritonwatch.collector.shape import parse_columns
from tritonwatch.schemas.remote_write import DEFAULT_BUFFER_BYTES, RemoteWriteConfig
from tritonwatch.schemas.samples import Sample

T0 = 1_790_000_000.0


def decode(body: bytes) -> list[tuple[tuple[tuple[str, str], ...], int, float]]:
    req = remote_pb2.WriteRequest()
    req.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    out = []
    for ts in req.timeseries:
        labels = tuple((lab.name, lab.value) for lab in ts.labels)
        for s in ts.samples:
            out.append((labels, s.timestamp, s.value))
    return out


# --- encoding ------------------------------------------------------------------------------


def test_varint_matches_the_generated_sample_encoding():
    for value in (1, 127, 128, 300, 2**31, 1_790_000_000_123, 2**63 - 1):
        assert types_pb2.Sample(timestamp=value).SerializeToString() == b"\x10" + varint(value)
    # a negative int64 is its 64-bit two's complement
    assert types_pb2.Sample(timestamp=-1).SerializeToString() == b"\x10" + varint(2**64 - 1)


def test_requests_parse_with_prometheus_generated_write_request():
    enc = Encoder(shards=3, external={"cluster": "eu-1", "model": "not-used"})
    batches = [Batch() for _ in range(3)]
    names = ["nv_inference_count", "sli:fill_rate", "bad-name.x", "up"]
    labels = [(("model", "m"), ("version", "1")), (("model", "m"),), (("target", "inner"),), ()]
    values = np.array([12.0, 0.0, -1.5, math.nan])
    enc.encode_columns("t1", T0 + 0.123, names, labels, values, batches)
    enc.encode_columns("t1", T0 + 15, names, labels, values + 1, batches)  # cached layout
    enc.encode("t1", T0 - 3600.0, ["probe:ttft_seconds"], [(("probe", "p"),)], [0.25], batches)
    got = []
    for batch in batches:
        got += decode(bytes(cramjam.snappy.compress_raw(batch.request())))
    assert sum(b.samples for b in batches) == 9
    by = {(labels, ms): v for labels, ms, v in got}
    assert len(by) == 9
    count = (("__name__", "nv_inference_count"), ("cluster", "eu-1"), ("model", "m"),
             ("target", "t1"), ("version", "1"))
    assert by[(count, 1_790_000_000_123)] == 12.0
    assert by[(count, 1_790_000_015_000)] == 13.0
    # a value of 0.0 is sent explicitly and reads back as 0.0
    fill = (("__name__", "sli:fill_rate"), ("cluster", "eu-1"), ("model", "m"),
            ("target", "t1"))
    assert by[(fill, 1_790_000_000_123)] == 0.0
    # an illegal name character becomes _, a stored `target` label is exported_target
    # (and a configured label reaches only the series without it)
    odd = (("__name__", "bad_name_x"), ("cluster", "eu-1"), ("exported_target", "inner"),
           ("model", "not-used"), ("target", "t1"))
    assert by[(odd, 1_790_000_000_123)] == -1.5
    assert math.isnan(by[((("__name__", "up"), ("cluster", "eu-1"), ("model", "not-used"),
                           ("target", "t1")), 1_790_000_000_123)])
    probe = ((("__name__", "probe:ttft_seconds"), ("cluster", "eu-1"), ("model", "not-used"),
              ("probe", "p"), ("target", "t1")), 1_789_996_400_000)
    assert by[probe] == 0.25
    for labels_, _, _ in got:  # Prometheus wants label names sorted
        assert [k for k, _ in labels_] == sorted(k for k, _ in labels_)
    # every series sits in one shard only, so a shard's requests keep it in order
    shards_of: dict[tuple[tuple[str, str], ...], set[int]] = {}
    for k, batch in enumerate(batches):
        for labels_, _, _ in decode(bytes(cramjam.snappy.compress_raw(batch.request()))):
            shards_of.setdefault(labels_, set()).add(k)
    assert all(len(s) == 1 for s in shards_of.values())


# --- the segment buffer --------------------------------------------------------------------


def test_buffer_resumes_after_a_restart_and_cuts_a_torn_tail(tmp_path):
    buf = SegmentBuffer(tmp_path, max_bytes=1 << 20, segment_bytes=300)
    for i in range(10):
        buf.append(f"record-{i}".encode() * 10, samples=i + 1, oldest_ms=i)
    first = buf.peek()
    assert first is not None and first.payload == b"record-0" * 10
    buf.commit(first)
    second = buf.peek()
    assert second is not None
    buf.commit(second)
    buf.close()
    # a crash mid-append leaves half a record at the end of the newest segment
    newest = sorted(tmp_path.glob("*.seg"))[-1]
    with open(newest, "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")
    again = SegmentBuffer(tmp_path, max_bytes=1 << 20, segment_bytes=300)
    assert again.pending() == (sum(range(3, 11)), 2)
    seen = []
    while (rec := again.peek()) is not None:
        seen.append(rec.payload)
        again.commit(rec)
    assert seen == [f"record-{i}".encode() * 10 for i in range(2, 10)]
    again.append(b"after", 1, 99)  # appends go on in a new segment
    rec = again.peek()
    assert rec is not None and rec.payload == b"after"
    # fully sent segments are deleted, the one being written stays
    assert len(list(tmp_path.glob("*.seg"))) == 1


def test_full_buffer_drops_oldest_first_and_counts_it(tmp_path):
    record = b"x" * 1000
    size = 1000 + 20  # with its header
    buf = SegmentBuffer(tmp_path, max_bytes=10 * size, segment_bytes=2 * size)
    for i in range(10):
        buf.append(record, samples=100, oldest_ms=i)
    assert buf.dropped_samples == 0 and buf.pending() == (1000, 0)
    buf.append(record, samples=100, oldest_ms=10)  # one too many: the oldest segment goes
    assert buf.dropped_samples == 200
    assert buf.pending() == (900, 2)
    assert buf.size <= 10 * size
    rec = buf.peek()
    assert rec is not None and rec.oldest_ms == 2


def test_default_buffer_holds_a_15_minute_outage_at_the_reference_load(tmp_path):
    """The buffer's arithmetic with real requests: 1,000 targets x ~100 series each per 15 s
    is about 6,700 samples/s per Triton-shaped fleet slice; the reference load is 100,000
    samples/s (1,000 targets of ~1,500 series at 15 s).  Real records of a simulated fleet
    measure the bytes per sample; 15 minutes of the reference load must fit the default."""
    enc = Encoder(shards=1, external={})
    text = payload(5, models=20, gpus=8)
    shape, values = parse_columns(text, None)
    seconds, interval, targets = 900, 15, 20
    buf = SegmentBuffer(tmp_path, max_bytes=1 << 30, segment_bytes=8 << 20)
    samples = 0
    for step in range(seconds // interval):
        batch = [Batch()]
        for t in range(targets):
            enc.encode_columns(f"triton-{t:04d}", T0 + step * interval, shape.names,
                               shape.labels, values + step, batch)
        for start in range(0, len(batch[0].parts), 2000):
            part = batch[0].parts[start:start + 2000]
            buf.append(bytes(cramjam.snappy.compress_raw(b"".join(part))), len(part), 0)
            samples += len(part)
    per_sample = buf.size / samples
    assert buf.dropped_samples == 0 and buf.pending()[0] == samples
    reference_rate = 100_000
    needed = per_sample * reference_rate * 15 * 60
    assert needed < DEFAULT_BUFFER_BYTES, (per_sample, needed)
    # and the writer splits that bound over its shards without losing any of it
    cfg = RemoteWriteConfig(name="x", url="http://127.0.0.1:1/w")
    writer = RemoteWriter(cfg, tmp_path / "w", registry=CollectorRegistry())
    assert sum(b.max_bytes for b in writer.buffers) == DEFAULT_BUFFER_BYTES


# --- sending -------------------------------------------------------------------------------


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True
    script: list[tuple[int, bytes]]
    requests: list[tuple[dict[str, str], bytes]]
    lock: threading.Lock


class _Handler(QuietHandler):
    server: _Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests.append((dict(self.headers.items()), body))
            status, answer = self.server.script.pop(0) if self.server.script else (204, b"")
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@contextmanager
def fake_receiver(script: list[tuple[int, bytes]], port: int = 0) -> Iterator[_Receiver]:
    """A scripted stand-in for a receiver (fake at the edge): answers ``script`` in order,
    then 204."""
    server = _Receiver(("127.0.0.1", port), _Handler)
    server.script, server.requests, server.lock = list(script), [], threading.Lock()
    with serving(server):
        yield server


def _writer(tmp_path: Path, url: str, **extra: object) -> tuple[RemoteWriter, CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = RemoteWriteConfig.model_validate({
        "name": "r", "url": url,
        "queue": {"shards": 1, "batch_send_deadline": 0.1, "min_backoff": 0.05,
                  "max_backoff": 0.2},
        "buffer": {"max_size": "16MiB", "segment_size": "1MiB"}, **extra})
    return RemoteWriter(cfg, tmp_path / "buf", registry=registry), registry


def _wait(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _metric(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name, {"remote": "r"})
    return 0.0 if value is None else value


@pytest.mark.parametrize("status,verdict", [
    (200, "ok"), (204, "ok"), (400, "fail"), (401, "fail"), (404, "fail"), (413, "fail"),
    (429, "retry"), (500, "retry"), (502, "retry"), (503, "retry"),
])
def test_status_classes(status, verdict):
    assert classify(status) == verdict


def test_5xx_and_429_are_retried_until_taken_with_protocol_headers_and_a_bearer_token(tmp_path):
    script = [(500, b"busy"), (503, b"busy"), (429, b"slow down")]
    with fake_receiver(script) as rx:
        writer, registry = _writer(tmp_path, f"http://127.0.0.1:{rx.server_address[1]}/w",
                                   bearer_token="s3cr3t-bearer-value",
                                   headers={"X-Scope-OrgID": "tenant-1"})
        writer.start()
        try:
            writer.append("t1", T0, [Sample("up", (), 1.0), Sample("x", (("a", "b"),), 2.0)])
            writer.seal_due(force=True)
            _wait(lambda: _metric(registry, "tritonwatch_remote_write_samples_sent_total") == 2)
        finally:
            writer.close(timeout=1)
    assert len(rx.requests) == 4  # three refusals, then taken
    headers, body = rx.requests[-1]
    assert all(b == body for _, b in rx.requests)  # the same request each time
    assert headers["Content-Encoding"] == "snappy"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0"
    assert headers["Authorization"] == "Bearer s3cr3t-bearer-value"
    assert headers["X-Scope-OrgID"] == "tenant-1"
    assert sorted(decode(body)) == [
        ((("__name__", "up"), ("target", "t1")), round(T0 * 1000), 1.0),
        ((("__name__", "x"), ("a", "b"), ("target", "t1")), round(T0 * 1000), 2.0),
    ]
    assert _metric(registry, "tritonwatch_remote_write_samples_retried_total") == 6
    assert _metric(registry, "tritonwatch_remote_write_samples_failed_total") == 0
    assert _metric(registry, "tritonwatch_remote_write_pending_samples") == 0


def test_other_4xx_is_not_retried_and_its_body_is_logged_escaped_and_cut(tmp_path, caplog):
    evil = b"bad sample\r\nFAKE LOG LINE \x1b[31m" + b"y" * 5000
    # A webhook secret registered (as serve does with notifiers) puts alerts/notify's filter to
    # work on the same httpx logger: it masks the token query parameter first, and the
    # receiver's password must still not show once the whole URL no longer matches.
    register_secrets(["an-unrelated-webhook-secret"])
    with fake_receiver([(400, evil)]) as rx:
        writer, registry = _writer(tmp_path, f"http://u:pw-secret@127.0.0.1:"
                                   f"{rx.server_address[1]}/w?token=q-secret",
                                   headers={"X-Key": "header-secret"})
        writer.start()
        try:
            with caplog.at_level(logging.INFO):
                writer.append("t1", T0, [Sample("up", (), 1.0)])
                writer.seal_due(force=True)
                _wait(lambda: _metric(
                    registry, "tritonwatch_remote_write_samples_failed_total") == 1)
                writer.append("t1", T0 + 1, [Sample("up", (), 1.0)])  # the next one goes on
                writer.seal_due(force=True)
                _wait(lambda: _metric(
                    registry, "tritonwatch_remote_write_samples_sent_total") == 1)
        finally:
            writer.close(timeout=1)
    assert len(rx.requests) == 2  # the refused one was not sent again
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    assert "HTTP 400" in line and "bad sample\\r\\nFAKE LOG LINE \\x1b[31m" in line
    assert "\n" not in line and "\x1b" not in line and len(line) < 1500
    text = caplog.text
    for secret in ("pw-secret", "q-secret", "header-secret"):
        assert secret not in text


def test_a_receiver_that_is_down_gets_everything_once_it_is_up_with_basic_auth(tmp_path):
    port = free_port()
    writer, registry = _writer(tmp_path, f"http://127.0.0.1:{port}/w",
                               basic_auth={"username": "rw", "password": "pw-value"})
    writer.start()
    try:
        for i in range(5):
            writer.append("t1", T0 + i, [Sample("c", (), float(i))])
            writer.seal_due(force=True)
        _wait(lambda: _metric(registry, "tritonwatch_remote_write_samples_retried_total") >= 2)
        assert _metric(registry, "tritonwatch_remote_write_pending_samples") == 5
        assert _metric(registry, "tritonwatch_remote_write_lag_seconds") > 0
        with fake_receiver([], port=port) as rx:
            _wait(lambda: _metric(registry, "tritonwatch_remote_write_samples_sent_total") == 5)
    finally:
        writer.close(timeout=1)
    got = [s for _, body in rx.requests for s in decode(body)]
    assert [(ms, v) for _, ms, v in got] == [(round((T0 + i) * 1000), float(i))
                                             for i in range(5)]
    auth = rx.requests[0][0]["Authorization"]
    assert base64.b64decode(auth.removeprefix("Basic ")) == b"rw:pw-value"
    assert _metric(registry, "tritonwatch_remote_write_lag_seconds") == 0


def test_unsent_samples_survive_a_restart_of_the_writer(tmp_path):
    port = free_port()
    writer, _ = _writer(tmp_path, f"http://127.0.0.1:{port}/w")
    writer.start()
    writer.append("t1", T0, [Sample("c", (), 7.0)])
    writer.close(timeout=0.5)  # nobody listens: it stays on disk
    again, registry = _writer(tmp_path, f"http://127.0.0.1:{port}/w")
    assert again.pending()[0] == 1
    with fake_receiver([], port=port) as rx:
        again.start()
        try:
            _wait(lambda: _metric(registry, "tritonwatch_remote_write_samples_sent_total") == 1)
        finally:
            again.close(timeout=1)
    assert [v for _, body in rx.requests for _, _, v in decode(body)] == [7.0]
