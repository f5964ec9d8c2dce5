"""The flushes' append-only log (``store.samplelog``): its row format, what a flush writes,
reading through it, and moving it into chunks without changing any answer."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from itertools import groupby
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, select, text

from tests.store.test_codec import _value_bits
from tests.store_sql import raw_engine
from tritonwatch.schemas import tables as t
from tritonwatch.schemas.samples import Sample, make_labels
from tritonwatch.store import Query, Store, samplelog
from tritonwatch.store.chunks import encode, last_writes, sort_keep_last
from tritonwatch.store.engine import transaction
from tritonwatch.store.write import get_meta, insert_chunks, next_seq

T = 1_795_798_800  # an aligned hour


def _table_counts(store: Store) -> tuple[int, int]:
    with transaction(raw_engine(store), write=False) as conn:
        log_rows = conn.execute(select(func.count()).select_from(t.sample_log)).scalar_one()
        chunk_rows = conn.execute(select(func.count()).select_from(t.sample_chunks)).scalar_one()
    return int(log_rows), int(chunk_rows)


def _move(store: Store) -> int:
    return samplelog.transpose(raw_engine(store), gate=nullcontext())


@st.composite
def columns(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = draw(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 3 * 3_600_000)),
                         min_size=1, max_size=60, unique=True))
    values = draw(st.lists(st.floats(allow_nan=False), min_size=len(keys), max_size=len(keys)))
    m = sort_keep_last(np.array([k[0] for k in keys], np.int64),
                       np.array([k[1] for k in keys], np.int64) + T * 1000,
                       np.array(values, np.float64))
    return m.ids, m.ts, m.values


@settings(max_examples=200, deadline=None)
@given(cols=columns(), lo=st.integers(0, 3 * 3_600_000), span=st.integers(0, 3 * 3_600_000),
       pick=st.sets(st.integers(1, 50), min_size=1), kinds=st.integers(1, 4))
def test_rows_per_name_give_back_their_samples_and_reads_filter_them(
    cols, lo, span, pick, kinds
) -> None:
    ids, ts, values = cols
    # Series id i is named by owner 100 + i % kinds.
    unique = np.unique(ids)
    index = (unique, unique % kinds, 100 + np.arange(kinds, dtype=np.int64))
    # Rows are (owner, seq, start_ms, end_ms, n, data).
    rows = samplelog.log_rows(7, samplelog.named_columns("t", (ids, ts, values), index))
    assert {r[1] for r in rows} == {7}
    # A row per owner (name) and hour (the log moves an hour at a time).
    keys = [(r[0], r[2] // 3_600_000) for r in rows]
    assert all(r[2] // 3_600_000 == r[3] // 3_600_000 for r in rows)
    assert len(keys) == len(set(keys))
    assert {owner for owner, _ in keys} == {100 + int(i) % kinds for i in unique}
    lo_ms, hi_ms = T * 1000 + lo, T * 1000 + lo + span
    wanted = np.array(sorted(pick), np.int64)
    for r in rows:
        got = samplelog._Rows([7], [r[5]]).samples()
        assert {100 + int(i) % kinds for i in got[0]} == {r[0]}
        assert r[2:5] == (got[1].min(), got[1].max(), len(got[1]))
    # All rows decoded together, as ``read`` does, give back every sample...
    seqs = list(range(len(rows)))
    sids, sts, svals, sseqs = samplelog._Rows(seqs, [r[5] for r in rows]).samples()
    back = sort_keep_last(sids, sts, svals)
    assert back.ids.tolist() == ids.tolist() and back.ts.tolist() == ts.tolist()
    assert back.values.tobytes() == values.tobytes()  # bit for bit: -0.0, inf, subnormals
    assert sorted(set(sseqs.tolist())) == seqs
    # ...and what ``read`` keeps of them: the picked series' chunks overlapping [lo, hi].
    picked = samplelog.select_samples(seqs, [r[5] for r in rows], wanted,
                                      lo_ms=lo_ms, hi_ms=hi_ms)
    # Decoded a few rows at a time (as a read of many rows is): the same samples, in order.
    whole_slice = samplelog.READ_SLICE_WORDS
    samplelog.READ_SLICE_WORDS = 4
    try:
        sliced = samplelog.select_samples(seqs, [r[5] for r in rows], wanted,
                                          lo_ms=lo_ms, hi_ms=hi_ms)
    finally:
        samplelog.READ_SLICE_WORDS = whole_slice
    assert [c.tobytes() for c in sliced] == [c.tobytes() for c in picked]
    m = last_writes(*picked, lo_ms=lo_ms, hi_ms=hi_ms)
    keep = (ts >= lo_ms) & (ts <= hi_ms) & np.isin(ids, wanted)
    assert m.ids.tolist() == ids[keep].tolist() and m.ts.tolist() == ts[keep].tolist()
    assert m.values.tobytes() == values[keep].tobytes()


_DAMAGED = [
    b"",
    b"\x05" + b"\x00" * 7,
    np.array([1, 9, 2, 5], "<i8").tobytes(),
    np.array([2, 1, 2, 2**62, 2**62], "<i8").tobytes(),  # counts that would wrap around
    np.array([2**62, 1, 1, 5, 5], "<i8").tobytes(),
    np.array([2, 1, 1, 5, 5], "<i8").tobytes(),  # two chunks in room for one
    # Compact rows (one scrape): -k, ts, k ids, k values.
    np.array([-2, 7, 1, 2, 5], "<i8").tobytes(),  # a value short
    np.array([-(2**63), 7, 1, 5], "<i8").tobytes(),  # a count that wraps around
    np.array([-1, 7, 1, 5, 0], "<i8").tobytes(),  # a word too many
    # Compact rows with their ids as runs: -(2**40 + k), ts, runs, (first, length)*, values.
    np.array([-(2**40 + 3), 7, 1, 10, 2, 5, 5, 5], "<i8").tobytes(),  # runs hold 2 of 3
    np.array([-(2**40 + 2), 7, 1, 10, 0, 5, 5], "<i8").tobytes(),  # an empty run
    np.array([-(2**40 + 2), 7, 2, 10, 1, 5, 5], "<i8").tobytes(),  # a run short
    np.array([-(2**40 + 2), 7, -1, 10, 2, 5, 5], "<i8").tobytes(),  # a negative count
    np.array([-(2**40 + 2), 7, 1, 2**63 - 1, 2, 5, 5], "<i8").tobytes(),  # ids past int64
    np.array([-(2**62), 7, 1, 10, 2, 5, 5], "<i8").tobytes(),  # a huge k
    np.array([-(2**40 + 1), 7, 1, 10], "<i8").tobytes(),  # no room for its value
    # Compact rows with int32 values: -(2**41 [+ 2**40] + k), ts, ids or runs, values.
    np.array([-(2**41 + 3), 7, 1, 2, 3, 5], "<i8").tobytes(),  # a value short
    np.array([-(2**41 + 1), 7, 1, 5 + (1 << 32)], "<i8").tobytes(),  # odd k, upper half set
    np.array([-(2**41 + 2**40 + 3), 7, 1, 10, 3, 5], "<i8").tobytes(),  # a value short
    np.array([-(2**42), 7, 1, 5], "<i8").tobytes(),  # flags beyond both
    np.array([-(2**41 + 2), 7, 1, 2, 5, 5], "<i8").tobytes(),  # a word too many
]


@pytest.mark.parametrize("data", _DAMAGED)
def test_a_damaged_row_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="sample_log row"):
        samplelog._Rows([1], [data])


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 40), kinds=st.integers(1, 4), data=st.data())
def test_one_scrape_rows_are_compact_and_decode_with_any_rows_bit_for_bit(
    n: int, kinds: int, data: st.DataObject
) -> None:
    # One sample per series, a row's at one instant: the compact layout (16 bytes a sample),
    # or (where runs of consecutive ids take fewer words than the ids) with the ids as runs.
    ids = np.array(sorted(data.draw(st.sets(st.integers(1, 3 * n), min_size=n, max_size=n))),
                   np.int64)
    name_of = {int(i): (int(i) // data.draw(st.sampled_from([1, 5, 1000]))) % kinds
               for i in ids}
    codes = np.array([name_of[int(i)] for i in ids], np.int64)
    stamps = {k: data.draw(st.integers(0, 3_599_999)) for k in range(kinds)}
    ts = np.array([T * 1000 + stamps[int(c)] for c in codes], np.int64)
    # Any bits, or whole numbers around the int32 range (which a row packs when all its
    # values are: not -0.0, not one past either end).
    whole = st.one_of(st.integers(-(2**31) - 2, 2**31 + 1).map(float),
                      st.sampled_from([-0.0, 0.0, 1.0, -(2.0**31), 2.0**31 - 1, 2.0**31]))
    if data.draw(st.booleans()):
        values = np.array(data.draw(st.lists(_value_bits, min_size=n, max_size=n)),
                          np.uint64).view(np.float64)
    else:
        values = np.array(data.draw(st.lists(whole, min_size=n, max_size=n)), np.float64)
    index = (ids, codes, 100 + np.arange(kinds, dtype=np.int64))
    rows = samplelog.log_rows(3, samplelog.named_columns("t", (ids, ts, values), index))
    assert len(rows) == len(set(codes.tolist()))
    packed_rows = 0
    for r in rows:
        mine = ids[codes == r[0] - 100]
        vals = values[codes == r[0] - 100]
        runs = 1 + int(np.count_nonzero(np.diff(mine) != 1))
        assert r[2] == r[3] and r[4] == len(mine)
        packed = all(v.is_integer() and -(2**31) <= v < 2**31 and not (v == 0 and
                                                                       math.copysign(1, v) < 0)
                     for v in vals.tolist())
        packed_rows += packed
        value_words = (r[4] + 1) // 2 if packed else r[4]
        # -k, ts, ids, values; or -(2**40 + k), ts, the number of runs, (first, length) per
        # run, values; values as int32s, two a word, where all are whole and fit one.
        assert len(r[5]) == 8 * (3 + 2 * runs + value_words if 2 * runs + 1 < r[4]
                                 else 2 + r[4] + value_words)
        assert (-np.frombuffer(r[5][:8], "<i8")[0] >= 2**41) == packed
    # Decoded beside a row of the other layout (two samples of one series), as a read does.
    other = samplelog.log_rows(4, samplelog.named_columns(
        "t", (np.array([999, 999]), np.array([T * 1000, T * 1000 + 15_000]),
              np.array([1.5, -0.0])), (np.array([999]), np.array([0]), np.array([500]))))
    assert len(other) == 1 and len(other[0][5]) == 8 * (1 + 2 + 4)
    for mixed in (rows + other, other + rows):
        got = samplelog._Rows([r[1] for r in mixed], [r[5] for r in mixed]).samples()
        back = sort_keep_last(*got[:3])
        want_ids = np.concatenate([ids, [999, 999]])
        want_ts = np.concatenate([ts, [T * 1000, T * 1000 + 15_000]])
        want_v = np.concatenate([values, [1.5, -0.0]])
        order = np.lexsort((want_ts, want_ids))
        assert back.ids.tolist() == want_ids[order].tolist()
        assert back.ts.tolist() == want_ts[order].tolist()
        assert back.values.tobytes() == want_v[order].tobytes()  # bit for bit
        assert sorted(set(got[3].tolist())) == [3, 4]


def test_a_flush_writes_one_log_row_per_target_and_moving_it_changes_no_answer(
    store: Store,
) -> None:
    for k in range(4):
        for target in ("a", "b", "c"):
            store.write(target, T + k * 15, [
                Sample("x", make_labels({"i": str(i)}), float(k * 100 + i)) for i in range(50)
            ])
    assert store.flush() == 600
    assert _table_counts(store) == (3, 0)  # 150 series of one name, 600 samples: three rows
    assert store.count_samples() == 600
    before = store.read(Query("x", start=T, end=T + 3600)).series()
    assert len(before) == 150 and all(len(d.values) == 4 for d in before)
    assert store.read(Query("x", start=T, end=T + 59, step=60, agg="sum", target="b")).series()

    assert _move(store) == 600
    assert _table_counts(store) == (0, 150)  # one chunk per series
    assert store.count_samples() == 600
    assert store.read(Query("x", start=T, end=T + 3600)).series() == before
    assert _move(store) == 0


def test_the_last_write_wins_across_the_log_and_the_chunks(make_store) -> None:
    one, two = make_store(), make_store()  # two collectors writing the same series
    one.write("t", T, [Sample("x", (), 1.0)])
    one.write("t", T + 15, [Sample("x", (), 1.0)])
    one.flush()
    _move(one)
    two.write("t", T, [Sample("x", (), 2.0)])  # a later write of the same timestamp
    two.flush()
    (data,) = one.read(Query("x", start=T, end=T + 60)).series()
    assert data.values == (2.0, 1.0)
    one.write("t", T, [Sample("x", (), 3.0)])
    one.flush()  # two log rows now, of two flushes
    (data,) = two.read(Query("x", start=T, end=T + 60)).series()
    assert data.values == (3.0, 1.0)
    _move(two)
    assert _table_counts(one) == (0, 2)
    (data,) = one.read(Query("x", start=T, end=T + 60)).series()
    assert data.values == (3.0, 1.0)
    two.write("t", T, [Sample("x", (), 4.0)])
    two.flush()
    (data,) = one.read(Query("x", start=T, end=T + 60)).series()
    assert data.values == (4.0, 1.0)


def test_moving_in_small_transactions_moves_whole_targets(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", 13)
    for k in range(3):
        for target in ("a", "b", "c", "d"):
            store.write(target, T + k * 15, [Sample("x", (), float(k)), Sample("y", (), 1.0)])
        store.flush()
    before = store.read(Query("x", start=T, end=T + 60)).series()
    assert _table_counts(store) == (24, 0)  # per target, name and flush
    groups: list[samplelog._Group] = []
    real = samplelog._move

    def counting(conn, seqs, cutoff, group, *, redo):
        groups.append(group)
        assert not redo
        return real(conn, seqs, cutoff, group, redo=redo)

    monkeypatch.setattr(samplelog, "_move", counting)
    assert _move(store) == 24
    # 6 samples per target: two fit the budget, a third would not.
    assert [_owned_by(store, g) for g in groups] == [
        [(a, n) for a in targets for n in "xy"] for targets in ("ab", "cd")]
    assert _table_counts(store) == (0, 8)
    assert store.read(Query("x", start=T, end=T + 60)).series() == before


def test_a_target_larger_than_a_move_transaction_is_moved_a_few_names_at_a_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One target may hold far more than a transaction's budget (the NVML host's target holds
    # the GPU series joined across a fleet: 6.8 M samples an hour, which moved at once took
    # 270 MB): it is cut between its names, each name's rows (so each series) moved whole.
    monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", 4)
    names = ("x", "y", "z")
    for k in range(3):
        store.write("big", T + k * 15,
                    [Sample(n, (("gpu", str(g)),), float(k + g)) for n in names for g in (0, 1)])
        store.write("small", T + k * 15, [Sample("x", (), float(k))])
        store.flush()
    before = {n: store.read(Query(n, start=T, end=T + 60)).series() for n in names}
    groups = _record_groups(monkeypatch)
    assert _move(store) == 3 * 3 * 2 + 3
    # "big" holds 18 samples, more than the budget (4): moved by name, each of its names (6
    # samples) filling the budget alone; "small" whole.
    assert [_owned_by(store, g) for g in groups] == [
        [("big", "x")], [("big", "y")], [("big", "z")], [("small", "x")]]
    assert _table_counts(store)[0] == 0
    assert {n: store.read(Query(n, start=T, end=T + 60)).series() for n in names} == before


def test_a_target_just_over_the_budget_is_cut_between_names_each_row_decoded_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An hour of a Triton of 566 series at 15 s (135,840 samples) is about twice the budget.
    # Moved whole, its rows were decoded once to cut its series into ranges and once more per
    # range; cut between its names, each row is decoded once, into the same chunks.
    monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", 10)
    for k in range(4):
        store.write("t", T + k * 15, [Sample(n, (("i", str(i)),), float(k + i))
                                      for n in ("x", "y") for i in range(2)])
        store.write("u", T + k * 15, [Sample("x", (), float(k))])
        store.flush()
    before = {n: store.read(Query(n, start=T, end=T + 60)).series() for n in "xy"}
    groups = _record_groups(monkeypatch)
    decoded: list[int] = []
    real_rows = samplelog._Rows

    def counting(seqs, datas):
        decoded.extend(seqs)
        return real_rows(seqs, datas)

    monkeypatch.setattr(samplelog, "_Rows", counting)
    # "t" holds 16 samples (under twice the budget): a group per name (8 samples: two would
    # not fit), not one whole.
    assert _move(store) == 16 + 4
    assert [_owned_by(store, g) for g in groups] == [[("t", "x")], [("t", "y")], [("u", "x")]]
    # A row per owner and flush (four flushes), each decoded once.
    assert len(decoded) == 4 * sum(len(g.owners) for g in groups) == 3 * 4
    assert _table_counts(store) == (0, 5)
    assert {n: store.read(Query(n, start=T, end=T + 60)).series() for n in "xy"} == before


def _pack_reference(listing: list[tuple[str | None, int, int]], budget: int) -> list[list[int]]:
    """The move's groups of ``listing`` ((target, owner, samples) in target order) as the
    rule says, one object at a time: a target is a unit, or each of its owners one when it
    holds more than ``budget`` (the owners of no target are one unit whatever their size); a
    group takes consecutive units of one kind (whole targets, or one target's owners) while
    they fit."""
    units: list[tuple[str | None, list[int], int]] = []
    for target, rows in groupby(listing, key=lambda r: r[0]):
        sizes = [(owner, n) for _, owner, n in rows]
        total = sum(n for _, n in sizes)
        if total <= budget or target is None:
            units.append((None, [owner for owner, _ in sizes], total))
        else:
            units += [(target, [owner], n) for owner, n in sizes]
    groups: list[list[int]] = []
    size = 0
    kind: str | None = ""  # not a kind: the first unit starts a group
    for kind_of, owners, n in units:
        if groups and kind_of == kind and size + n <= budget:
            groups[-1] += owners
            size += n
            continue
        groups.append(list(owners))
        size, kind = n, kind_of
    return groups


@given(st.lists(st.tuples(st.sampled_from([None, "a", "b", "c", "d"]), st.integers(1, 12)),
                max_size=40), st.integers(1, 30))
@settings(max_examples=300, deadline=None)
def test_the_move_packs_its_groups_from_arrays_as_the_rule_says(
    rows: list[tuple[str | None, int]], budget: int
) -> None:
    # Grouped as the listing streams (target order, NULL first as SQLite sorts it), in arrays.
    listing = [(target, owner, n) for owner, (target, n) in enumerate(
        sorted(rows, key=lambda r: (r[0] is not None, r[0] or "")), 100)]
    starts = [i for i, r in enumerate(listing) if i == 0 or r[0] != listing[i - 1][0]]
    unowned = [k for k, i in enumerate(starts) if listing[i][0] is None]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(samplelog, "TRANSPOSE_SAMPLES", budget)
        groups = samplelog._pack(np.array([r[1] for r in listing], np.int64),
                                 np.array([r[2] for r in listing], np.int64),
                                 np.array(starts, np.int64), unowned)
    assert [g.owners.tolist() for g in groups] == _pack_reference(listing, budget)


def test_log_rows_of_an_owner_no_target_holds_move_with_the_rest(
    make_store: Callable[..., Store], caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    for k in range(3):
        store.write("kept", T + k * 15, [Sample("x", (), float(k)), Sample("y", (), 1.0)])
        store.write("lost", T + k * 15, [Sample("x", (), float(k))])
        store.flush()
    before = store.read(Query("x", start=T, end=T + 60)).series()
    assert len(before) == 2
    o = t.sample_log_owners.c
    with transaction(raw_engine(store), write=True) as conn:
        conn.execute(t.sample_log_owners.delete().where(o.target == "lost"))
    assert _move(store) == 3 * 3
    assert "belong to no owner; they are moved anyway" in caplog.text
    assert _table_counts(store)[0] == 0
    assert store.read(Query("x", start=T, end=T + 60)).series() == before


def _record_groups(monkeypatch: pytest.MonkeyPatch) -> list[samplelog._Group]:
    """The groups the next moves take, in order (``samplelog._move`` recorded, then run)."""
    groups: list[samplelog._Group] = []
    real = samplelog._move

    def recording(conn, seqs, cutoff, group, *, redo):
        groups.append(group)
        return real(conn, seqs, cutoff, group, redo=redo)

    monkeypatch.setattr(samplelog, "_move", recording)
    return groups


def _log(store: Store) -> list[tuple[str, str, int, int]]:
    """The log's rows as ``(target, name, seq, start_ms)``, in write order (then target's)."""
    c, o = t.sample_log.c, t.sample_log_owners.c
    with transaction(raw_engine(store), write=False) as conn:
        return [tuple(r) for r in conn.execute(
            select(o.target, o.name, c.seq, c.start_ms).join_from(
                t.sample_log, t.sample_log_owners, o.id == c.owner).order_by(c.seq, o.target))]


def _owned_by(store: Store, group: samplelog._Group) -> list[tuple[str, str]]:
    """The (target, name) pairs of a move group's owners."""
    o = t.sample_log_owners.c
    with transaction(raw_engine(store), write=False) as conn:
        return sorted(tuple(r) for r in conn.execute(
            select(o.target, o.name).where(o.id.in_(group.owners.tolist()))))


