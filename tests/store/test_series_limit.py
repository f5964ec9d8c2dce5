"""``Store.limit_series``: a cap on the series a target has in the store, on both backends.

A spy around ``store.write.resolve_series`` (the real function underneath, as in
test_series_ids.py) shows that refused series are not asked about again on every flush.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonwatch.schemas.samples import Labels
from tritonwatch.store import Query


def columns(keys: range) -> tuple[list[str], list[Labels]]:
    return ["m"] * len(keys), [(("k", f"{k:03d}"),) for k in keys]


class Refusals:
    def __init__(self) -> None:
        self.told: list[tuple[str, int, int]] = []

    def __call__(self, target: str, series: int, samples: int) -> None:
        self.told.append((target, series, samples))


def write(st: Any, target: str, ts: float, keys: range, values: Any = None) -> None:
    names, labels = columns(keys)
    if values is None:
        values = np.full(len(keys), ts)
    st.write_columns(target, ts, names, labels, np.asarray(values, np.float64))


def test_a_target_at_its_limit_keeps_its_series_and_gets_no_new_ones(make_store):
    st = make_store()
    told = Refusals()
    st.limit_series({"t0": 12, "t1": 0}, on_refused=told)  # 0: no limit
    for target in ("t0", "t1", "t2"):
        write(st, target, 1000.0, range(10))
    st.flush()
    assert told.told == []
    # Ten new series each (and the ten known ones): t0 has room for two of them.
    for target in ("t0", "t1", "t2"):
        write(st, target, 1001.0, range(20))
    st.flush()
    assert told.told == [("t0", 8, 8)]
    assert [len(st.series(Query(target=t))) for t in ("t0", "t1", "t2")] == [12, 20, 20]
    # The known series got the refused scrape's samples.
    got = {d.labels: d.values for d in st.read(Query("m", start=0, end=2000, target="t0")).series()}
    assert got[(("k", "000"),)] == (1000.0, 1001.0)
    assert got[(("k", "011"),)] == (1001.0,)  # new, within the room: key order
    assert (("k", "012"),) not in got


def test_refused_series_are_not_resolved_again_on_every_flush(make_store, calls):
    st = make_store()
    told = Refusals()
    st.limit_series({"t0": 5}, on_refused=told)
    write(st, "t0", 1000.0, range(8))
    st.flush()
    assert told.told == [("t0", 3, 3)]
    calls.clear()
    for r in range(1, 4):
        values = np.full(8, 1000.0 + r)
        values[7] = np.nan  # a NaN of a refused series is no sample dropped
        write(st, "t0", 1000.0 + r, range(8), values)
        st.flush()
    assert calls == []
    assert told.told[1:] == [("t0", 3, 2)] * 3
    assert len(st.series(Query(target="t0"))) == 5
    (kept,) = st.read(Query("m", start=0, end=2000, target="t0", match={"k": "004"})).series()
    assert kept.values == (1000.0, 1001.0, 1002.0, 1003.0)


def test_refused_series_are_asked_about_again_when_the_target_is_resolved_again(make_store):
    st = make_store()
    told = Refusals()
    st.limit_series({"t0": 5}, on_refused=told)
    write(st, "t0", 1000.0, range(8))
    st.flush()
    assert len(st.series(Query(target="t0"))) == 5
    # New limits (as after a config change) drop the resolved layouts, as the series cache's
    # TTL and retention do: the refused series are asked about again.
    st.limit_series({"t0": 7}, on_refused=told)
    write(st, "t0", 1001.0, range(8))
    st.flush()
    assert len(st.series(Query(target="t0"))) == 7
    assert told.told == [("t0", 3, 3), ("t0", 1, 1)]
