"""The store contract's time-series part on a real VictoriaMetrics (issue 18 item 2).

The contract's write/read, counter and bucket cases run here unchanged against a store whose
time series live on VictoriaMetrics (samples in by remote-write, reads by PromQL through
``store.tsdb.TsdbReader``) and whose relational state stays in SQL; then the same data is
written to a SQL store and a TSDB store and every kind of read is compared, and the TSDB's own
edges (escaping, limits, errors) are checked.

The sink here is a fake at the edge, named as such: it encodes with the real remote-write
encoder and POSTs each write at once, then asks VictoriaMetrics to make it searchable
(``/internal/force_flush``), so a read right after a write sees it, as ``Store.flush()``
promises.  The queued, on-disk path is exercised end to end in tests/faults/test_tsdb.py.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

import cramjam
import httpx
import numpy as np
import pytest

from tests.fixtures_store import stores
from tests.scale.receivers import VictoriaMetrics, running

# The contract's time-series cases, imported so that pytest collects them here again and runs
# them with this module's `make_store`: on VictoriaMetrics.
from tests.store.test_contract import (  # noqa: F401
    HOSTILE,
    T0,
    scrape,
    test_a_counter_below_zero_never_gives_a_negative_increase,
    test_bad_query_arguments_raise_query_error,
    test_buckets_aggregate_each_step_like_a_reference,
    test_increase_and_rate_count_a_reset_as_a_restart_from_zero,
    test_range_is_inclusive_and_filters_by_target_and_labels,
    test_series_appearing_and_disappearing,
    test_series_are_unique_whatever_the_label_order_and_writer,
)
from tritonwatch.collector.remote_write.encode import Batch, Encoder
from tritonwatch.schemas.config import validate_config
from tritonwatch.schemas.samples import Labels, Sample, make_labels
from tritonwatch.store import Query, QueryError, SeriesKey, Store, StoreError, open_store
from tritonwatch.store.errors import LimitExceeded
from tritonwatch.store.tsdb import TsdbReader, quote, redact_url, selector

#: VictoriaMetrics keeps a float to 12 significant decimal digits (its documented precision).
VM_RELATIVE_PRECISION = 1e-11


class PostingSink:
    """Fake at the edge: the real encoder, one synchronous POST per write."""

    def __init__(self, vm: VictoriaMetrics) -> None:
        self.vm = vm
        self.encoder = Encoder(1, {})

    def append_columns(self, target: str, ts: float, names: list[str], labels: list[Labels],
                       values: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        batch = Batch()
        self.encoder.encode(target, ts, names, labels, values.tolist(), [batch])
        r = httpx.post(self.vm.write_url, content=bytes(cramjam.snappy.compress_raw(
            batch.request())), headers={"Content-Encoding": "snappy",
                                        "Content-Type": "application/x-protobuf"})
        assert r.status_code == 204, r.text
        self.vm.flush()

    def send_now(self) -> None:
        """Each write was sent at once."""


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    # One per test (it starts in about half a second): the contract's cases reuse names.
    with running(VictoriaMetrics(tmp_path / "vm")) as rx:
        assert isinstance(rx, VictoriaMetrics)
        yield rx


@pytest.fixture
def make_store(vm: VictoriaMetrics, tmp_path: Path) -> Iterator[Callable[..., Store]]:
    yield from stores(lambda **kwargs: open_store(
        f"sqlite:///{tmp_path}/tw.db", timeseries=TsdbReader(vm.url), sink=PostingSink(vm),
        **kwargs))


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


@pytest.fixture
def sql_store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/sql.db")
    s.migrations.apply()
    yield s
    s.close()


def test_round_trip_keeps_hostile_labels_exactly_and_values_to_vm_precision(
        store: Store) -> None:
    values = [0.0, -1.5, 1e300, 123.456789, math.inf, -math.inf, 42.0]
    for i, v in enumerate(values):
        assert scrape(store, "triton-a:8002", T0 + i * 15, {("g", HOSTILE): v}) == 1
    (data,) = store.read(Query("g", start=T0, end=T0 + 3600)).series()
    assert data.key == SeriesKey("triton-a:8002", "g", HOSTILE)
    assert data.values == pytest.approx(values, rel=VM_RELATIVE_PRECISION)
    assert data.ts == tuple(T0 + i * 15 for i in range(len(values)))
    # Label values are matched as data: each hostile value selects exactly this series.
    for key, value in HOSTILE:
        assert store.series(Query("g", match={key: value})) == [data.key]
        assert store.series(Query("g", match={key: value + "x"})) == []


def test_a_stored_label_named_target_survives_the_round_trip(store: Store) -> None:
    labels = make_labels({"target": "inner", "__name__": "odd"})
    store.write("outer", T0, [Sample("g", labels, 1.0)])
    assert store.series(Query("g", match={"target": "inner"})) == [
        SeriesKey("outer", "g", labels)]
    assert store.series(Query("g", target="inner")) == []


def test_nan_is_skipped_and_infinities_are_kept(store: Store) -> None:
    n = store.write("t", T0, [Sample("g", (), math.nan), Sample("h", (), math.inf),
                              Sample("i", (), 1.0)])
    assert n == 2
    assert [k.name for k in store.series()] == ["h", "i"]
    assert store.read(Query("h", start=T0, end=T0)).series()[0].values == (math.inf,)


def test_a_resent_sample_reads_once(store: Store) -> None:
    # The SQL store keeps the last value written; a TSDB decides itself which of two samples
    # at one timestamp it keeps (VictoriaMetrics: the greatest; Prometheus: the first).
    store.write("t", T0, [Sample("g", (), 1.0)])
    store.write("t", T0, [Sample("g", (), 3.0)])
    store.write("t", T0 + 15, [Sample("g", (), 4.0)])
    (data,) = store.read(Query("g", start=T0, end=T0 + 15)).series()
    assert data.ts == (T0, T0 + 15)
    assert data.values[1] == 4.0 and data.values[0] in (1.0, 3.0)


def _fill(s: Store) -> None:
    counter = 0.0
    for i in range(40):  # 10 minutes at 15 s, a counter reset at i == 25
        counter = 3.0 if i == 25 else counter + (i % 7)
        for target in ("a", "b"):
            scrape(s, target, T0 + 7 + i * 15, {
                ("req_total", make_labels({"model": "m1"})): counter,
                ("req_total", make_labels({"model": "m2"})): 2 * counter,
                ("gauge", make_labels({"gpu": "0"})): float((i * 5) % 13) / 4,
            })
    s.flush()


@pytest.mark.parametrize("window", [(0, 600), (31, 577), (7, 7)])
def test_every_read_equals_the_sql_store(store: Store, sql_store: Store,
                                         window: tuple[int, int]) -> None:
    _fill(store)
    _fill(sql_store)
    start, end = T0 + window[0], T0 + window[1]
    for q in (Query("gauge", start=start, end=end), Query(names={"gauge", "req_total"},
                                                           start=start, end=end)):
        assert store.read(q).series() == sql_store.read(q).series()
    # 0.05 s: 12,000 steps over the widest window, so query_range is cut into two calls.
    for step in (60, 300, 45, 7.5, 123.457, 0.05):
        for agg in ("avg", "min", "max", "sum", "count", "last"):
            q = Query(names={"gauge", "req_total"}, start=start, end=end, step=step, agg=agg,
                      target="a")
            got, want = store.read(q).series(), sql_store.read(q).series()
            assert [(d.key, d.ts) for d in got] == [(d.key, d.ts) for d in want], (step, agg)
            for g, w in zip(got, want, strict=True):
                assert g.values == pytest.approx(w.values, rel=1e-9), (step, agg)
    q = Query("req_total", start=start, end=end)
    assert dict(store.increase(q)) == pytest.approx(dict(sql_store.increase(q)))
    assert dict(store.rate(q)) == pytest.approx(dict(sql_store.rate(q)))
    assert store.series() == sql_store.series()
    assert store.series(Query(match={"model": "m2"})) == sql_store.series(
        Query(match={"model": "m2"}))


def test_series_pages_equal_the_sql_store(store: Store, sql_store: Store) -> None:
    _fill(store)
    _fill(sql_store)

    def where(target: str, name: str, labels: Labels) -> bool:
        return name != "gauge" or (target == "b" and labels != ())
    for q in (Query(where=where), Query(target="a"), Query(start=T0, end=T0 + 30),
              Query(start=T0 + 5000, end=T0 + 6000)):
        pages: list[list[SeriesKey]] = []
        for s in (store, sql_store):
            first = s.series_page(q, limit=2)
            rest = s.series_page(q, after=first[-1] if first else None, limit=None)
            pages.append(first + rest)
        assert pages[0] == pages[1]


def test_limits_refuse_before_reading(store: Store) -> None:
    _fill(store)
    with pytest.raises(LimitExceeded) as series:
        store.read(Query("req_total", start=T0, end=T0 + 1200, max_series=3))
    assert series.value.what == "series"
    with pytest.raises(LimitExceeded) as samples:
        store.read(Query("req_total", start=T0, end=T0 + 1200, max_samples=100))
    assert samples.value.what == "samples"
    with pytest.raises(LimitExceeded):
        store.increase(Query("gauge", start=T0, end=T0 + 1200, max_samples=10))
    assert len(store.read(Query("req_total", start=T0, end=T0 + 1200, max_series=4,
                                max_samples=160)).keys) == 4


def test_a_response_over_the_byte_bound_is_refused(vm: VictoriaMetrics, store: Store) -> None:
    _fill(store)
    small = TsdbReader(vm.url, max_response_bytes=2000)
    try:
        with pytest.raises(LimitExceeded, match="exceeds 2,000 bytes"):
            small.read(Query("req_total", start=T0, end=T0 + 1200))
    finally:
        small.close()


def test_errors_name_the_endpoint_without_its_secrets(vm: VictoriaMetrics) -> None:
    down = TsdbReader("http://user:hunter2@127.0.0.1:9/prom?token=s3cret", timeout_s=5)
    with pytest.raises(StoreError) as err:
        down.read(Query("g", start=T0, end=T0 + 60))
    assert "http://***@127.0.0.1:9/prom/api/v1/series?***" in str(err.value)
    assert "hunter2" not in str(err.value) and "s3cret" not in str(err.value)
    down.close()
    reader = TsdbReader(vm.url)
    with pytest.raises(QueryError, match="label name"):
        reader.read(Query("g", start=T0, end=T0 + 60, match={"bad-name": "x"}))
    reader.close()


def test_a_tsdb_that_never_answers_times_out_naming_the_endpoint() -> None:
    # A listening socket nobody accepts from: the connection opens, no answer ever comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        reader = TsdbReader(f"http://127.0.0.1:{port}", timeout_s=1)
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}/api/v1/series timed out"):
            reader.series_page(Query(), after=None, limit=10)
        assert time.monotonic() - started < 30
        reader.close()


class _Recorder(BaseHTTPRequestHandler):
    """Fake at the edge: a Prometheus API that records what it was sent; a selector naming
    ``down`` gets a 503, as from an overloaded vmselect."""

    seen: ClassVar[list[tuple[dict[str, str], str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        type(self).seen.append((dict(self.headers), body))
        down = "down" in body
        payload = (b'{"status":"error","error":"overloaded"}' if down
                   else b'{"status":"success","data":[]}')
        self.send_response(503 if down else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: object) -> None:
        pass


def test_configured_auth_and_headers_reach_the_query_api() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/prom"
        config = validate_config({"store": {"url": "postgresql://tw@db/tw", "timeseries": {
            "write_url": url + "/api/v1/write", "query_url": url, "bearer_token": "t0ken",
            "headers": {"X-Scope-OrgID": "fleet"}}}}).store.timeseries
        assert config is not None
        reader = TsdbReader.from_config(config)
        assert reader.series_page(Query(target="a\\"), after=None, limit=None) == []
        headers, body = _Recorder.seen[-1]
        assert headers["Authorization"] == "Bearer t0ken"
        assert headers["X-Scope-OrgID"] == "fleet"
        assert parse_qs(body)["match[]"] == ['{target="a\\\\"}']
        with pytest.raises(StoreError, match=r"prom/api/v1/series failed: HTTP 503: overloaded"):
            reader.series_page(Query(target="down"), after=None, limit=None)
        reader.close()
    finally:
        server.shutdown()
        server.server_close()


def test_matchers_are_quoted_never_pasted() -> None:
    assert quote('a"b\\c\nd模') == '"a\\"b\\\\c\\nd模"'
    sel = selector(Query("g", target='x"}', match={"m": "\\"}))
    assert sel == '{__name__="g",target="x\\"}",m="\\\\"}'
    # A selector of empty matchers only still names something PromQL accepts.
    assert selector(Query(match={"m": ""})) == '{__name__=~".+",m=""}'
    assert selector(Query(names=set())) is None
    assert redact_url("https://u:p@h:1/x?t=1") == "https://***@h:1/x?***"




def test_the_contract_cases_are_collected_here_too() -> None:
    # Their import is what runs them on VictoriaMetrics: a tidy-up that imports the module
    # instead would drop them without a failure.
    cases = [name for name, value in globals().items()
             if name.startswith("test_") and getattr(value, "__module__", "")
             == "tests.store.test_contract"]
    assert len(cases) >= 7, cases