def _fill_four_targets(store: Store) -> list[Any]:
    for k in range(3):
        for target in ("a", "b", "c", "d"):
            store.write(target, T + k * 15, [Sample("x", (), float(k)), Sample("y", (), 1.0)])
        store.flush()
    return store.read(Query("x", start=T, end=T + 60)).series()


def _pending(store: Store) -> str | None:
    with transaction(raw_engine(store), write=False) as conn:
        return get_meta(conn, samplelog.MOVE_PENDING)


def test_a_move_that_crashed_before_deleting_its_rows_is_done_again_cleanly(
    make_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chunks are written group by group and the moved rows deleted by a last transaction:
    # a crash in between leaves both, and each sample must still be read once, then the next
    # move (which writes the same chunks again) must neither fail on their keys nor keep two.
    monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", 10)
    store = make_store()
    before = _fill_four_targets(store)

    def crash(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("killed")

    with monkeypatch.context() as m:
        m.setattr(samplelog, "_forget_flushes", crash)
        with pytest.raises(RuntimeError, match="killed"):
            _move(store)
    assert _table_counts(store) == (24, 8)  # the rows, and the chunks written from them
    assert _pending(store) is not None
    assert store.read(Query("x", start=T, end=T + 60)).series() == before
    assert store.count_samples() >= 24
    assert _move(store) == 24
    assert _table_counts(store) == (0, 8)
    assert _pending(store) is None
    assert store.read(Query("x", start=T, end=T + 60)).series() == before
    assert store.count_samples() == 24


def test_a_move_stopped_between_groups_deletes_the_rows_of_the_groups_it_moved(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", 12)  # two targets of 6 samples
    before = _fill_four_targets(store)
    asked = [0]

    def stop() -> bool:
        asked[0] += 1
        return asked[0] > 1  # after the first group (targets a and b)

    moved = samplelog.transpose(raw_engine(store), gate=nullcontext(), stop=stop)
    assert moved == 12
    assert _table_counts(store) == (12, 4)  # c and d still in the log; a and b in chunks
    assert _pending(store) is None
    assert {target for target, _, _, _ in _log(store)} == {"c", "d"}
    assert store.read(Query("x", start=T, end=T + 60)).series() == before
    assert _move(store) == 12
    assert _table_counts(store) == (0, 8)
    assert store.read(Query("x", start=T, end=T + 60)).series() == before


def test_the_rows_a_move_leaves_are_all_kept(make_store) -> None:
    # On SQLite the move replaces the log by a copy of what it leaves (``_keep_only_unmoved``):
    # the later hour's rows of a flush it moved, and flushes committed while it ran (one of
    # them late, into the hour being moved).
    store = make_store()
    for ts in (T + 3570, T + 3585, T + 3600, T + 3615):  # one flush across the hour's end
        store.write("a", ts, [Sample("x", (), ts - T)])
    store.flush()
    store.write("b", T + 3630, [Sample("x", (), 1.0)])
    store.flush()
    asked = [0]

    def meanwhile() -> bool:  # asked before the move's first group
        asked[0] += 1
        store.write("a", T + 3540, [Sample("x", (), -1.0)])  # late, into the hour moved
        store.write("b", T + 3645, [Sample("x", (), 2.0)])
        store.flush()
        return False

    moved = samplelog.transpose(raw_engine(store), gate=nullcontext(), stop=meanwhile,
                                before_ms=(T + 3600) * 1000)
    assert (asked[0], moved) == (1, 2)  # a's two samples of the first hour
    a, b = store.read(Query("x", start=T, end=T + 7200)).series()
    assert (a.ts, a.values) == ((T + 3540, T + 3570, T + 3585, T + 3600, T + 3615),
                                (-1.0, 3570.0, 3585.0, 3600.0, 3615.0))
    assert b.values == (1.0, 2.0)
    assert [(target, start_ms) for target, _, _, start_ms in _log(store)] == [
        ("a", (T + 3600) * 1000), ("b", (T + 3630) * 1000), ("a", (T + 3540) * 1000),
        ("b", (T + 3645) * 1000)]
    assert samplelog.transpose(raw_engine(store), gate=nullcontext(),
                               before_ms=(T + 3600) * 1000) == 1  # the late one
    assert store.read(Query("x", start=T, end=T + 7200)).series() == [a, b]
    assert samplelog.transpose(raw_engine(store), gate=nullcontext()) == 4
    assert _table_counts(store)[0] == 0
    assert store.read(Query("x", start=T, end=T + 7200)).series() == [a, b]


def _listed(store: Store) -> list[tuple[int, int]]:
    f = t.sample_log_flushes.c
    with transaction(raw_engine(store), write=False) as conn:
        return [(int(a), int(b)) for a, b in conn.execute(
            select(f.start_ms, f.end_ms).order_by(f.seq))]


def test_a_flush_across_the_hour_is_listed_from_the_cut_once_its_hour_moved(
    make_store,
) -> None:
    # Its listing kept the start of the moved hour: every later run listed it again, found
    # nothing to move and (on SQLite) copied the whole log all the same.
    store = make_store()
    for ts in (T + 3585, T + 3600, T + 3615):
        store.write("a", ts, [Sample("x", (), ts - T)])
    store.flush()
    cut = (T + 3600) * 1000
    asked = [0]

    def meanwhile() -> bool:  # a late flush into the hour moved, committed during the move
        asked[0] += 1
        store.write("b", T + 3590, [Sample("x", (), -1.0)])
        store.flush()
        return False

    engine = raw_engine(store)
    assert samplelog.transpose(engine, gate=nullcontext(), stop=meanwhile, before_ms=cut) == 1
    # The straddling flush now starts at the cut; the late one keeps its own start.
    assert _listed(store) == [(cut, (T + 3615) * 1000), ((T + 3590) * 1000, (T + 3590) * 1000)]
    assert samplelog.transpose(engine, gate=nullcontext(), before_ms=cut) == 1  # the late one
    assert _listed(store) == [(cut, (T + 3615) * 1000)]
    log_before = _log(store)
    assert samplelog.transpose(engine, gate=nullcontext(), before_ms=cut) == 0
    assert _log(store) == log_before
    a, b = store.read(Query("x", start=T, end=T + 7200)).series()
    assert (a.ts, a.values) == ((T + 3585, T + 3600, T + 3615), (3585.0, 3600.0, 3615.0))
    assert b.values == (-1.0,)
    # A store whose listing predates this (still starting before the cut) is corrected by
    # the next run, which moves nothing.
    with transaction(engine, write=True) as conn:
        conn.execute(t.sample_log_flushes.update().values(start_ms=cut - 15_000))
    assert samplelog.transpose(engine, gate=nullcontext(), before_ms=cut) == 0
    assert _listed(store) == [(cut, (T + 3615) * 1000)]
    assert _log(store) == log_before
    assert store.read(Query("x", start=T, end=T + 7200)).series() == [a, b]


def test_series_of_a_target_with_log_rows_are_not_deleted_as_empty(store: Store) -> None:
    store.write("t", T, [Sample("x", (), 1.0)])
    store.flush()
    # Resolved "long ago" as far as this retention run is concerned; only the log holds data.
    from tritonwatch.store import retention

    assert retention.delete_empty_series(raw_engine(store), resolved_before_ms=2**62) == 0
    assert [k.name for k in store.series()] == ["x"]
    _move(store)
    assert retention.delete_empty_series(raw_engine(store), resolved_before_ms=2**62) == 0


def test_only_empty_series_outside_the_log_are_deleted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tritonwatch.store import retention

    monkeypatch.setattr(retention, "_OWNERS_PER_QUERY", 2)  # several statements
    for target in ("a", "b", "c"):
        store.write(target, T, [Sample(name, make_labels({"i": str(i)}), 1.0)
                                for name in ("x", "y") for i in range(2)])
    store.flush()
    _move(store)  # every series now holds a chunk
    with transaction(raw_engine(store), write=True) as conn:
        ids = {(r.target, r.name, r.labels): r.id for r in conn.execute(select(t.series))}
        # Empty a's and b's series of x; b's x gets a new sample in the log; c's y empty too.
        emptied = [i for (tg, n, _), i in ids.items() if (tg, n) in {("a", "x"), ("b", "x"),
                                                                      ("c", "y")}]
        conn.execute(t.sample_chunks.delete().where(t.sample_chunks.c.series_id.in_(emptied)))
    store.write("b", T + 15, [Sample("x", make_labels({"i": "0"}), 2.0)])
    store.flush()
    engine = raw_engine(store)
    assert retention.delete_empty_series(engine, resolved_before_ms=0) == 0  # all resolved since
    # a's x (2 series) and c's y (2) go; b's x stays: the log holds one of its series' samples.
    assert retention.delete_empty_series(engine, resolved_before_ms=2**62) == 4
    left = {(k.target, k.name) for k in store.series()}
    assert left == {("a", "y"), ("b", "x"), ("b", "y"), ("c", "x")}
    # Their log owners go with them; the others' stay, and b's x still reads.
    o = t.sample_log_owners.c
    with transaction(engine, write=False) as conn:
        assert {tuple(r) for r in conn.execute(select(o.target, o.name))} == left
    (bx,) = store.read(Query("x", start=T, end=T + 60, target="b",
                             match={"i": "0"})).series()
    assert bx.values == (2.0,)
    # A target scraped again after its owner went: a new owner, its rows read and move.
    store._writer.forget_layouts()  # as the retention job does once series went
    store.write("c", T + 30, [Sample("y", (), 5.0)])
    store.flush()
    (cy,) = store.read(Query("y", start=T, end=T + 60, target="c")).series()
    assert cy.values == (5.0,)
    _move(store)
    assert store.read(Query("y", start=T, end=T + 60, target="c")).series() == [cy]


def test_an_owner_a_writer_resolved_since_is_kept(store: Store) -> None:
    from tritonwatch.store import retention

    store.write("t", T, [Sample("x", (), 1.0)])
    store.flush()
    with transaction(raw_engine(store), write=True) as conn:
        conn.execute(t.series.delete())  # as if retention had emptied and deleted them
    retention.delete_empty_series(raw_engine(store), resolved_before_ms=0)
    o = t.sample_log_owners.c
    with transaction(raw_engine(store), write=False) as conn:
        assert conn.execute(select(o.target, o.name)).all() == [("t", "x")]


def test_rollups_include_samples_still_in_the_log(store: Store) -> None:
    for k in range(40):
        store.write("t", T + k * 15, [Sample("x", (), 1.0)])
    store.flush()
    # The rollup ran (the hour is not over: nothing moved); a flush right after it puts more
    # into the same buckets.
    store.maintenance.rollup(T + 60)
    for k in range(40, 60):
        store.write("t", T + k * 15, [Sample("x", (), 1.0)])
    store.flush()
    assert _table_counts(store) == (2, 0)
    from tritonwatch.store import maintenance

    maintenance.rollup(raw_engine(store), now_ms=(T + 3600) * 1000)  # reads the log as it is
    (five,) = store.read(Query("x", start=T, end=T + 899, step=300, agg="count")).series()
    assert five.values == (20.0, 20.0, 20.0)


@pytest.mark.postgres
def test_postgres_stores_log_data_uncompressed(postgres_db_url: str) -> None:
    from tritonwatch.store import open_store

    s = open_store(postgres_db_url)
    try:
        s.migrations.apply()
        with transaction(raw_engine(s), write=False) as conn:
            storage = conn.execute(text(
                "SELECT attstorage FROM pg_attribute WHERE attrelid = 'sample_log'::regclass "
                "AND attname = 'data'"
            )).scalar_one()
        assert storage == "e"  # EXTERNAL: out of line, never pglz-compressed
    finally:
        s.close()


def test_a_damaged_row_is_dropped_loudly_and_the_rest_moves_on(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.write("good", T, [Sample("x", (), 1.0)])
    store.write("bad", T, [Sample("x", (), 2.0)])
    store.flush()
    with transaction(raw_engine(store), write=True) as conn:
        bad = select(t.sample_log_owners.c.id).where(t.sample_log_owners.c.target == "bad")
        conn.execute(t.sample_log.update().where(t.sample_log.c.owner.in_(bad)).values(
            data=np.array([1, 9, 2, 5], "<i8").tobytes()))
    monkey = pytest.MonkeyPatch()
    monkey.setattr(samplelog, "TRANSPOSE_SAMPLES", 1)  # one target per transaction
    try:
        store.maintenance.rollup(T + 3600 + 300)  # moves the hour first; does not raise
    finally:
        monkey.undo()
    assert "dropped a damaged sample_log row (target 'bad', name 'x'" in caplog.text
    assert _table_counts(store) == (0, 1)  # the damaged row is gone, the good one moved
    (data,) = store.read(Query("x", start=T, end=T + 60, target="good")).series()
    assert data.values == (1.0,)
    assert store.read(Query("x", start=T, end=T + 60, target="bad")).series() == []


def test_moved_chunks_keep_their_own_series_write_order(store: Store) -> None:
    # Target a's series is written by this store (log, seq s1), then by "another writer"
    # straight into the chunk table (an older tritonwatch on a shared database, seq s2), then
    # target b flushes (seq s3).  Moving a and b together must not rank a's older log write
    # above the other writer's chunk.
    store.write("a", T, [Sample("x", (), 1.0)])
    store.flush()
    with transaction(raw_engine(store), write=True) as conn:
        seq = next_seq(conn)
        sid = conn.execute(select(t.series.c.id).where(t.series.c.target == "a")).scalar_one()
        chunk = encode(np.array([sid]), np.array([T * 1000]), np.array([2.0]))
        insert_chunks(conn, chunk, seq)
    store.write("b", T, [Sample("x", (), 3.0)])
    store.flush()
    (data,) = store.read(Query("x", start=T, end=T + 60, target="a")).series()
    assert data.values == (2.0,)
    _move(store)
    assert _table_counts(store)[0] == 0
    (data,) = store.read(Query("x", start=T, end=T + 60, target="a")).series()
    assert data.values == (2.0,)


def test_the_first_rollup_starts_at_samples_still_in_the_log(store: Store) -> None:
    from tritonwatch.store import maintenance

    for k in range(40):
        store.write("t", T + k * 15, [Sample("x", (), 1.0)])
    store.flush()
    assert maintenance.rollup(raw_engine(store), now_ms=(T + 3600 + 300) * 1000) > 0
    (five,) = store.read(Query("x", start=T, end=T + 599, step=300, agg="count")).series()
    assert five.values == (20.0, 20.0)


def test_any_target_and_name_text_goes_through_the_log(store: Store) -> None:
    # PostgreSQL takes log rows by binary COPY: texts are written as their UTF-8 bytes.
    target, name = "triton-ä'; DROP TABLE series; --\"\t\\N", "métric_\u2603_total"
    store.write(target, T, [Sample(name, make_labels({"model": "m\u00fc"}), 1.5)])
    store.flush()
    (data,) = store.read(Query(name, start=T, end=T + 60, target=target)).series()
    assert (data.key.target, data.key.name, data.values) == (target, name, (1.5,))
    _move(store)
    (data,) = store.read(Query(name, start=T, end=T + 60, target=target)).series()
    assert data.values == (1.5,)


def _make_old_log(store: Store, version: int, key: str) -> None:
    """Turn ``store``'s log into that of schema ``version`` (3 to 9): rows naming their target
    and name as texts, keyed ``key``, no ``sample_log_owners``; before 7, no flush listed."""
    with transaction(raw_engine(store), write=True) as conn:
        blob = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
        conn.exec_driver_sql(
            "CREATE TABLE old_log AS SELECT o.target, o.name, l.seq, l.start_ms, l.end_ms, "
            "l.n, l.data FROM sample_log l JOIN sample_log_owners o ON o.id = l.owner")
        conn.exec_driver_sql("DROP TABLE sample_log")
        conn.exec_driver_sql("DROP TABLE sample_log_owners")
        conn.exec_driver_sql(
            "CREATE TABLE sample_log (target TEXT NOT NULL, name TEXT NOT NULL, "
            "seq BIGINT NOT NULL, start_ms BIGINT NOT NULL, end_ms BIGINT NOT NULL, "
            f"n INTEGER NOT NULL, data {blob} NOT NULL, "
            f"CONSTRAINT pk_sample_log PRIMARY KEY ({key}))")
        conn.exec_driver_sql("INSERT INTO sample_log SELECT * FROM old_log")
        conn.exec_driver_sql("DROP TABLE old_log")
        if version < 7:
            conn.execute(t.sample_log_flushes.delete())
        conn.execute(t.meta.update().where(t.meta.c.key == "schema_version").values(
            value=str(version)))


def _texts_log(store: Store) -> list[tuple[Any, ...]]:
    """The log's rows with their target and name: ``(target, name, seq, start_ms, end_ms, n,
    data)``, sorted."""
    c, o = t.sample_log.c, t.sample_log_owners.c
    with transaction(raw_engine(store), write=False) as conn:
        return sorted(tuple(r) for r in conn.execute(
            select(o.target, o.name, c.seq, c.start_ms, c.end_ms, c.n, c.data).join_from(
                t.sample_log, t.sample_log_owners, o.id == c.owner)))


def test_a_schema_6_log_is_given_owners_and_its_flushes_listed(store_url: str) -> None:
    from sqlalchemy import inspect

    from tritonwatch.store import open_store

    old = open_store(store_url)
    old.migrations.apply()
    for k in range(3):  # three flushes, two targets, two names
        for target in ("a", "b"):
            old.write(target, T + k * 15, [Sample("x", make_labels({"i": "0"}), float(k)),
                                           Sample("y", (), 10.0 + k)])
        old.flush()
    before = {name: old.read(Query(name, start=T, end=T + 60)).series() for name in "xy"}
    rows = _texts_log(old)
    assert len(rows) == 12
    _make_old_log(old, 6, "target, name, seq")
    old.close()

    s = open_store(store_url)
    try:
        s.migrations.apply()
        with transaction(raw_engine(s), write=False) as conn:
            assert inspect(conn).get_pk_constraint("sample_log")["constrained_columns"] == [
                "seq", "owner", "start_ms"]
            owners = conn.execute(select(t.sample_log_owners.c.target,
                                         t.sample_log_owners.c.name)).all()
            assert sorted(owners) == [(a, n) for a in "ab" for n in "xy"]
            listed = conn.execute(select(t.sample_log_flushes).order_by("seq")).all()
            assert [(f.start_ms, f.end_ms) for f in listed] == [
                ((T + k * 15) * 1000, (T + k * 15) * 1000) for k in range(3)]
            assert conn.execute(select(t.meta.c.value).where(
                t.meta.c.key == "schema_version")).scalar_one() == str(t.SCHEMA_VERSION)
        assert _texts_log(s) == rows
        for name in "xy":
            assert s.read(Query(name, start=T, end=T + 60)).series() == before[name]
            # Only the flushes overlapping a window are read: the middle one here.
            (one,) = s.read(Query(name, start=T + 15, end=T + 15, target="a")).series()
            assert one.ts == (T + 15,)
        # New flushes take the migrated owners; the move takes old and new rows together.
        s.write("a", T + 45, [Sample("y", (), 13.0)])
        s.flush()
        assert len(_texts_log(s)) == 13 and len(owners) == 4
        assert samplelog.transpose(raw_engine(s), gate=nullcontext()) == 13
        assert _table_counts(s) == (0, 4)  # a chunk per series
        (a_y, _) = s.read(Query("y", start=T, end=T + 60)).series()
        assert a_y.values == (10.0, 11.0, 12.0, 13.0)
        assert s.read(Query("x", start=T, end=T + 60)).series() == before["x"]
    finally:
        s.close()


def test_a_schema_7_store_opens_as_10_and_its_rows_of_every_layout_read(
    store_url: str,
) -> None:
    from tritonwatch.store import open_store

    old = open_store(store_url)
    old.migrations.apply()
    old.write("t", T + 15, [Sample("x", make_labels({"i": str(i)}), 10.0 + i) for i in range(4)])
    old.flush()  # four consecutive ids: listed as one run; whole values: packed (schema 9)
    with transaction(raw_engine(old), write=True) as conn:
        ids = conn.execute(select(t.series.c.id).where(t.series.c.name == "x")
                           .order_by(t.series.c.labels)).scalars().all()
        owner, ranged = conn.execute(select(t.sample_log.c.owner, t.sample_log.c.data)).one()
        assert np.frombuffer(ranged, "<i8")[0] == -(2**41 + 2**40 + 4)
        assert len(ranged) == 8 * (3 + 2 + 2)
        # Version 7's compact layout (ids listed), as it wrote every one-scrape row.
        seq = next_seq(conn)
        data = np.array([-4, T * 1000, *ids, 0, 0, 0, 0], "<i8")
        data[6:] = np.array([1.5, 2.5, 3.5, 4.5]).view("<i8")
        samplelog.insert(conn, [(owner, seq, T * 1000, T * 1000, 4, data.tobytes())])
        samplelog.record_flush(conn, seq, T * 1000, T * 1000)
    _make_old_log(old, 7, "seq, target, name, start_ms")
    old.close()
    s = open_store(store_url)
    try:
        s.migrations.apply()
        with transaction(raw_engine(s), write=False) as conn:
            assert conn.execute(select(t.meta.c.value).where(
                t.meta.c.key == "schema_version")).scalar_one() == str(t.SCHEMA_VERSION) == "10"
        got = s.read(Query("x", start=T, end=T + 60)).series()
        assert [d.values for d in got] == [(1.5 + i, 10.0 + i) for i in range(4)]
        _move(s)
        assert s.read(Query("x", start=T, end=T + 60)).series() == got
    finally:
        s.close()


def test_a_target_whose_series_change_keeps_its_names_owners(store: Store) -> None:
    # A changed scrape makes a new layout, which takes the owners of its target's previous
    # one by name: only a new name is resolved (and a row of a name keeps one owner).
    store.write("t", T, [Sample("x", (), 1.0)])
    store.flush()
    store.write("t", T + 15, [Sample("x", (), 2.0), Sample("y", (), 3.0)])
    store.write("u", T + 15, [Sample("x", (), 4.0)])
    store.flush()
    log = _log(store)
    assert [(target, name) for target, name, _, _ in log] == [
        ("t", "x"), ("t", "x"), ("t", "y"), ("u", "x")]
    o = t.sample_log_owners.c
    with transaction(raw_engine(store), write=False) as conn:
        owners = conn.execute(select(o.id, o.target, o.name).order_by(o.id)).all()
    assert [(target, name) for _, target, name in owners] == [("t", "x"), ("t", "y"),
                                                             ("u", "x")]
    (tx,) = store.read(Query("x", start=T, end=T + 60, target="t")).series()
    assert tx.values == (1.0, 2.0)


def _chunk_rows(store: Store) -> list[tuple[Any, ...]]:
    c = t.sample_chunks.c
    with transaction(raw_engine(store), write=False) as conn:
        return [(r[0], r[1], r[2], r[3], r[4], bytes(r[5])) for r in conn.execute(
            select(c.series_id, c.start_ms, c.end_ms, c.seq, c.n, c.data)
            .order_by(c.series_id, c.start_ms, c.seq))]


@pytest.mark.parametrize("budget", [3, 8])
def test_a_name_larger_than_a_move_transaction_is_moved_a_batch_of_series_at_a_time(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    # One name of the NVML host's target holds a GPU series of every target of a fleet
    # (hundreds of thousands of samples an hour); decoded and sorted whole it was the
    # collector's peak RSS every hour.  Its rows are decoded a few at a time, once per range
    # of series, keeping that range's: the chunks written must be byte for byte those of a
    # move done whole, last writes, infinities, a series seen in some flushes only and one
    # larger than a batch (budget 3) included; and moving them again after a crash (``redo``)
    # replaces them.
    from tritonwatch.store import open_store

    def filled(path: str) -> Store:
        s = open_store(f"sqlite:///{tmp_path}/{path}.db")
        s.migrations.apply()
        for k in range(6):
            samples = [Sample("gpu_util", (("gpu", str(g)),), float(k * g) / 3)
                       for g in range(9) if (g + k) % 4]
            samples += [Sample("gpu_util", (("gpu", "inf"),), math.inf if k % 2 else -math.inf)]
            s.write("nvml", T + k * 15, samples)
            s.flush()
        # A second write of the same timestamps, in a later flush: the last write wins.
        s.write("nvml", T + 15, [Sample("gpu_util", (("gpu", str(g)),), -1.0 - g)
                                 for g in range(9)])
        s.flush()
        return s

    whole, batched, redone = filled("whole"), filled("batched"), filled("redone")
    try:
        before = whole.read(Query("gpu_util", start=T, end=T + 3600)).series()
        assert _move(whole) == 55  # 40 + 6 infinities + 9 written again
        batches: list[int] = []
        real = samplelog._write_chunks

        def counting(conn, sids, *args, **kwargs):
            batches.append(len(np.unique(sids)))
            return real(conn, sids, *args, **kwargs)

        monkeypatch.setattr(samplelog, "_write_chunks", counting)
        monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", budget)
        # Rows decoded a few at a time too, each range of series from every slice of rows.
        monkeypatch.setattr(samplelog, "DECODE_SAMPLES", 2 * budget)
        assert _move(batched) == 55
        # 55 samples of 10 series (at most 7 samples each) in batches of whole series.
        assert len(batches) >= 55 // max(budget, 7) and sum(batches) == 10, batches
        assert _chunk_rows(batched) == _chunk_rows(whole)
        assert batched.read(Query("gpu_util", start=T, end=T + 3600)).series() == before
        assert _table_counts(batched) == (0, 10)

        # A run that crashed after writing the chunks: the next one writes them again.
        f = t.sample_log_flushes.c
        with transaction(raw_engine(redone), write=True) as conn:
            seqs = samplelog._listed(conn, select(f.seq))
            owners = list(conn.execute(select(t.sample_log_owners.c.id)).scalars())
            group = samplelog._Group(np.array(owners, np.int64))
            assert samplelog._move(conn, seqs, (1 << 63) - 1, group, redo=False) == 55
            assert samplelog._move(conn, seqs, (1 << 63) - 1, group, redo=True) == 55
        assert _chunk_rows(redone) == _chunk_rows(whole)
    finally:
        for s in (whole, batched, redone):
            s.close()


def _plan(conn: Any, query: Any, params: dict[str, Any] | None = None) -> str:
    """PostgreSQL's plan of ``query`` (SQLAlchemy), as the store runs it: the statement and
    parameters the driver is given are taken on their way, and explained instead."""
    sent: list[tuple[str, Any]] = []

    def explain(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any
                ) -> tuple[str, Any]:
        sent.append((statement, parameters))
        return "EXPLAIN " + statement, parameters

    event.listen(conn, "before_cursor_execute", explain, retval=True)
    try:
        result = conn.execute(query, params or {})
        rows = result.cursor.fetchall() if result.cursor is not None else []
    finally:
        event.remove(conn, "before_cursor_execute", explain)
    assert len(sent) == 1
    return "\n".join(r[0] for r in rows)


def test_postgres_finds_a_few_owners_log_rows_by_key_whatever_its_statistics(
    postgres_db_url: str,
) -> None:
    """Reads of a few series, and each group a move takes, seek the log's rows by ``(seq,
    owner)``: neither may scan the whole log, as PostgreSQL did when its statistics were
    taken while the log held a few owners (a new collector, new targets): a hash join over
    every row of the hour, for each of thousands of reads and groups an hour."""
    from tritonwatch.store import open_store

    s = open_store(postgres_db_url)
    try:
        s.migrations.apply()
        names = [f"m{k}" for k in range(8)]

        def scrape(targets: int, at: float) -> None:
            for i in range(targets):
                s.write(f"t{i}", at, [Sample(n, (("gpu", "0"),), at) for n in names])
            s.flush()

        scrape(2, T)
        with transaction(raw_engine(s), write=True) as conn:
            conn.execute(text("ALTER TABLE sample_log SET (autovacuum_enabled = off)"))
            conn.execute(text("ANALYZE sample_log"))  # 16 owners, one flush
        for k in range(1, 40):
            scrape(60, T + 15 * k)
        with transaction(raw_engine(s), write=False) as conn:
            ids = conn.execute(select(t.series.c.id).where(t.series.c.target == "t7")).scalars()
            read = _plan(conn, samplelog._log_rows("postgresql"), {
                "ids": list(ids), "lo_ms": T * 1000, "hi_ms": (T + 600) * 1000})
            owners = conn.execute(select(t.sample_log_owners.c.id).where(
                t.sample_log_owners.c.target == "t7")).scalars()
            flushes = samplelog._listed(conn, select(t.sample_log_flushes.c.seq))
            assert isinstance(flushes, list) and len(flushes) == 40
            move = _plan(conn, samplelog._group_rows(
                conn, flushes, (T + 3600) * 1000, samplelog._Group(np.fromiter(owners, np.int64))))
    finally:
        s.close()
    for plan in (read, move):
        assert "Seq Scan on sample_log " not in plan, plan
        assert "owner = ANY" in plan.split("Index Cond:", 1)[-1].split("\n", 1)[0], plan


def test_the_ranges_of_a_large_name_are_counted_in_the_memory_of_its_series(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The series ranges of a name too large for one move transaction are counted slice by
    slice into running totals.  Collected first, every slice's list of its series (a name of
    10,000 series flushed 240 times: 1.2 M ids) was sorted at once: 35 MB above a 1,000-target
    collector's usual high-water mark, every hour.  Here 300 series flushed 120 times, a
    slice a flush: 36,000 ids listed, 300 counted."""
    import tracemalloc

    for k in range(120):
        store.write("vm", T + 15 * k, [Sample("sli:gpu", (("gpu", str(g)),), float(g + k))
                                       for g in range(300)])
        store.flush()
    monkeypatch.setattr(samplelog, "DECODE_SAMPLES", 300)
    monkeypatch.setattr(samplelog, "TRANSPOSE_SAMPLES", 9_000)
    with transaction(raw_engine(store), write=False) as conn:
        rows = conn.execute(select(t.sample_log.c.seq, t.sample_log.c.n, t.sample_log.c.data)
                            .order_by(t.sample_log.c.seq)).all()
    seqs, datas = [r[0] for r in rows], [bytes(r[2]) for r in rows]
    slices = list(samplelog._slices([r[1] for r in rows], samplelog.DECODE_SAMPLES))
    assert len(slices) == 120
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        ranges = samplelog._series_ranges(seqs, datas, slices)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    # 36,000 samples in ranges of 9,000: 75 series each, the ids in order and all covered.
    with transaction(raw_engine(store), write=False) as conn:
        ids = sorted(conn.execute(select(t.series.c.id).where(t.series.c.target == "vm"))
                     .scalars())
    assert ranges == [(ids[a], ids[a + 74]) for a in range(0, 300, 75)]
    # A slice's decode (a row of 300 samples: its index, some 60 kB) and the totals; listed
    # whole, the 36,000 ids and their sort took 2.4 MB; counted as they come, 64 kB.
    assert peak < 400_000, peak
