"""Series ids on the write path: resolved in bounded slices, refreshed a budget at a time.

The store keeps no key → id cache beyond each target's last layout; these tests watch the
statements that resolve series (a spy around ``store.write.resolve_series``, the real function
underneath) to show that a large first flush is cut into slices, that layouts older than the
TTL are re-resolved a few per flush rather than all at once, and that the ids stay right
throughout.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import tritonwatch.store.flush as store_module
from tritonwatch.schemas.samples import Labels
from tritonwatch.store import Query

TARGETS = 5
SERIES = 10


def _columns(i: int) -> tuple[list[str], list[Labels]]:
    names = [f"m_{k % 3}" for k in range(SERIES)]
    labels: list[Labels] = [(("k", str(k)), ("t", str(i))) for k in range(SERIES)]
    return names, labels


def _write_all(st: Any, ts: float) -> None:
    columns = [_columns(i) for i in range(TARGETS)]
    for i, (names, labels) in enumerate(columns):
        st.write_columns(f"t{i}", ts, names, labels, np.full(SERIES, ts + i))
    st.flush()


def test_a_large_first_flush_resolves_in_slices(make_store, calls, monkeypatch):
    monkeypatch.setattr(store_module, "RESOLVE_SLICE", 7)
    st = make_store()
    _write_all(st, 1000.0)
    total = TARGETS * SERIES
    # A group of layouts at a time (at least 7 keys), each cut into statements of at most 7.
    assert sum(len(c) for c in calls) == total
    assert max(len(c) for c in calls) == 7 and len(calls) >= -(-total // 7)
    keys = st.series()
    assert len(keys) == total
    # Every sample landed on its own series.
    for i in range(TARGETS):
        got = st.read(Query("m_0", start=999, end=1001, target=f"t{i}")).series()
        assert {d.values for d in got} == {(1000.0 + i,)}
        assert len(got) == len([k for k in range(SERIES) if k % 3 == 0])


def test_unchanged_layouts_resolve_nothing(make_store, calls):
    st = make_store()
    _write_all(st, 1000.0)
    calls.clear()
    for r in range(1, 4):
        _write_all(st, 1000.0 + r)
    assert calls == []


def test_expired_layouts_are_refreshed_a_budget_at_a_time(make_store, calls, monkeypatch):
    st = make_store(series_ttl_s=0.0)
    _write_all(st, 1000.0)
    calls.clear()
    # Every layout is now past its TTL; the budget lets one target's series (10) be
    # resolved again per flush, oldest first, so the refresh takes TARGETS flushes.
    monkeypatch.setattr(store_module, "RESOLVE_SLICE", SERIES)
    refreshed = []
    for r in range(1, TARGETS + 1):
        _write_all(st, 1000.0 + r)
        assert len(calls) == 1 and len(calls[0]) == SERIES
        refreshed.append({key[0] for key in calls[0]})
        calls.clear()
    assert [len(t) for t in refreshed] == [1] * TARGETS
    assert set().union(*refreshed) == {f"t{i}" for i in range(TARGETS)}
    # Ids survived the refresh: still one series per key, every scrape readable.
    assert len(st.series()) == TARGETS * SERIES
    got = st.read(Query("m_1", start=0, end=2000, target="t3")).series()
    assert {d.values for d in got} == {tuple(1000.0 + r + 3 for r in range(TARGETS + 1))}


class _Clock:
    """``store.flush``'s ``time`` with a monotonic clock the test moves (wall time real)."""

    def __init__(self) -> None:
        self.now = 5_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()


def test_layouts_are_resolved_again_after_the_stores_ttl_only(make_store, calls, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(store_module, "time", clock)
    st = make_store(series_ttl_s=3600.0)
    assert st.series_ttl_s == 3600.0
    _write_all(st, 1000.0)
    calls.clear()
    # Past the default 10 minutes, short of this store's hour: the ids are reused.
    clock.now += 3000.0
    _write_all(st, 1001.0)
    assert calls == []
    # Past the hour: every target's series are resolved again (within one flush's budget),
    # to the same ids.
    clock.now += 601.0
    _write_all(st, 1002.0)
    assert sorted(key for c in calls for key in c) == sorted(
        (f"t{i}", name, labels) for i in range(TARGETS)
        for name, labels in zip(*_columns(i), strict=True))
    assert len(st.series()) == TARGETS * SERIES
    got = st.read(Query("m_1", start=0, end=2000, target="t2")).series()
    assert {d.values for d in got} == {(1002.0, 1003.0, 1004.0)}


@pytest.mark.parametrize("ttl", [-1.0, float("nan")])
def test_a_negative_series_ttl_is_refused_by_name(make_store, ttl):
    with pytest.raises(ValueError, match="series_ttl_s"):
        make_store(series_ttl_s=ttl)


def test_a_changed_block_reuses_ids_of_the_previous_layout(make_store, calls):
    st = make_store()
    names, labels = _columns(0)
    st.write_columns("t0", 1000.0, names, labels, np.arange(SERIES, dtype=np.float64))
    st.flush()
    calls.clear()
    # One series more at the end and one relabelled: only those two are new keys.
    names2 = [*names, "m_new"]
    labels2 = [*labels[:-1], (("k", "changed"), ("t", "0")), (("k", "x"),)]
    st.write_columns("t0", 1001.0, names2, labels2, np.arange(SERIES + 1, dtype=np.float64))
    st.flush()
    assert len(calls) == 1
    assert sorted(key[2] for key in calls[0]) == sorted([labels2[-2], labels2[-1]])
    assert len(st.series()) == SERIES + 2


def test_series_first_seen_in_different_buffered_scrapes_are_all_created(make_store):
    # Two scrapes buffered before one flush, each with a different series still NaN: a series
    # is created once it has a value in any of them.
    st = make_store()
    names, labels = _columns(0)
    first = np.arange(SERIES, dtype=np.float64)
    first[:2] = np.nan
    second = np.arange(SERIES, dtype=np.float64)
    second[1:3] = np.nan
    st.write_columns("t0", 1000.0, names, labels, first)
    st.write_columns("t0", 1001.0, names, labels, second)
    st.flush()
    assert len(st.series()) == SERIES - 1  # the series at position 1 never had a value
    got = {d.labels: d.values for d in st.read(Query("m_0", start=999, end=1002,
                                                     target="t0")).series()}
    assert got[labels[0]] == (0.0,)  # NaN in the first scrape, a value in the second
    assert got[labels[3]] == (3.0, 3.0)
