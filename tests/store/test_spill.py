"""Spill files (store/spill.py): what shutdown could not write, read back exactly, stored at
the next start; damaged files and other stores' files never block a start."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tritonwatch.schemas.probes import ProbeResult
from tritonwatch.schemas.samples import Sample, TargetHealth, make_labels
from tritonwatch.store import Query, Store, StoreError, spill

T = 1_700_000_000.0


def buffer_some(store: Store) -> None:
    # Three scrapes of one layout, its name and label lists shared as the collector passes
    # them (write_columns).
    names, labels = ["x", "y", "z"], [make_labels({"model": "m"}), (), ()]
    for k in range(3):
        store.write_columns("a", T + 15 * k, names, labels,
                            np.array([1.5 + k, math.inf, math.nan]))
    store.write("b", T, [Sample("x", make_labels({"model": "n"}), -2.0)])
    store.write_health(TargetHealth("a", "metrics", T, False, 0.5, 0, "connection refused"))
    store.write_probe_results([ProbeResult(probe="p", target="a", model="m", protocol="grpc",
                                           ts=T, ok=True, tokens=8, ttft_s=0.1, e2e_s=0.4)])


def test_a_spill_reads_back_exactly_what_was_buffered(store: Store, tmp_path: Path) -> None:
    buffer_some(store)
    pending = store.drain()
    assert store.buffered == 0
    path = spill.write(tmp_path / "spill", store.url_redacted, pending)
    assert path.name.startswith("spill-") and path.suffix == ".jsonl"
    assert not list((tmp_path / "spill").glob(".*"))  # no temporary file left
    origin, back = spill.read(path)
    assert origin == store.url_redacted
    assert back.samples == pending.samples == 3 * 2 + 1  # NaN is not a sample
    assert back.health == pending.health and back.probe_rows == pending.probe_rows
    for (t1, ts1, n1, l1, v1, nan1), (t2, ts2, n2, l2, v2, nan2) in zip(
            back.scrapes, pending.scrapes, strict=True):
        assert (t1, ts1, n1, l1, nan1) == (t2, ts2, n2, l2, nan2)
        assert v1.tobytes() == v2.tobytes()  # NaN and infinities bit for bit
    # Layouts stay shared: one names list for the three scrapes of target a.
    assert len({id(s[2]) for s in back.scrapes}) == 2


def test_reingest_stores_a_spill_and_removes_it(store: Store, tmp_path: Path) -> None:
    buffer_some(store)
    spill.write(tmp_path / "spill", store.url_redacted, store.drain())
    assert spill.reingest(store, tmp_path / "spill") == 7
    assert not list((tmp_path / "spill").iterdir())
    (a,) = store.read(Query("x", start=T, end=T + 60, target="a")).series()
    assert list(a.values) == [1.5, 2.5, 3.5]
    (inf,) = store.read(Query("y", start=T, end=T + 60)).series()
    assert list(inf.values) == [math.inf] * 3
    assert [h.error for h in store.health()] == ["connection refused"]
    assert [r.tokens for r in store.probe_results()] == [8]


def test_a_damaged_spill_is_set_aside_and_another_stores_is_left_alone(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "spill"
    buffer_some(store)
    pending = store.drain()
    damaged = spill.write(directory, store.url_redacted, pending)
    damaged.write_text(damaged.read_text()[:-30])  # cut short
    foreign = spill.write(directory, "postgresql+psycopg://tw:***@elsewhere/tw", pending)
    foreign = foreign.rename(directory / "spill-99999999T000000Z-1.jsonl")
    assert spill.reingest(store, directory) == 0
    assert sorted(p.name for p in directory.iterdir()) == [damaged.name + ".bad", foreign.name]
    text = caplog.text
    assert damaged.name in text and "line" in text
    assert "elsewhere" in text and "left in place" in text
    assert store.series() == []


def test_a_failed_reingest_keeps_the_file_and_buffers_nothing(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buffer_some(store)
    path = spill.write(tmp_path / "spill", store.url_redacted, store.drain())

    def refuse(_chunks: object) -> int:  # a fake at the edge: the database refusing writes
        raise StoreError("flush failed: db down", url=store.url_redacted)

    monkeypatch.setattr(store._writer, "write", refuse)
    with pytest.raises(StoreError):
        spill.reingest(store, tmp_path / "spill")
    assert path.exists()
    # Nothing stays buffered: a shutdown would otherwise spill it a second time.
    assert not store.drain()
