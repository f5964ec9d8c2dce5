"""``store.write.sample_columns`` (a flush's samples grouped per series without sorting)
against the general path, ``SampleWriter._sorted_columns`` (every sample lexsorted by id and
time)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonwatch.store.flush as store_module
from tritonwatch.schemas.samples import Labels, make_labels
from tritonwatch.store import Query, Store
from tritonwatch.store.flush import SampleWriter
from tritonwatch.store.write import Layout, sample_columns, target_groups

#: The log owners the tests' layouts take (``store.flush`` resolves them in the database).
OWNERS: dict[tuple[str, str], int] = {}


def owned(lay: Layout) -> Layout:
    """``lay`` with an owner for each of its names (one per (target, name), stable)."""
    lay.owners = np.array([OWNERS.setdefault((lay.target, name), 100 + len(OWNERS))
                           for name in lay.name_codes()[1]], np.int64)
    return lay


def named(owner: int) -> tuple[str, str]:
    return next(key for key, o in OWNERS.items() if o == owner)


def layout(target: str, ids: list[int]) -> Layout:
    names = [f"m{i}" for i in range(len(ids))]
    lay = Layout(target, names, [make_labels({"i": str(i)}) for i in range(len(ids))], now=0.0)
    lay.ids = np.array(ids, np.int64)
    return owned(lay)


@st.composite
def flushes(draw: st.DrawFn) -> list[tuple[Layout, int, np.ndarray, int]]:
    layouts = []
    next_id = 0
    for t in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 2))):  # a second layout: the target's series changed
            n = draw(st.integers(1, 6))
            ids = list(range(next_id, next_id + n))
            if draw(st.booleans()):
                next_id += n  # the target's next layout holds other series...
            if n > 1 and draw(st.integers(0, 4)) == 0:
                ids[-1] = ids[0]  # ...or one series listed twice
            if draw(st.integers(0, 4)) == 0:
                ids[0] = -1  # never seen with a value
            layouts.append(layout(f"t{t}", ids))
        next_id += 10
    work = []
    for _ in range(draw(st.integers(1, 8))):
        lay = draw(st.sampled_from(layouts))
        ts = draw(st.integers(0, 6)) * 1000
        values = np.array(
            draw(st.lists(st.sampled_from([0.0, 1.5, -2.0, np.inf, np.nan]),
                          min_size=len(lay.ids), max_size=len(lay.ids))), np.float64)
        if (lay.ids < 0).any():
            values[lay.ids < 0] = np.nan  # resolution leaves no id only where all are NaN
        work.append((lay, ts, values, int(np.isnan(values).sum())))
    return work


@settings(max_examples=400, deadline=None)
@given(flushes())
def test_grouped_columns_hold_the_same_samples_as_the_sorted_ones(work) -> None:
    fast = sample_columns([(lay, ts, values) for lay, ts, values, _ in work])
    # The general path, a target at a time, in (id, ts) order.
    slow = [np.concatenate(c) for c in zip(
        *(SampleWriter._sorted_columns(w)[:3] for w in target_groups(work, 1)), strict=True)]
    by_key = np.lexsort((slow[1], slow[0]))
    slow = [c[by_key] for c in slow]
    if fast is None:
        # Declined only for what needs the sort: two layouts of one target, a layout's scrapes
        # out of time order, or a series listed twice.
        targets: dict[str, set[int]] = {lay.target: set() for lay, *_ in work}
        for lay, *_ in work:
            targets[lay.target].add(id(lay))
        stamps: dict[int, list[int]] = {}
        for lay, ts, *_ in work:
            stamps.setdefault(id(lay), []).append(ts)
        dup = any(len({i for i in lay.ids.tolist() if i >= 0})
                  < int((lay.ids >= 0).sum()) for lay, *_ in work)
        assert (any(len(v) > 1 for v in targets.values())
                or any(s != sorted(set(s)) for s in stamps.values()) or dup)
        return
    ids, ts, values, rows, owners = fast
    keep = ~np.isnan(values)
    ids, ts, values, rows = ids[keep], ts[keep], values[keep], rows[keep]
    # Each sample's row is its series' (target, name)'s owner, and a row's samples together.
    names = {i: (lay.target, lay.names[p]) for lay, *_ in work
             for p, i in enumerate(lay.ids.tolist())}
    assert [named(owners[r]) for r in rows.tolist()] == [names[i] for i in ids.tolist()]
    row_starts = np.r_[0, np.flatnonzero(np.diff(rows)) + 1] if len(rows) else rows
    assert len(row_starts) == len(set(rows.tolist()))
    # Each series' samples together and in time order (what encode() needs)...
    if len(ids):
        starts = np.r_[0, np.flatnonzero(np.diff(ids)) + 1]
        assert len(starts) == len(set(ids.tolist()))
    same = ids[1:] == ids[:-1]
    assert (ts[1:][same] > ts[:-1][same]).all()
    # ...and, once sorted, exactly the general path's samples.
    order = np.lexsort((ts, ids))
    for got, want in zip((ids[order], ts[order], values[order]), slow, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_steady_flush_takes_the_grouped_path() -> None:
    a, b = layout("a", [5, 3, 9]), layout("b", [4, 8])
    work = [(a, 1000, np.array([1.0, 2.0, 3.0])), (b, 1000, np.array([4.0, 5.0])),
            (a, 2000, np.array([6.0, 7.0, 8.0]))]
    columns = sample_columns(work)
    assert columns is not None
    ids, ts, values, rows, owners = columns
    assert ids.tolist() == [5, 5, 3, 3, 9, 9, 4, 8]
    assert ts.tolist() == [1000, 2000, 1000, 2000, 1000, 2000, 1000, 1000]
    assert values.tolist() == [1.0, 6.0, 2.0, 7.0, 3.0, 8.0, 4.0, 5.0]
    assert [named(owners[r]) for r in rows.tolist()] == [
        ("a", "m0"), ("a", "m0"), ("a", "m1"), ("a", "m1"), ("a", "m2"), ("a", "m2"),
        ("b", "m0"), ("b", "m1")]


def test_grouped_columns_put_a_names_series_together_in_id_order() -> None:
    # Exposition order interleaves names (a histogram's _bucket, _sum, _count per label set):
    # a log row per name wants each name's series together.
    lay = Layout("a", ["x", "y", "x", "y"],
                 [make_labels({"i": str(i)}) for i in range(4)], now=0.0)
    lay.ids = np.array([9, 3, 5, 7], np.int64)
    columns = sample_columns([(owned(lay), 1000, np.array([1.0, 2.0, 3.0, 4.0]))])
    assert columns is not None
    assert columns.ids.tolist() == [5, 9, 3, 7]
    assert columns.values.tolist() == [3.0, 1.0, 2.0, 4.0]
    assert [named(columns.owners[r]) for r in columns.rows.tolist()] == [
        ("a", "x"), ("a", "x"), ("a", "y"), ("a", "y")]


# --- a flush in groups of targets -----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 7)), max_size=20),
       st.integers(1, 20))
def test_target_groups_keep_each_target_whole_and_in_order(items, limit) -> None:
    layouts: dict[int, Layout] = {}
    work = []
    for k, (t, n) in enumerate(items):
        lay = layouts.get(t)
        if lay is None or len(lay.ids) != n:  # a changed series list: a new layout
            lay = layouts[t] = layout(f"t{t}", list(range(n)))
        work.append((lay, k))
    groups = list(target_groups(work, limit))
    # Every item once; each target's items in one group, in their order; targets in order of
    # their first item.
    flat = [item for group in groups for item in group]
    first_seen = list(dict.fromkeys(lay.target for lay, _ in work))
    assert flat == [item for target in first_seen for item in work if item[0].target == target]
    owner: dict[str, int] = {}
    for g, group in enumerate(groups):
        for lay, _ in group:
            assert owner.setdefault(lay.target, g) == g
    # Each group reaches the limit (all but the last), and would not without its last target.
    for group in groups:
        assert group
    for group in groups[:-1]:
        sizes = [len(lay.ids) for lay, _ in group]
        assert sum(sizes) >= limit
        last = group[-1][0].target
        assert sum(len(lay.ids) for lay, _ in group if lay.target != last) < limit


def _scrapes(
    rng: np.random.Generator,
) -> list[tuple[str, float, list[str], list[Labels], np.ndarray]]:
    """A few scrapes of five targets, with NaN, a changed series list, a repeated series."""
    out = []
    for step in range(3):
        for t in range(5):
            n = 4 + t + (1 if (t == 2 and step == 2) else 0)  # t2's series change at step 2
            names = [f"m{i % 3}" for i in range(n)]
            labels = [make_labels({"i": str(i)}) for i in range(n)]
            if t == 4:  # one series listed twice: the later value wins
                names.append(names[0])
                labels.append(labels[0])
                n += 1
            values = rng.normal(size=n)
            values[rng.random(n) < 0.2] = np.nan
            out.append((f"t{t}", 1_800_000_000.0 + 15 * step, names, labels, values))
    return out


def _stored(
    s: Store, prefix: str
) -> dict[tuple[str, str, Labels], tuple[list[float], list[float]]]:
    """Every stored sample of the targets named ``prefix...``, keyed without the prefix."""
    got = {}
    for key in s.series():
        if not key.target.startswith(prefix):
            continue
        for data in s.read(Query(key.name, start=0, end=2e9, target=key.target,
                                 match=dict(key.labels))).series():
            got[(data.key.target.removeprefix(prefix), data.key.name, data.key.labels)] = (
                list(data.ts), list(data.values))
    return got


def test_a_flush_in_small_groups_stores_what_one_group_does(
    make_store, monkeypatch
) -> None:
    rng = np.random.default_rng(7)
    scrapes = _scrapes(rng)
    whole, grouped = make_store(), make_store()
    # The two stores share one database: their targets are told apart by a prefix.
    for s, prefix in ((whole, "w"), (grouped, "g")):
        if s is grouped:
            monkeypatch.setattr(store_module, "FLUSH_GROUP_SAMPLES", 3)
        for target, ts, names, labels, values in scrapes:
            s.write_columns(prefix + target, ts, names, labels, values)
        written = s.flush()
        assert written == sum(int((~np.isnan(v)).sum()) for *_, v in scrapes) - 3  # t4 twice
    got, want = _stored(grouped, "g"), _stored(whole, "w")
    # t0..t4 list 4, 5, 6 (7 at the last step), 7 and 8 (one twice) series; the random NaN
    # leave a few without any value, hence without a row.
    assert 25 <= len(want) <= 31
    assert got == want


def test_name_order_is_rebuilt_from_the_kept_grouping_and_follows_filled_ids() -> None:
    # The layout keeps only the grouping (int32 positions) and the name codes; the ids, codes
    # and keys of each answer are derived from them, so they follow a fill() of new ids.
    names = ["b", "a", "b", "a", "c"]
    labels = [make_labels({"i": str(i)}) for i in range(len(names))]
    lay = owned(Layout("t", names, labels, now=0.0))
    lay.ids = np.array([5, 9, 2, 7, -1], np.int64)
    lay.unresolved = 1
    first = lay.name_order()
    assert first is not None
    # Grouped by name in first-seen order ("b", "a", "c"), ascending ids within a name.
    assert first.positions.tolist() == [2, 0, 3, 1, 4]
    assert first.ids.tolist() == lay.ids[first.positions].tolist()
    _codes, distinct = lay.name_codes()
    assert distinct == ["b", "a", "c"]
    assert [distinct[c] for c in first.codes.tolist()] == [names[p] for p in first.positions]
    assert [named(o) for o in first.owners.tolist()] == [("t", "b"), ("t", "a"), ("t", "c")]
    assert first.codes.dtype == np.int64 and first.ids.dtype == np.int64
    lay.fill({("t", "c", labels[4]): 1})
    again = lay.name_order()
    assert again is not None
    assert again.ids.tolist() == lay.ids[again.positions].tolist()
    assert 1 in again.ids.tolist()
    ids, codes_by_id, index_owners = lay.name_index()
    assert ids.tolist() == sorted(lay.ids.tolist())
    assert [named(index_owners[c])[1] for c in codes_by_id.tolist()] == [
        names[int(np.flatnonzero(lay.ids == i)[0])] for i in ids.tolist()]


def test_name_order_declines_a_series_listed_twice() -> None:
    lay = layout("t", [3, 4, 3])
    assert lay.name_order() is None
