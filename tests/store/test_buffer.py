"""``store.buffer.Buffer``: the one buffer type behind a store's samples, health and probe rows."""

from __future__ import annotations

import threading

import pytest

from tritonwatch.store import StoreError
from tritonwatch.store.buffer import Buffer


def make(bound: int = 10) -> tuple[Buffer[str], list[int]]:
    dropped: list[int] = []
    buf: Buffer[str] = Buffer(owner="sqlite:///x.db", bound=bound, lock=threading.Lock(),
                              weight=len, on_drop=dropped.append)
    return buf, dropped


def test_a_failed_flush_puts_its_entries_back_in_front_oldest_first() -> None:
    buf, _ = make()
    buf.add(["a", "bb"])
    with pytest.raises(StoreError), buf.flushing() as taken:
        assert taken == ["a", "bb"]
        assert buf.total == 0 and buf.in_flight == 3
        buf.add(["c"])  # written while the flush was failing
        raise StoreError("db down", url="sqlite:///x.db")
    assert buf.in_flight == 0
    assert buf.drain_locked() == (["a", "bb", "c"], 0)


def test_a_successful_flush_takes_everything_and_settles() -> None:
    buf, _ = make()
    buf.add(["a"])
    with buf.flushing() as taken:
        assert taken == ["a"]
    assert (buf.total, buf.in_flight) == (0, 0)


def test_other_errors_are_not_retried() -> None:
    buf, _ = make()
    buf.add(["a"])
    with pytest.raises(ValueError), buf.flushing():
        raise ValueError("a bug, not the database")
    assert buf.total == 0


def test_the_bound_drops_the_oldest_by_weight_but_never_the_newest() -> None:
    buf, dropped = make(bound=5)
    assert buf.add(["aaa", "bb"]) == 5
    assert buf.add(["c"]) == 3  # "aaa" went
    assert dropped == [3]
    buf.add(["x" * 20])  # over the bound alone: kept, everything older dropped
    assert buf.drain_locked() == (["x" * 20], 0)
    assert dropped == [3, 3]


def test_restore_goes_ahead_of_what_was_buffered_since_within_the_bound() -> None:
    buf, dropped = make(bound=4)
    buf.add(["cc"])
    buf.restore(["a", "bb"])
    assert buf.drain_locked() == (["bb", "cc"], 0)
    assert dropped == [1]


def test_a_closed_buffer_refuses_writes_naming_the_store() -> None:
    buf, _ = make()
    buf.close()
    with pytest.raises(StoreError, match=r"sqlite:///x.db: store is closed"):
        buf.add(["a"])
    with pytest.raises(StoreError, match="closed"):
        buf.restore(["a"])
